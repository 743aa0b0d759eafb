// moatd's request validation (src/api): what an API client sends is checked
// field by field before anything happens, and unknown fields, bad types and
// out-of-range values are errors that name the field.
//
// Input: an HTTP request as text: "METHOD TARGET" on the first line, header
// lines ("Name: value": Authorization, Prefer, Host, Origin, ...), an empty
// line, the body. The target is decoded by moatd's own parseTarget. The
// request goes to the real Api::handle (the master token unless the input
// names another; "$KEY" stands for a scoped key's token), over a real
// environment manager and an SQLite store in a temporary directory, with no
// environments and room for none: every validation runs and nothing is
// started (a backend that makes nothing, no namespaces). Routes that wait or keep state
// across requests (/mcp sessions, /v1/events, approval watches, /v1/keys)
// are left to other tests. The pure helpers of src/api/validation.h are also
// run on the body, with their promises checked.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "api/api.h"
#include "api/validation.h"
#include "backend/backend.h"
#include "store/sqlite/sqlite_store.h"

using namespace moat;
using namespace moat::api;

namespace {

[[noreturn]] void fail(const std::string& what) {
  __builtin_printf("api_request: %s\n", what.c_str());
  std::abort();
}

const std::string kMaster = "fuzz-master-token";

// No environment can be made here: with maxEnvironments 0 a create stops at
// capacity before the backend, and every other call finds no environment.
// A call that reaches it anyway is a finding.
class NoBackend final : public backend::Backend {
 public:
  Result<Created> create(const backend::Spec&) override { fail("backend create reached"); }
  Status destroy(const std::string&) override { return {}; }
  Result<UniqueFd> attach(const std::string& id) override { return Error::make(Code::kNotFound, id); }
  Result<std::vector<std::string>> list() override { return std::vector<std::string>{}; }
  Result<backend::Usage> usage(const std::string& id) override { return Error::make(Code::kNotFound, id); }
  Result<UniqueFd> networkNamespace(const std::string& id) override { return Error::make(Code::kNotFound, id); }
  Result<uint32_t> snapshot(const std::string&, const std::string&) override { fail("backend snapshot reached"); }
  Status deleteSnapshot(const std::string&) override { return {}; }
  Result<std::vector<std::string>> snapshots() override { return std::vector<std::string>{}; }
  Result<backend::Changes> changes(const backend::ChangesRequest& r) override {
    return Error::make(Code::kNotFound, r.id);
  }
};

struct Daemon {
  std::unique_ptr<store::sqlite::SqliteStore> store;
  NoBackend backend;
  std::unique_ptr<manager::EnvironmentManager> manager;
  std::unique_ptr<Keys> keys;
  std::unique_ptr<gate::ApprovalCenter> approvals;
  std::unique_ptr<Api> api;
  std::string keyToken;
};

Daemon* daemon() {
  static Daemon* d = [] {
    auto* d = new Daemon;  // lives as long as the process: the manager's reaper thread uses it
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/moat-fuzz-api-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) fail("mkdtemp");
    static std::string cleanup = dir;  // the store goes when the fuzzer exits
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(cleanup, ignored);
    });
    auto store = store::sqlite::SqliteStore::open(dir + "/state.db");
    if (!store.ok()) fail("store: " + store.error().message());
    d->store = std::move(store.value());
    manager::ManagerConfig config;
    config.stateDir = dir;
    config.maxEnvironments = 0;
    config.maxTotalMemoryMb = 1 << 20;
    d->manager = std::make_unique<manager::EnvironmentManager>(config, *d->store, d->backend);
    d->keys = std::make_unique<Keys>(*d->store);
    d->approvals = std::make_unique<gate::ApprovalCenter>(*d->store);
    ApiOptions options;
    options.stateDir = dir;
    options.keyRequestsPerSecond = 0;  // a rate limit would make the fuzzer sleep
    options.approvalTimeoutMs = 1;
    d->api = std::make_unique<Api>(*d->manager, *d->keys, *d->approvals, kMaster, options);
    auto ceiling = gate::Permissions::parse(
        json::parse(R"({"run_command": [{"match": ["rm", "*"], "action": "deny"}, {"action": "allow"}]})"),
        gate::Permissions::allowAll());
    auto key = d->keys->create("fuzz", knownScopes(), ceiling->toJson().dump());
    if (!key.ok()) fail("key: " + key.error().message());
    d->keyToken = key->token;
    return d;
  }();
  return d;
}

std::string lowerCase(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool leftAlone(const HttpRequest& r) {
  const std::string& p = r.path;
  auto startsWith = [&](const char* prefix) { return p.rfind(prefix, 0) == 0; };
  return startsWith("/mcp") || startsWith("/v1/events") || startsWith("/v1/keys") ||
         (startsWith("/v1/approvals/") && r.method == "GET");
}

void helpers(const HttpRequest& req) {
  ApiError err{};
  auto body = parseObject(req.body, err);
  if (!body.ok()) {
    if (err.status != 400 && err.status != 413) fail("parseObject failed without a 400 or 413");
    return;
  }
  const json& j = body.value();
  if (!j.is_object()) fail("parseObject gave a non-object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const json& v = it.value();
    const std::string& k = it.key();
    std::vector<std::string> argv;
    if (!commandLine(v, k, argv)) {
      size_t total = 0;
      for (const auto& a : argv) {
        if (a.find('\0') != std::string::npos) fail("commandLine let NUL through");
        total += a.size();
      }
      if (argv.empty() || argv.size() > 4096 || total > (256u << 10)) fail("commandLine let a bad argv through");
    }
    std::string path;
    if (!absolutePath(v, k, path)) {
      if (path.empty() || path[0] != '/' || path.size() > 4096 || path.find('\0') != std::string::npos) {
        fail("absolutePath let a bad path through");
      }
    }
    std::map<std::string, std::string> map;
    for (bool envNames : {true, false}) {
      map.clear();
      if (auto e = stringMap(v, k, envNames, map)) {
        if (e->field.compare(0, k.size(), k) != 0) fail("stringMap named another field");
      } else if (map.size() > 256) {
        fail("stringMap let more than 256 entries through");
      }
    }
    double d = 0;
    int64_t i = 0;
    uint64_t u = 0;
    if (!number(v, k, 0.01, 1024, false, d) && !(d >= 0.01 && d <= 1024)) fail("number out of range");
    if (!number(v, k, 1, 7 * 86400000.0, true, i) && !(i >= 1 && i <= 7 * 86400000LL)) fail("number out of range");
    if (!number(v, k, 0, 16u << 20, true, u) && u > (16u << 20)) fail("number out of range");
  }
  (void)onlyFields(j, {"cmd", "env", "cwd", "timeout_ms", "stdin"}, "");
  for (size_t s = 0; s < 6; ++s) {
    if (pathSegment(req.path, s).find('/') != std::string::npos) fail("a path segment with '/'");
  }
  uint64_t n = 0;
  bool flag = false;
  (void)onlyQuery(req, {"path", "offset", "length"});
  // A parameter that is not there leaves `n` as it was: start each at 0.
  if (!queryNumber(req, "offset", 1ULL << 53, 10, n) && n > (1ULL << 53)) fail("queryNumber out of range");
  n = 0;
  if (!queryNumber(req, "mode", 0777, 8, n) && n > 0777) fail("queryNumber out of range");
  (void)queryFlag(req, "append", flag);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Daemon* d = daemon();
  std::string input(reinterpret_cast<const char*>(data), size);
  size_t headEnd = input.find("\n\n");
  std::string head = input.substr(0, headEnd);
  HttpRequest req;
  req.body = headEnd == std::string::npos ? "" : input.substr(headEnd + 2);
  size_t lineEnd = head.find('\n');
  std::string requestLine = head.substr(0, lineEnd);
  size_t space = requestLine.find(' ');
  if (space == std::string::npos) return 0;
  req.method = requestLine.substr(0, space);
  parseTarget(requestLine.substr(space + 1), req);
  req.authorization = "Bearer " + kMaster;
  req.remote = "127.0.0.1:1";
  while (lineEnd != std::string::npos) {
    size_t start = lineEnd + 1;
    lineEnd = head.find('\n', start);
    std::string line = head.substr(start, lineEnd == std::string::npos ? std::string::npos : lineEnd - start);
    size_t colon = line.find(": ");
    if (colon == std::string::npos) continue;
    std::string name = lowerCase(line.substr(0, colon)), value = line.substr(colon + 2);
    if (auto key = value.find("$KEY"); key != std::string::npos) value.replace(key, 4, d->keyToken);
    if (name == "authorization")
      req.authorization = value;
    else if (name == "prefer")
      req.prefer = value;
    else if (name == "host")
      req.host = value;
    else if (name == "origin")
      req.origin = value;
    else if (name == "accept")
      req.accept = value;
    else if (name == "content-type")
      req.contentType = value;
    else if (name == "last-event-id")
      req.lastEventId = value;
  }
  helpers(req);
  if (leftAlone(req)) return 0;

  Preflight pre = d->api->preflight(req);
  if (pre.reject) {
    if (pre.response.status != 401 && pre.response.status != 403) fail("a preflight refusal that is not 401/403");
    return 0;
  }
  if (req.body.size() > pre.bodyLimit) return 0;  // the server answers 413 before the handler
  HttpResponse r = d->api->handle(req);
  if (r.status < 100 || r.status > 599) fail("an HTTP status out of range");
  if (r.status >= 500 && r.status != 503) fail("a 5xx for a request: " + r.body);
  if (r.status >= 400) {
    json e = json::parse(r.body, nullptr, false);
    if (!e.is_object() || !e.contains("error") || !e["error"].is_object() || !e["error"].contains("code")) {
      fail("an error without an error object: " + r.body);
    }
  } else if (!r.stream && !r.websocket && !r.body.empty() && r.contentType == "application/json") {
    if (json::parse(r.body, nullptr, false).is_discarded()) fail("a response that is not JSON");
  }
  return 0;
}
