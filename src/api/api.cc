#include "api/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>

#include "api/auth.h"
#include "common/encoding.h"
#include "os/file.h"

namespace moat::api {
namespace {

using json = nlohmann::json;

struct ApiError {
  int status;
  std::string code;
  std::string message;
  std::string field;
};

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

ApiError fromError(const Error& e) {
  static const std::map<std::string, int> status = {
      {"not_found", 404},       {"conflict", 409}, {"gone", 409},         {"capacity", 429},
      {"invalid_argument", 400}, {"timeout", 504}, {"unsupported", 400},
  };
  auto it = status.find(e.code);
  return {it == status.end() ? 500 : it->second, e.code, e.message(), ""};
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

json environmentJson(const store::EnvironmentRecord& r) {
  json j = {{"id", r.id},
            {"task_id", r.taskId},
            {"template", r.templateName},
            {"state", r.state},
            {"spec", {{"cpus", r.cpus}, {"ram_mb", r.ramMb}, {"storage_gb", r.storageGb}, {"pids", r.pids}}},
            {"created_at", timestamp(r.createdAtMs)},
            {"expires_at", timestamp(r.expiresAtMs)},
            {"labels", r.labels}};
  if (!r.reason.empty()) j["reason"] = r.reason;
  return j;
}

// --- request validation ------------------------------------------------------

struct Validation {
  std::optional<ApiError> error;
  explicit operator bool() const { return !error; }
};

Result<json> parseObject(const std::string& body, ApiError& err) {
  if (body.size() > (1u << 20)) {
    err = {413, "too_large", "JSON body larger than 1 MiB", ""};
    return Error::make("invalid", "");
  }
  json j = json::parse(body.empty() ? "{}" : body, nullptr, false);
  if (j.is_discarded()) {
    err = {400, "bad_json", "the body is not valid JSON", ""};
    return Error::make("invalid", "");
  }
  if (!j.is_object()) {
    err = {400, "bad_json", "the body must be a JSON object", ""};
    return Error::make("invalid", "");
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

std::optional<ApiError> stringMap(const json& j, const std::string& field, bool envNames,
                                  std::map<std::string, std::string>& out) {
  if (!j.is_object()) return invalid(field, "must be an object of strings");
  if (j.size() > 256) return invalid(field, "at most 256 entries");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string()) return invalid(field + "." + it.key(), "must be a string");
    bool ok = envNames ? validEnvName(it.key()) : validKey(it.key(), 63);
    if (!ok) return invalid(field + "." + it.key(), "invalid name");
    std::string v = it.value().get<std::string>();
    if (v.size() > 32768 || v.find('\0') != std::string::npos) return invalid(field + "." + it.key(), "value too long or has NUL");
    out[it.key()] = v;
  }
  return std::nullopt;
}

template <class T>
std::optional<ApiError> number(const json& j, const std::string& field, double min, double max, bool whole,
                               T& out) {
  if (!j.is_number() || (whole && !j.is_number_integer())) {
    return invalid(field, whole ? "must be a whole number" : "must be a number");
  }
  double v = j.get<double>();
  if (!std::isfinite(v) || v < min || v > max) {
    std::ostringstream range;
    range << "out of range (" << min << " to " << max << ")";
    return invalid(field, range.str());
  }
  out = static_cast<T>(v);
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

std::optional<ApiError> queryNumber(const HttpRequest& req, const char* name, uint64_t max, int base,
                                    uint64_t& out) {
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

}  // namespace

Api::Api(manager::EnvironmentManager& manager, Keys& keys, std::string masterToken,
         std::string stateDir)
    : manager_(manager), keys_(keys), masterToken_(std::move(masterToken)), stateDir_(std::move(stateDir)) {}

void Api::countError(const std::string& code) {
  std::lock_guard<std::mutex> lock(errorsMutex_);
  ++errors_[code];
}

Preflight Api::preflight(const HttpRequest& head) {
  Preflight p;
  bool fileWrite = head.method == "PUT" && head.path.size() > 6 &&
                   head.path.compare(head.path.size() - 6, 6, "/files") == 0;
  p.bodyLimit = fileWrite ? (16u << 20) : (1u << 20);
  if (head.path == "/healthz") return p;
  std::string token = bearerToken(head.authorization);
  std::string why = "missing Authorization: Bearer <token>";
  if (!token.empty()) {
    if (constantTimeEquals(token, masterToken_)) return p;
    auto key = keys_.authenticate(token);
    if (key.ok()) return p;
    why = key.error().context;
  }
  p.reject = true;
  p.response = errorResponse({401, "unauthorized", why, ""});
  countError("unauthorized");
  return p;
}

HttpResponse Api::handle(const HttpRequest& request) {
  HttpResponse response;
  std::string token = bearerToken(request.authorization);
  if (request.path == "/healthz" && request.method == "GET") {
    response = respond(200, {{"status", "ok"}});
  } else if (token.empty()) {
    response = errorResponse({401, "unauthorized", "missing Authorization: Bearer <token>", ""});
  } else if (constantTimeEquals(token, masterToken_)) {
    Principal master;
    master.master = true;
    response = route(request, master);
  } else {
    auto key = keys_.authenticate(token);
    response = key.ok() ? route(request, key.value())
                        : errorResponse({401, "unauthorized", key.error().context, ""});
  }
  if (response.status >= 400) {
    auto j = json::parse(response.body, nullptr, false);
    std::string code = j.is_object() && j.contains("error") ? j["error"].value("code", "unknown") : "unknown";
    countError(code);
  }
  return response;
}

HttpResponse Api::keysRoute(const HttpRequest& req, const Principal& principal) {
  if (!principal.master) {
    return errorResponse({403, "forbidden", "only the master token manages API keys", ""});
  }
  std::string id = pathSegment(req.path, 2);
  if (!id.empty()) {
    if (!pathSegment(req.path, 3).empty()) return errorResponse({404, "not_found", "no such endpoint: " + req.path, ""});
    if (req.method != "DELETE") return errorResponse({405, "method_not_allowed", "use DELETE", ""});
    Status s = keys_.revoke(id);
    if (!s.ok()) return errorResponse({404, "not_found", "no active key " + id, ""});
    HttpResponse r;
    r.status = 204;
    return r;
  }
  auto keyJson = [](const store::ApiKeyRecord& k) {
    json j = {{"id", k.id}, {"name", k.name}, {"scopes", k.scopes}, {"created_at", timestamp(k.createdAtMs)},
              {"revoked", k.revokedAtMs != 0}};
    return j;
  };
  if (req.method == "GET") {
    auto list = keys_.list();
    if (!list.ok()) return errorResponse(fromError(list.error()));
    json arr = json::array();
    for (const auto& k : list.value()) arr.push_back(keyJson(k));
    return respond(200, {{"keys", arr}});
  }
  if (req.method != "POST") return errorResponse({405, "method_not_allowed", "use GET or POST", ""});
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"name", "scopes"}, "")) return errorResponse(*e);
  std::string name;
  if (j.contains("name")) {
    if (!j["name"].is_string() || j["name"].get<std::string>().size() > 128) {
      return errorResponse(invalid("name", "must be a string of at most 128 bytes"));
    }
    name = j["name"];
  }
  if (!j.contains("scopes") || !j["scopes"].is_array() || j["scopes"].empty()) {
    return errorResponse(invalid("scopes", "required: a non-empty array of scope names"));
  }
  std::vector<std::string> scopes;
  for (size_t i = 0; i < j["scopes"].size(); ++i) {
    const json& s = j["scopes"][i];
    const auto& known = knownScopes();
    if (!s.is_string() || std::find(known.begin(), known.end(), s.get<std::string>()) == known.end()) {
      return errorResponse(invalid("scopes[" + std::to_string(i) + "]",
                                   "unknown scope (create, read, exec, files, destroy, timeout)"));
    }
    if (std::find(scopes.begin(), scopes.end(), s.get<std::string>()) == scopes.end()) scopes.push_back(s);
  }
  auto created = keys_.create(name, scopes);
  if (!created.ok()) return errorResponse(fromError(created.error()));
  json out = keyJson(created->record);
  out["token"] = created->token;
  return respond(201, out);
}

HttpResponse Api::route(const HttpRequest& req, const Principal& principal) {
  const std::string& p = req.path;
  auto forbidden = [](const std::string& scope) {
    return errorResponse({403, "forbidden", "this key lacks the '" + scope + "' scope", ""});
  };
  if (p == "/metrics") {
    if (req.method != "GET") return errorResponse({405, "method_not_allowed", "use GET", ""});
    if (!principal.may("read")) return forbidden("read");
    return metrics();
  }
  if (p == "/v1/keys" || p.rfind("/v1/keys/", 0) == 0) return keysRoute(req, principal);
  if (p.rfind("/v1/environments", 0) != 0) {
    return errorResponse({404, "not_found", "no such endpoint: " + p, ""});
  }
  std::string id = pathSegment(p, 2);
  std::string sub = pathSegment(p, 3);
  std::string subsub = pathSegment(p, 4);
  auto wrongMethod = [&](const char* allowed) {
    return errorResponse({405, "method_not_allowed", req.method + " " + p + ": use " + allowed, ""});
  };
  ApiError perr{};

  // /v1/environments
  if (id.empty()) {
    if (p != "/v1/environments" && p != "/v1/environments/") return errorResponse({404, "not_found", "no such endpoint: " + p, ""});
    if (req.method == "GET") {
      if (!principal.may("read")) return forbidden("read");
      store::EnvironmentFilter filter;
      if (!principal.master) filter.owner = principal.keyId;
      for (const auto& [k, v] : req.queryAll) {
        if (k == "task_id") {
          filter.taskId = v;
        } else if (k == "state") {
          filter.state = v;
        } else if (k == "label") {
          auto eq = v.find('=');
          if (eq == std::string::npos) return errorResponse(invalid("label", "expected key=value"));
          filter.labels[v.substr(0, eq)] = v.substr(eq + 1);
        } else {
          return errorResponse({400, "unknown_field", "unknown query parameter " + k, k});
        }
      }
      auto list = manager_.list(filter);
      if (!list.ok()) return errorResponse(fromError(list.error()));
      json arr = json::array();
      for (const auto& r : list.value()) arr.push_back(environmentJson(r));
      return respond(200, {{"environments", arr}});
    }
    if (req.method != "POST") return wrongMethod("GET or POST");
    if (!principal.may("create")) return forbidden("create");
    auto body = parseObject(req.body, perr);
    if (!body.ok()) return errorResponse(perr);
    const json& j = body.value();
    if (auto e = onlyFields(j, {"task_id", "template", "spec", "ttl_s", "labels", "env"}, "")) return errorResponse(*e);
    manager::CreateRequest create;
    create.owner = principal.owner();
    if (j.contains("task_id")) {
      if (!j["task_id"].is_string() || j["task_id"].get<std::string>().size() > 256) {
        return errorResponse(invalid("task_id", "must be a string of at most 256 bytes"));
      }
      create.taskId = j["task_id"];
    }
    if (j.contains("template")) {
      if (!j["template"].is_string()) return errorResponse(invalid("template", "must be a string"));
      create.templateName = j["template"];
      if (create.templateName != "host" && create.templateName.rfind("/", 0) != 0) {
        return errorResponse(invalid("template", "'host' or an absolute root file system directory"));
      }
      // A directory template shows that host directory to the environment's
      // root: only the master token may choose one.
      if (create.templateName != "host" && !principal.master) {
        return errorResponse({403, "forbidden", "template: only the master token may use a directory template", "template"});
      }
    }
    if (j.contains("spec")) {
      const json& s = j["spec"];
      if (!s.is_object()) return errorResponse(invalid("spec", "must be an object"));
      if (auto e = onlyFields(s, {"cpus", "ram_mb", "storage_gb", "pids"}, "spec.")) return errorResponse(*e);
      if (s.contains("cpus")) {
        if (auto e = number(s["cpus"], "spec.cpus", 0.01, 1024, false, create.cpus)) return errorResponse(*e);
      }
      if (s.contains("ram_mb")) {
        if (auto e = number(s["ram_mb"], "spec.ram_mb", 16,
                            static_cast<double>(manager_.config().maxTotalMemoryMb), true, create.ramMb)) {
          return errorResponse(*e);
        }
      }
      if (s.contains("storage_gb")) {
        if (auto e = number(s["storage_gb"], "spec.storage_gb", 0.01, 65536, false, create.storageGb)) {
          return errorResponse(*e);
        }
      }
      if (s.contains("pids")) {
        if (auto e = number(s["pids"], "spec.pids", 4, 4194304, true, create.pids)) return errorResponse(*e);
      }
    }
    if (j.contains("ttl_s")) {
      if (auto e = number(j["ttl_s"], "ttl_s", 1, static_cast<double>(manager_.config().maxTtlS), true, create.ttlS)) {
        return errorResponse(*e);
      }
    }
    if (j.contains("labels")) {
      if (auto e = stringMap(j["labels"], "labels", false, create.labels)) return errorResponse(*e);
    }
    if (j.contains("env")) {
      if (auto e = stringMap(j["env"], "env", true, create.env)) return errorResponse(*e);
    }
    auto created = manager_.create(create);
    if (!created.ok()) return errorResponse(fromError(created.error()));
    return respond(201, environmentJson(created.value()));
  }

  if (!sub.empty() && sub != "exec" && sub != "timeout" && sub != "files") {
    return errorResponse({404, "not_found", "no such endpoint: " + p, ""});
  }
  // A key acts only on its own environments; others look like they do not exist.
  std::string scope = sub.empty() ? (req.method == "DELETE" ? "destroy" : "read")
                                  : sub == "exec" ? "exec" : sub == "timeout" ? "timeout" : "files";
  if (!principal.may(scope)) return forbidden(scope);
  if (!principal.master) {
    auto record = manager_.get(id);
    if (!record.ok() || record->owner != principal.keyId) {
      return errorResponse({404, "not_found", "no environment " + id, ""});
    }
  }

  if (sub != "files") {
    if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  }

  // /v1/environments/{id}
  if (sub.empty()) {
    if (req.method == "GET") {
      auto r = manager_.get(id);
      if (!r.ok()) return errorResponse(fromError(r.error()));
      return respond(200, environmentJson(r.value()));
    }
    if (req.method == "DELETE") {
      Status s = manager_.destroy(id, "destroyed");
      if (!s.ok()) return errorResponse(fromError(s.error()));
      HttpResponse r;
      r.status = 204;
      return r;
    }
    return wrongMethod("GET or DELETE");
  }

  if (sub == "timeout" && subsub.empty()) {
    if (req.method != "POST") return wrongMethod("POST");
    auto body = parseObject(req.body, perr);
    if (!body.ok()) return errorResponse(perr);
    if (auto e = onlyFields(body.value(), {"ttl_s"}, "")) return errorResponse(*e);
    if (!body->contains("ttl_s")) return errorResponse(invalid("ttl_s", "required"));
    int64_t ttl = 0;
    if (auto e = number((*body)["ttl_s"], "ttl_s", 1, static_cast<double>(manager_.config().maxTtlS), true, ttl)) {
      return errorResponse(*e);
    }
    auto r = manager_.setTtl(id, ttl);
    if (!r.ok()) return errorResponse(fromError(r.error()));
    return respond(200, environmentJson(r.value()));
  }

  if (sub == "exec" && subsub.empty()) {
    if (req.method != "POST") return wrongMethod("POST");
    auto body = parseObject(req.body, perr);
    if (!body.ok()) return errorResponse(perr);
    const json& j = body.value();
    if (auto e = onlyFields(j, {"cmd", "timeout_ms", "env", "cwd", "stdin", "encoding", "output_limit"}, "")) {
      return errorResponse(*e);
    }
    manager::ExecRequest exec;
    if (!j.contains("cmd") || !j["cmd"].is_array() || j["cmd"].empty()) {
      return errorResponse(invalid("cmd", "required: a non-empty array of strings"));
    }
    if (j["cmd"].size() > 4096) return errorResponse(invalid("cmd", "at most 4096 arguments"));
    size_t total = 0;
    for (size_t i = 0; i < j["cmd"].size(); ++i) {
      const json& a = j["cmd"][i];
      if (!a.is_string()) return errorResponse(invalid("cmd[" + std::to_string(i) + "]", "must be a string"));
      std::string arg = a.get<std::string>();
      if (arg.find('\0') != std::string::npos) return errorResponse(invalid("cmd[" + std::to_string(i) + "]", "contains NUL"));
      total += arg.size();
      exec.argv.push_back(arg);
    }
    if (total > (256u << 10)) return errorResponse(invalid("cmd", "longer than 256 KiB in all"));
    std::string encoding = "utf8";
    if (j.contains("encoding")) {
      if (!j["encoding"].is_string() || (j["encoding"] != "utf8" && j["encoding"] != "base64")) {
        return errorResponse(invalid("encoding", "must be \"utf8\" or \"base64\""));
      }
      encoding = j["encoding"];
    }
    exec.timeoutMs = 0;
    if (j.contains("timeout_ms")) {
      if (auto e = number(j["timeout_ms"], "timeout_ms", 1, 86400000, true, exec.timeoutMs)) return errorResponse(*e);
    }
    exec.outputLimit = 1u << 20;
    if (j.contains("output_limit")) {
      if (auto e = number(j["output_limit"], "output_limit", 0, 16u << 20, true, exec.outputLimit)) return errorResponse(*e);
    }
    if (j.contains("cwd")) {
      if (auto e = absolutePath(j["cwd"], "cwd", exec.cwd)) return errorResponse(*e);
    }
    if (j.contains("stdin")) {
      if (!j["stdin"].is_string()) return errorResponse(invalid("stdin", "must be a string"));
      exec.withStdin = true;
      exec.stdinData = j["stdin"];
      if (encoding == "base64") {
        auto decoded = base64Decode(exec.stdinData);
        if (!decoded.ok()) return errorResponse(invalid("stdin", "is not valid base64"));
        exec.stdinData = decoded.value();
      }
    }
    std::map<std::string, std::string> env;
    if (j.contains("env")) {
      if (auto e = stringMap(j["env"], "env", true, env)) return errorResponse(*e);
    }
    auto started = std::chrono::steady_clock::now();
    auto result = manager_.exec(id, exec, env);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    size_t bucket = 0;
    while (bucket < kBuckets.size() && seconds > kBuckets[bucket]) ++bucket;
    ++execBuckets_[bucket];
    execMicros_ += static_cast<uint64_t>(seconds * 1e6);
    ++execCount_;
    if (!result.ok()) return errorResponse(fromError(result.error()));
    const auto& r = result.value();
    if (!r.started) {
      bool notFound = r.spawnStage == "exec" && r.spawnErrno == ENOENT;
      // Not an HTTP error: the agent reads it like a shell's answer.
      return respond(200, {{"exit_code", notFound ? 127 : 126},
                           {"stdout", ""},
                           {"stderr", std::string(notFound ? "command not found: " : "cannot run: ") +
                                          exec.argv[0] + " (" + r.spawnStage + ": " + std::strerror(r.spawnErrno) + ")\n"},
                           {"timed_out", false},
                           {"duration_ms", 0},
                           {"stdout_truncated", false},
                           {"stderr_truncated", false},
                           {"encoding", "utf8"}});
    }
    bool asBase64 = encoding == "base64" || !isValidUtf8(r.out) || !isValidUtf8(r.err);
    return respond(200, {{"exit_code", r.signal ? 128 + r.signal : r.exitCode},
                         {"signal", r.signal},
                         {"stdout", asBase64 ? base64Encode(r.out) : r.out},
                         {"stderr", asBase64 ? base64Encode(r.err) : r.err},
                         {"timed_out", r.timedOut},
                         {"duration_ms", r.durationUs / 1000},
                         {"stdout_truncated", r.outTruncated},
                         {"stderr_truncated", r.errTruncated},
                         {"encoding", asBase64 ? "base64" : "utf8"}});
  }

  if (sub == "files") {
    auto fileCall = [&](init::FileRequest f) -> HttpResponse {
      auto r = manager_.file(id, f);
      if (!r.ok()) return errorResponse(fromError(r.error()));
      if (r->err != 0) {
        int status = r->err == ENOENT ? 404 : (r->err == EACCES || r->err == EPERM) ? 403
                     : r->err == EDQUOT || r->err == ENOSPC ? 507 : 400;
        std::string code = r->err == ENOENT ? "not_found" : (status == 403 ? "forbidden" : status == 507 ? "no_space" : "file_error");
        return errorResponse({status, code, r->message, "path"});
      }
      HttpResponse ok;
      ok.status = 200;
      if (f.op == init::FileOp::kRead) {
        ok.contentType = "application/octet-stream";
        ok.body = r->data;
        return ok;
      }
      auto info = [](const init::FileInfo& i) {
        std::string type = i.type == 'f' ? "file" : i.type == 'd' ? "dir" : i.type == 'l' ? "symlink" : "other";
        return json{{"name", i.name}, {"type", type}, {"size", i.size}, {"mode", i.mode}, {"mtime", i.mtimeSec}};
      };
      if (f.op == init::FileOp::kList) {
        json arr = json::array();
        for (const auto& e : r->entries) arr.push_back(info(e));
        return respond(200, {{"path", f.path}, {"entries", arr}});
      }
      if (f.op == init::FileOp::kStat) return respond(200, info(r->info));
      return respond(200, {{"ok", true}, {"path", f.path}});
    };
    init::FileRequest f;
    auto pathParam = [&]() -> std::optional<ApiError> {
      auto it = req.query.find("path");
      if (it == req.query.end()) return invalid("path", "required query parameter");
      return absolutePath(json(it->second), "path", f.path);
    };
    if (subsub.empty()) {
      if (auto e = pathParam()) return errorResponse(*e);
      if (req.method == "GET") {
        if (auto e = onlyQuery(req, {"path", "offset", "length"})) return errorResponse(*e);
        f.op = init::FileOp::kRead;
        if (auto e = queryNumber(req, "offset", 1ULL << 53, 10, f.offset)) return errorResponse(*e);
        if (auto e = queryNumber(req, "length", 1ULL << 53, 10, f.length)) return errorResponse(*e);
        return fileCall(f);
      }
      if (req.method == "PUT") {
        f.op = init::FileOp::kWrite;
        f.data = req.body;
        f.flags = init::kFileCreateParents;
        if (auto e = onlyQuery(req, {"path", "append", "mode"})) return errorResponse(*e);
        bool append = false;
        if (auto e = queryFlag(req, "append", append)) return errorResponse(*e);
        if (append) f.flags |= init::kFileAppend;
        uint64_t mode = 0644;
        if (auto e = queryNumber(req, "mode", 0777, 8, mode)) return errorResponse(*e);
        f.mode = static_cast<uint32_t>(mode);
        if (f.data.size() > (16u << 20)) return errorResponse({413, "too_large", "files over 16 MiB: write in parts with append=1", ""});
        return fileCall(f);
      }
      if (req.method == "DELETE") {
        f.op = init::FileOp::kRemove;
        if (auto e = onlyQuery(req, {"path", "recursive"})) return errorResponse(*e);
        bool recursive = false;
        if (auto e = queryFlag(req, "recursive", recursive)) return errorResponse(*e);
        if (recursive) f.flags = init::kFileRecursive;
        return fileCall(f);
      }
      return wrongMethod("GET, PUT or DELETE");
    }
    if (subsub == "list" || subsub == "stat") {
      if (req.method != "GET") return wrongMethod("GET");
      if (auto e = onlyQuery(req, {"path"})) return errorResponse(*e);
      if (auto e = pathParam()) return errorResponse(*e);
      f.op = subsub == "list" ? init::FileOp::kList : init::FileOp::kStat;
      return fileCall(f);
    }
    if (subsub == "mkdir" || subsub == "move") {
      if (req.method != "POST") return wrongMethod("POST");
      auto body = parseObject(req.body, perr);
      if (!body.ok()) return errorResponse(perr);
      const json& j = body.value();
      if (subsub == "mkdir") {
        if (auto e = onlyFields(j, {"path", "parents"}, "")) return errorResponse(*e);
        if (!j.contains("path")) return errorResponse(invalid("path", "required"));
        if (auto e = absolutePath(j["path"], "path", f.path)) return errorResponse(*e);
        f.op = init::FileOp::kMkdir;
        f.mode = 0755;
        if (j.contains("parents")) {
          if (!j["parents"].is_boolean()) return errorResponse(invalid("parents", "must be true or false"));
          if (j["parents"].get<bool>()) f.flags = init::kFileCreateParents;
        }
        return fileCall(f);
      }
      if (auto e = onlyFields(j, {"from", "to"}, "")) return errorResponse(*e);
      if (!j.contains("from")) return errorResponse(invalid("from", "required"));
      if (!j.contains("to")) return errorResponse(invalid("to", "required"));
      if (auto e = absolutePath(j["from"], "from", f.path)) return errorResponse(*e);
      if (auto e = absolutePath(j["to"], "to", f.target)) return errorResponse(*e);
      f.op = init::FileOp::kRename;
      return fileCall(f);
    }
  }
  return errorResponse({404, "not_found", "no such endpoint: " + p, ""});
}

HttpResponse Api::metrics() {
  std::ostringstream out;
  auto counters = manager_.counters();
  out << "# HELP moat_environments Environments by state.\n# TYPE moat_environments gauge\n";
  for (const char* state : {"creating", "running", "destroying", "failed"}) {
    out << "moat_environments{state=\"" << state << "\"} " << counters.byState[state] << "\n";
  }
  out << "# HELP moat_warm_pool_ready Warm environments ready to be claimed.\n# TYPE moat_warm_pool_ready gauge\n";
  out << "moat_warm_pool_ready " << counters.warmReady << "\n";
  out << "# HELP moat_warm_pool_claims_total Creates served from the warm pool.\n# TYPE moat_warm_pool_claims_total counter\n";
  out << "moat_warm_pool_claims_total " << counters.warmClaims << "\n";
  out << "# HELP moat_exec_total Commands run through the exec API.\n# TYPE moat_exec_total counter\n";
  out << "moat_exec_total " << execCount_.load() << "\n";
  out << "# HELP moat_exec_duration_seconds Exec latency.\n# TYPE moat_exec_duration_seconds histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += execBuckets_[i];
    out << "moat_exec_duration_seconds_bucket{le=\"" << kBuckets[i] << "\"} " << cumulative << "\n";
  }
  cumulative += execBuckets_[kBuckets.size()];
  out << "moat_exec_duration_seconds_bucket{le=\"+Inf\"} " << cumulative << "\n";
  out << "moat_exec_duration_seconds_sum " << execMicros_.load() / 1e6 << "\n";
  out << "moat_exec_duration_seconds_count " << execCount_.load() << "\n";
  out << "# HELP moat_api_errors_total API error responses by code.\n# TYPE moat_api_errors_total counter\n";
  {
    std::lock_guard<std::mutex> lock(errorsMutex_);
    for (const auto& [code, n] : errors_) out << "moat_api_errors_total{code=\"" << code << "\"} " << n << "\n";
  }
  HttpResponse r;
  r.contentType = "text/plain; version=0.0.4";
  r.body = out.str();
  return r;
}

}  // namespace moat::api
