#include "api/validation.h"

#include <cctype>
#include <ctime>

#include "mcp/protocol.h"

namespace moat::api {
namespace {

bool validKey(const std::string& k, size_t max) {
  if (k.empty() || k.size() > max) return false;
  for (char c : k) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '/')) {
      return false;
    }
  }
  return true;
}

bool validEnvName(const std::string& k) {
  if (k.empty() || k.size() > 256 || std::isdigit(static_cast<unsigned char>(k[0]))) return false;
  for (char c : k) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

}  // namespace

HttpResponse respond(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse errorResponse(const ApiError& e) {
  json err = {{"code", e.code}, {"message", e.message}};
  if (!e.field.empty()) err["field"] = e.field;
  return respond(e.status, {{"error", err}});
}

ApiError invalid(const std::string& field, const std::string& message) {
  return {400, "invalid_request", field + ": " + message, field};
}

int httpStatus(Code code) {
  switch (code) {
    case Code::kInvalidArgument:
    case Code::kInvalidRequest:
    case Code::kUnknownField:
    case Code::kUnsupported:
      return 400;
    case Code::kNotFound:
      return 404;
    case Code::kConflict:
    case Code::kGone:
    case Code::kStdinFull:
      return 409;
    case Code::kCapacity:
      return 429;
    case Code::kUnavailable:
      return 503;
    case Code::kTimeout:
      return 504;
    // moatd's own failures (or its host's): 500, the code names it. Every
    // code is listed, so a new one does not compile until it is placed.
    case Code::kSyscall:
    case Code::kUsage:
    case Code::kTooLarge:
    case Code::kMissingDependency:
    case Code::kUnauthorized:
    case Code::kNoToken:
    case Code::kRefused:
    case Code::kUnreachable:
    case Code::kInsecure:
    case Code::kUntrustedPath:
    case Code::kBusy:
    case Code::kCorrupt:
    case Code::kNotNetns:
    case Code::kEnvironmentFailed:
    case Code::kResource:
    case Code::kExec:
    case Code::kProtocol:
    case Code::kEof:
    case Code::kTls:
    case Code::kStore:
    case Code::kIo:
    case Code::kApi:
    case Code::kToolFailed:
    case Code::kFailed:
    case Code::kInternal:
      return 500;
  }
  return 500;
}

ApiError fromError(const Error& e) { return {httpStatus(e.code), codeName(e.code), e.message(), ""}; }

std::optional<ApiError> specFields(const json& spec, const std::string& prefix, double maxRamMb, SpecFields& out,
                                   bool withIsolation) {
  if (!spec.is_object())
    return invalid(prefix.empty() ? "spec" : prefix.substr(0, prefix.size() - 1), "must be an object");
  if (auto e = withIsolation ? onlyFields(spec, {"cpus", "ram_mb", "storage_gb", "pids", "isolation"}, prefix)
                             : onlyFields(spec, {"cpus", "ram_mb", "storage_gb", "pids"}, prefix)) {
    return e;
  }
  if (spec.contains("isolation")) {
    const json& v = spec["isolation"];
    auto named = v.is_string() ? backend::isolationNamed(v.get<std::string>()) : std::nullopt;
    if (!named) return invalid(prefix + "isolation", "must be \"namespaces\" or \"microvm\"");
    out.isolation = named;
  }
  if (spec.contains("cpus")) {
    if (auto e = number(spec["cpus"], prefix + "cpus", 0.01, 1024, false, out.cpus)) return e;
  }
  if (spec.contains("ram_mb")) {
    if (auto e = number(spec["ram_mb"], prefix + "ram_mb", 16, maxRamMb, true, out.ramMb)) return e;
  }
  if (spec.contains("storage_gb")) {
    if (auto e = number(spec["storage_gb"], prefix + "storage_gb", 0.01, 65536, false, out.storageGb)) return e;
  }
  if (spec.contains("pids")) {
    if (auto e = number(spec["pids"], prefix + "pids", 4, 4194304, true, out.pids)) return e;
  }
  return std::nullopt;
}

std::string timestamp(int64_t ms) {
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm;
  ::gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
}

Result<json> parseObject(const std::string& body, ApiError& err) {
  if (body.size() > (1u << 20)) {
    err = {413, "too_large", "JSON body larger than 1 MiB", ""};
    return Error::make(Code::kInvalidArgument, "");
  }
  json j = mcp::parseBounded(body.empty() ? "{}" : body);
  if (j.is_discarded()) {
    err = {400, "bad_json", "the body is not valid JSON (or nests deeper than 64)", ""};
    return Error::make(Code::kInvalidArgument, "");
  }
  if (!j.is_object()) {
    err = {400, "bad_json", "the body must be a JSON object", ""};
    return Error::make(Code::kInvalidArgument, "");
  }
  return j;
}

std::optional<ApiError> onlyFields(const json& j, std::initializer_list<const char*> allowed,
                                   const std::string& prefix) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* a : allowed) known |= it.key() == a;
    if (!known) return ApiError{400, "unknown_field", "unknown field " + prefix + it.key(), prefix + it.key()};
  }
  return std::nullopt;
}

std::optional<ApiError> stringMap(const json& j, const std::string& field, bool envNames,
                                  std::map<std::string, std::string>& out) {
  if (!j.is_object()) return invalid(field, "must be an object of strings");
  if (j.size() > 256) return invalid(field, "at most 256 entries");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string()) return invalid(field + "." + it.key(), "must be a string");
    bool ok = envNames ? validEnvName(it.key()) : validKey(it.key(), 63);
    if (!ok) return invalid(field + "." + it.key(), "invalid name");
    std::string v = it.value().get<std::string>();
    if (v.size() > 32768 || v.find('\0') != std::string::npos)
      return invalid(field + "." + it.key(), "value too long or has NUL");
    out[it.key()] = v;
  }
  return std::nullopt;
}

std::optional<ApiError> absolutePath(const json& j, const std::string& field, std::string& out) {
  if (!j.is_string()) return invalid(field, "must be a string");
  out = j.get<std::string>();
  if (out.empty() || out[0] != '/' || out.size() > 4096 || out.find('\0') != std::string::npos) {
    return invalid(field, "must be an absolute path");
  }
  return std::nullopt;
}

// Query parameters are checked like body fields: unknown ones are errors.
std::optional<ApiError> onlyQuery(const HttpRequest& req, std::initializer_list<const char*> allowed) {
  for (const auto& [k, v] : req.queryAll) {
    bool known = false;
    for (const char* a : allowed) known |= k == a;
    if (!known) return ApiError{400, "unknown_field", "unknown query parameter " + k, k};
  }
  return std::nullopt;
}

std::optional<ApiError> queryNumber(const HttpRequest& req, const char* name, uint64_t max, int base, uint64_t& out) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return std::nullopt;
  const std::string& v = it->second;
  const char* digits = base == 8 ? "01234567" : "0123456789";
  if (v.empty() || v.size() > 16 || v.find_first_not_of(digits) != std::string::npos) {
    return invalid(name, base == 8 ? "must be an octal number" : "must be a whole number");
  }
  out = std::strtoull(v.c_str(), nullptr, base);
  if (out > max) return invalid(name, "out of range");
  return std::nullopt;
}

std::optional<ApiError> queryFlag(const HttpRequest& req, const char* name, bool& out) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return std::nullopt;
  if (it->second == "1" || it->second == "true") {
    out = true;
  } else if (it->second == "0" || it->second == "false") {
    out = false;
  } else {
    return invalid(name, "must be 1, 0, true or false");
  }
  return std::nullopt;
}

std::string pathSegment(const std::string& path, size_t index) {
  size_t start = 0;
  for (size_t i = 0; i <= index; ++i) {
    if (start >= path.size()) return "";
    size_t end = path.find('/', start + 1);
    if (i == index) return path.substr(start + 1, (end == std::string::npos ? path.size() : end) - start - 1);
    if (end == std::string::npos) return "";
    start = end;
  }
  return "";
}

HttpResponse wrongMethod(const HttpRequest& req, const char* allowed) {
  return errorResponse({405, "method_not_allowed", req.method + " " + req.path + ": use " + allowed, ""});
}

HttpResponse noContent() {
  HttpResponse r;
  r.status = 204;
  return r;
}

std::optional<ApiError> commandLine(const json& j, const std::string& field, std::vector<std::string>& out) {
  if (!j.is_array() || j.empty()) return invalid(field, "required: a non-empty array of strings");
  if (j.size() > 4096) return invalid(field, "at most 4096 arguments");
  size_t total = 0;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& a = j[i];
    std::string name = field + "[" + std::to_string(i) + "]";
    if (!a.is_string()) return invalid(name, "must be a string");
    std::string arg = a.get<std::string>();
    if (arg.find('\0') != std::string::npos) return invalid(name, "contains NUL");
    total += arg.size();
    out.push_back(arg);
  }
  if (total > (256u << 10)) return invalid(field, "longer than 256 KiB in all");
  return std::nullopt;
}

}  // namespace moat::api
