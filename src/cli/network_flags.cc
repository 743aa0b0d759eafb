#include "cli/network_flags.h"

#include <cstdlib>

namespace moat::cli {

using json = nlohmann::json;

Result<bool> NetworkFlags::read(FlagReader& flags) {
  const std::string& name = flags.name();
  if (name == "--network") {
    MOAT_ASSIGN(std::string v, flags.value());
    if (v == "none" || v == "open") {
      base_ = v;
    } else {
      MOAT_ASSIGN(json j, parsePermissionsFlag(name, v));  // JSON object or @FILE
      base_ = j;
    }
    return true;
  }
  if (name == "--allow" || name == "--deny") {
    MOAT_ASSIGN(std::string v, flags.value());
    if (v.empty()) return usageError(name + " needs a host");
    (name == "--allow" ? allow_ : deny_).push_back(v);
    return true;
  }
  return false;
}

Result<std::optional<json>> NetworkFlags::policy() const {
  if (!base_ && allow_.empty() && deny_.empty()) return std::optional<json>{};
  json p = base_ ? *base_ : json::object();
  if (p.is_string()) {
    if (!allow_.empty()) {
      return usageError("--allow: not with --network " + p.get<std::string>() + " (an allowlist is the default)");
    }
    if (deny_.empty()) return std::optional<json>{p};
    p = json{{"mode", p}};
  }
  for (const auto& h : allow_) p["allow"].push_back(h);
  for (const auto& h : deny_) p["deny"].push_back(h);
  return std::optional<json>{p};
}

Result<bool> SecretFlags::read(FlagReader& flags) {
  const std::string& name = flags.name();
  if (name == "--secret") {
    MOAT_ASSIGN(std::string v, flags.value());
    auto at = v.find('@');
    if (at == std::string::npos || at == 0 || at + 1 == v.size()) {
      return usageError("--secret needs NAME@HOST[,HOST...] (the value comes from the variable NAME)");
    }
    std::string var = v.substr(0, at);
    const char* value = std::getenv(var.c_str());
    if (!value || !*value) return usageError("--secret " + var + ": the variable " + var + " is not set");
    json hosts = json::array();
    std::string list = v.substr(at + 1);
    for (size_t start = 0; start <= list.size();) {
      size_t comma = list.find(',', start);
      std::string host = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!host.empty()) hosts.push_back(host);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    secrets_.push_back({{"name", var}, {"value", value}, {"hosts", hosts}});
    return true;
  }
  if (name == "--secret-header") {
    MOAT_ASSIGN(std::string v, flags.value());
    auto eq = v.find('=');
    if (eq == std::string::npos || eq == 0) return usageError("--secret-header needs NAME=HEADER");
    headers_.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    return true;
  }
  return false;
}

Result<std::optional<json>> SecretFlags::secrets() const {
  json out = secrets_;
  for (const auto& [name, header] : headers_) {
    bool found = false;
    for (auto& s : out) {
      if (s["name"] == name) {
        s["header"] = header;
        found = true;
      }
    }
    if (!found) return usageError("--secret-header " + name + ": no --secret " + name + "@HOST");
  }
  if (out.empty()) return std::optional<json>{};
  return std::optional<json>{out};
}

}  // namespace moat::cli
