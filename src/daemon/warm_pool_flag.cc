#include "daemon/warm_pool_flag.h"

#include <cstdlib>

#include "api/validation.h"
#include "isolation/fs/template.h"
#include "os/file.h"

namespace moat::daemon {

using api::SpecFields;
using nlohmann::json;

Result<manager::WarmPool> parseWarmPoolFlag(const std::string& value, double maxRamMb) {
  const std::string form = "N or N:key=value,... (keys template, cpus, ram_mb, storage_gb, pids, isolation)";
  manager::WarmPool pool;
  const size_t colon = value.find(':');
  const std::string count = value.substr(0, colon);
  char* end = nullptr;
  unsigned long long n = std::strtoull(count.c_str(), &end, 10);
  if (count.empty() || count[0] < '0' || count[0] > '9' || *end != '\0' || n > 9999) {
    return Error::make(Code::kInvalidArgument, "a number from 0 to 9999, " + form);
  }
  pool.size = static_cast<size_t>(n);
  if (colon == std::string::npos) return pool;
  json spec = json::object();
  bool haveTemplate = false;
  std::string rest = value.substr(colon + 1);
  for (size_t start = 0; start <= rest.size();) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    std::string item = rest.substr(start, comma - start);
    start = comma + 1;
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      return Error::make(Code::kInvalidArgument, "'" + item + "' is not key=value; " + form);
    std::string key = item.substr(0, eq), text = item.substr(eq + 1);
    if (spec.contains(key) || (key == "template" && haveTemplate)) {
      return Error::make(Code::kInvalidArgument, key + " given twice");
    }
    if (key == "template") {
      // A template's name is checked when the pool fills (it may be imported after the start).
      if (text != "host" && !isolation::fs::isTemplateName(text) &&
          (text.empty() || text[0] != '/' || !os::isDirectory(text))) {
        return Error::make(Code::kInvalidArgument,
                           "template: 'host', a template's name or an existing absolute directory, not '" + text + "'");
      }
      pool.templateName = text;
      haveTemplate = true;
      continue;
    }
    // A number reads as JSON does (256, 0.5, 1e3); anything else is kept as
    // text, for specFields to name what it should be.
    json parsed = json::parse(text, nullptr, false);
    spec[key] = parsed.is_discarded() ? json(text) : parsed;
  }
  SpecFields fields;
  if (auto e = api::specFields(spec, "", maxRamMb, fields, true)) {
    return Error::make(Code::kInvalidArgument, e->message);
  }
  pool.isolation = fields.isolation;
  pool.cpus = fields.cpus;
  pool.ramMb = fields.ramMb;
  pool.storageGb = fields.storageGb;
  pool.pids = fields.pids;
  return pool;
}

}  // namespace moat::daemon
