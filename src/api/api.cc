#include "api/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>

#include "api/auth.h"
#include "api/validation.h"
#include "common/encoding.h"
#include "common/log.h"
#include "manager/stored_settings.h"
#include "os/file.h"

namespace moat::api {

json environmentJson(const store::EnvironmentRecord& r) {
  json j = {{"id", r.id},
            {"task_id", r.taskId},
            {"template", r.templateName},
            {"state", store::stateName(r.state)},
            {"spec",
             {{"cpus", r.cpus},
              {"ram_mb", r.ramMb},
              {"storage_gb", r.storageGb},
              {"pids", r.pids},
              {"isolation", r.isolation}}},
            {"created_at", timestamp(r.createdAtMs)},
            {"expires_at", timestamp(r.expiresAtMs)},
            {"ttl_while_paused", r.ttlRunsWhilePaused ? "runs" : "stops"},
            {"on_expiry", store::actionName(r.onExpiry)},
            {"labels", r.labels}};
  if (r.pausedAtMs > 0) j["paused_at"] = timestamp(r.pausedAtMs);
  // Where a paused environment's memory is: "ram", or "disk" (a checkpoint);
  // back_to_disk: in RAM for file reads, until none came for a while.
  if (r.state == store::EnvironmentState::kPaused) {
    j["paused_memory"] = r.pausedToDisk ? "disk" : "ram";
    if (!r.pausedToDisk && r.backToDisk) j["back_to_disk"] = true;
  }
  if (!r.reason.empty()) j["reason"] = r.reason;
  if (!r.accel.empty()) j["accel"] = r.accel;
  // Shown as stored (a record that has none yet shows none).
  auto layers = r.permissions.empty() ? Result<std::vector<gate::Permissions>>(std::vector<gate::Permissions>{})
                                      : manager::storedLayers(r, gate::Permissions::defaults());
  if (layers.ok() && !layers->empty()) {
    j["permissions"] = layers->front().toJson();
    if (layers->size() > 1) j["permission_layers"] = layers->size();
  }
  auto network = manager::storedNetwork(r);
  j["network"] = egress::modeName(network.ok() ? network->mode : egress::Mode::kNone);
  auto secrets = manager::storedSecrets(r);
  if (secrets.ok() && !secrets->empty()) j["secrets"] = egress::secretsToPublic(secrets.value());
  return j;
}

Api::Api(manager::EnvironmentManager& manager, Keys& keys, gate::ApprovalCenter& approvals, std::string masterToken,
         ApiOptions options, audit::Log* audit)
    : environments_(manager),
      commands_(manager),
      permissionLayers_(manager),
      networks_(manager),
      snapshots_(manager),
      keys_(keys),
      approvals_(approvals),
      masterToken_(std::move(masterToken)),
      options_(std::move(options)),
      log_(audit),
      audit_(audit ? static_cast<audit::Recorder&>(*audit) : audit::nullRecorder()),
      admission_(options_.maxRequestsPerKey, options_.keyRequestsPerSecond, metrics_) {}

void Api::recordAuthFailure(const HttpRequest& request, const std::string& token, const std::string& why) {
  json data = {{"reason", why}, {"method", request.method}, {"path", request.path}};
  if (!request.remote.empty()) data["remote"] = request.remote;
  // The key a token claims to be (never the token): moat_<12 hex id>_...
  if (token.size() > 18 && keyTokenStartsAt(token, 0)) {
    data["key"] = token.substr(5, 12);
  }
  audit_.record("auth.failed", "", "anonymous", std::move(data));
}

void Api::countError(const std::string& code) { metrics_.countError(code); }

namespace {

// moatd --access-log: one line per request (docs/INSTALL.md, "Logs").
void logAccess(const HttpRequest& request, int status, const std::string& actor,
               std::chrono::steady_clock::time_point started) {
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  char duration[32];
  std::snprintf(duration, sizeof duration, "%.1f", ms);
  const std::string caller = actor.empty() ? "-" : actor;
  const std::string peer = request.remote.empty() ? "in-process" : request.remote;
  log::write(log::Level::kInfo,
             "access " + request.method + " " + request.path + " " + std::to_string(status) + " " + duration + " ms " +
                 caller + " " + peer,
             {{"kind", "access"},
              {"method", request.method},
              {"path", request.path},
              {"status", std::to_string(status), true},
              {"duration_ms", duration, true},
              {"caller", caller},
              {"peer", peer}});
}

}  // namespace

Preflight Api::preflight(const HttpRequest& head) {
  const auto started = std::chrono::steady_clock::now();
  Preflight p = admit(head);
  // A request refused before its body is read has its access line too (the
  // caller "-": not admitted).
  if (p.reject && options_.accessLog) logAccess(head, p.response.status, "", started);
  return p;
}

Preflight Api::admit(const HttpRequest& head) {
  Preflight p;
  bool fileWrite =
      head.method == "PUT" && head.path.size() > 6 && head.path.compare(head.path.size() - 6, 6, "/files") == 0;
  p.bodyLimit = fileWrite ? (16u << 20) : (1u << 20);
  // A preview host's requests go to its environment, never to the API:
  // the URL's secret is their grant (ports.cc).
  if (auto secret = previewSecretOf(head.host, options_.previewDomain)) {
    // Nobody is asked for a token here: a URL that names no live preview is
    // refused before its body is read (else anyone could have moatd read and
    // hold 16 MiB per connection).
    if (secret->empty() || !previews_.resolve(*secret)) {
      p.reject = true;
      p.response = errorResponse({404, "not_found", "no such preview", ""});
      return p;
    }
    p.bodyLimit = 16u << 20;
    return p;
  }
  if (head.path.rfind("/v1/environments/", 0) == 0 && head.path.find("/ports/") != std::string::npos) {
    p.bodyLimit = 16u << 20;  // a request body for a server inside
  }
  if (head.path == "/healthz") return p;
  if (isBoardPath(head.path)) {  // public assets, and a sign-in's token in its body
    p.bodyLimit = 4096;
    return p;
  }
  if (head.path == "/mcp" || head.path == "/mcp/") {  // as the route table matches it
    if (auto refused = mcpGuard(head)) {
      p.reject = true;
      p.response = *refused;
      countError("forbidden");
      return p;
    }
  }
  // Refused before the body: nothing held, counted by its code.
  auto refuse = [&](const ApiError& e, const std::string& retryAfter = "") {
    p.reject = true;
    p.hold.reset();
    p.response = errorResponse(e);
    if (!retryAfter.empty()) p.response.headers.emplace_back("Retry-After", retryAfter);
    countError(e.code);
    return p;
  };
  std::string token = bearerToken(head.authorization);
  std::string why = "missing Authorization: Bearer <token>";
  if (head.authorization.empty()) {
    BoardCredentials board = sessionCredentials(head);
    if (board.refusal) {
      if (board.refusal->status == 401) recordAuthFailure(head, "", board.refusal->message);
      return refuse(*board.refusal);
    }
    token = board.token;
  }
  if (!token.empty()) {
    if (constantTimeEquals(token, masterToken_)) return p;
    auto key = keys_.authenticate(token);
    if (key.ok()) {
      auto verdict = admission_.admit(key->keyId);
      if (!verdict.refusal) {
        p.hold = std::move(verdict.hold);
        return p;
      }
      if (verdict.refusal->status == 503) {  // moatd is stopping: not counted
        p.reject = true;
        p.response = errorResponse(*verdict.refusal);
        return p;
      }
      return refuse(*verdict.refusal, verdict.retryAfter);
    }
    why = key.error().context;
  }
  recordAuthFailure(head, token, why);
  return refuse({401, "unauthorized", why, ""});
}

void Api::stopWaiting() {
  admission_.stop();
  {
    std::lock_guard<std::mutex> lock(streamsMutex_);
    streamsStopping_ = true;
  }
  streamsCv_.notify_all();
}

HttpResponse Api::handle(const HttpRequest& request) {
  const auto started = std::chrono::steady_clock::now();
  if (auto secret = previewSecretOf(request.host, options_.previewDomain)) return previewRequest(request, *secret);
  HttpResponse response;
  std::string token = bearerToken(request.authorization);
  std::string actor;
  std::optional<ApiError> sessionRefusal;
  if (request.authorization.empty() && !isBoardPath(request.path)) {
    BoardCredentials board = sessionCredentials(request);
    sessionRefusal = board.refusal;
    if (!board.refusal && !board.token.empty()) {
      // As if the session's token had come: what calls this API again in
      // process with the caller's own token (agent runs' tools, MCP) then
      // has it.
      HttpRequest asToken = request;
      asToken.authorization = "Bearer " + board.token;
      asToken.cookie.clear();
      return handle(asToken);
    }
  }
  if (request.path == "/healthz" && request.method == "GET") {
    json microvm = {{"available", options_.microvmAvailable}};
    if (options_.microvmAvailable) {
      microvm["accel"] = options_.microvmAccel;
      if (!options_.microvmAccelWhy.empty()) microvm["accel_reason"] = options_.microvmAccelWhy;
    }
    response = respond(200, {{"status", "ok"}, {"microvm", microvm}});
  } else if (isBoardPath(request.path)) {
    response = boardRoute(request);
  } else if (sessionRefusal) {
    response = errorResponse(*sessionRefusal);
    if (sessionRefusal->status == 401) recordAuthFailure(request, "", sessionRefusal->message);
  } else if (token.empty()) {
    // Only without a preflight (which refuses these first).
    response = errorResponse({401, "unauthorized", "missing Authorization: Bearer <token>", ""});
    recordAuthFailure(request, token, "missing Authorization: Bearer <token>");
  } else if (constantTimeEquals(token, masterToken_)) {
    Principal master;
    master.master = true;
    actor = master.owner();
    response = route(request, master);
  } else {
    auto key = keys_.authenticate(token);
    if (key.ok()) {
      actor = key->owner();
      response = route(request, key.value());
    } else {
      // Revoked between the preflight and now, or no preflight.
      response = errorResponse({401, "unauthorized", key.error().context, ""});
      recordAuthFailure(request, token, key.error().context);
    }
  }
  if (response.status >= 400) {
    auto j = json::parse(response.body, nullptr, false);
    std::string code = j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("code") &&
                               j["error"]["code"].is_string()
                           ? j["error"]["code"].get<std::string>()
                           : "unknown";
    countError(code);
    // A refusal is a decision: which caller was refused what, and why. Not
    // filed under the environment of the path: that may be another key's,
    // whose audit readers need not learn of the attempt.
    if (response.status == 403 && code == "forbidden" && !actor.empty()) {
      audit_.record("auth.denied", "", actor,
                    {{"method", request.method}, {"path", request.path}, {"reason", j["error"].value("message", "")}});
    }
  }
  if (options_.accessLog) logAccess(request, response.status, actor, started);
  return response;
}

HttpResponse Api::keysRoute(const HttpRequest& req, const Principal& principal) {
  if (!principal.master) {
    return errorResponse({403, "forbidden", "only the master token manages API keys", ""});
  }
  std::string id = pathSegment(req.path, 2);
  if (!id.empty()) {
    if (!pathSegment(req.path, 3).empty())
      return errorResponse({404, "not_found", "no such endpoint: " + req.path, ""});
    Status s = keys_.revoke(id);
    if (!s.ok()) return errorResponse({404, "not_found", "no active key " + id, ""});
    audit_.record("key.revoked", "", principal.owner(), {{"key", id}});
    // What the key opened to anyone ends with it (docs/PORTS.md).
    for (const auto& p : previews_.endOwner(id)) {
      audit_.record("preview.revoked", p.environment, "moatd",
                    {{"preview", p.id}, {"port", p.port}, {"reason", "key revoked"}});
    }
    HttpResponse r;
    r.status = 204;
    return r;
  }
  auto keyJson = [](const store::ApiKeyRecord& k) {
    json j = {{"id", k.id},
              {"name", k.name},
              {"scopes", k.scopes},
              {"created_at", timestamp(k.createdAtMs)},
              {"revoked", k.revokedAtMs != 0}};
    if (!k.permissions.empty()) j["permissions"] = json::parse(k.permissions, nullptr, false);
    return j;
  };
  if (req.method == "GET") {
    auto list = keys_.list();
    if (!list.ok()) return errorResponse(fromError(list.error()));
    json arr = json::array();
    for (const auto& k : list.value()) arr.push_back(keyJson(k));
    return respond(200, {{"keys", arr}});
  }
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"name", "scopes", "permissions"}, "")) return errorResponse(*e);
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
      return errorResponse(
          invalid("scopes[" + std::to_string(i) + "]",
                  "unknown scope (create, read, exec, files, destroy, timeout, approve, permissions, audit, snapshots, "
                  "templates, ports)"));
    }
    if (std::find(scopes.begin(), scopes.end(), s.get<std::string>()) == scopes.end()) scopes.push_back(s);
  }
  std::string ceiling;
  if (j.contains("permissions")) {
    // A ceiling: scopes left out are not limited by it.
    auto parsed = parsePermissions(j["permissions"], gate::Permissions::allowAll(), perr);
    if (!parsed.ok()) return errorResponse(perr);
    ceiling = parsed->toJson().dump();
  }
  auto created = keys_.create(name, scopes, ceiling);
  if (!created.ok()) return errorResponse(fromError(created.error()));
  audit_.record("key.created", "", principal.owner(),
                {{"key", created->record.id}, {"name", name}, {"scopes", scopes}});
  json out = keyJson(created->record);
  out["token"] = created->token;
  return respond(201, out);
}

const std::vector<Route>& Api::routes() {
  using P = PathParams;
  // One handler per resource; those below read the rest of the path themselves.
  const auto processes = [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
    return a.processesRoute(r, p, m.at("id"));
  };
  const auto files = [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
    return a.filesRoute(r, p, m.at("id"), pathSegment(r.path, 4));
  };
  const auto network = [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
    return a.networkRoute(r, p, m.at("id"));
  };
  const auto permissions = [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
    return a.permissionsRoute(r, p, m.at("id"));
  };
  const auto environmentSnapshots = [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
    return a.environmentSnapshotsRoute(r, p, m.at("id"), pathSegment(r.path, 3));
  };
  const auto snapshots = [](Api& a, const HttpRequest& r, const Principal& p, const P&) {
    return a.snapshotsRoute(r, p);
  };
  const auto approvals = [](Api& a, const HttpRequest& r, const Principal& p, const P&) {
    return a.approvalsRoute(r, p);
  };
  const auto keys = [](Api& a, const HttpRequest& r, const Principal& p, const P&) { return a.keysRoute(r, p); };
  const auto templateRoutes = [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
    auto name = m.find("name");
    return a.templatesRoute(r, p, name == m.end() ? std::string() : name->second);
  };
  const auto previews = [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
    return a.previewsRoute(r, p, m.at("id"), m.count("preview_id") ? m.at("preview_id") : "");
  };
  // Rows of one pattern stay together (findRoute); the order is
  // api/openapi.yaml's, which tests/unit/api_routes_test.cc holds it to.
  static const std::vector<Route> table = {
      {"GET", "/healthz", "", false, true,
       [](Api&, const HttpRequest&, const Principal&, const P&) {
         return respond(200, {{"status", "ok"}});
       }},
      {"GET", "/metrics", "read", false, true,
       [](Api& a, const HttpRequest&, const Principal& p, const P&) { return a.metrics(p); }},
      // The MCP tools call this API with the caller's own token (docs/MCP.md).
      {"*", "/mcp", "", false, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P&) { return a.mcpRoute(r, p); }},
      {"POST", "/v1/agents", "create", false, false,
       [](Api& a, const HttpRequest& r, const Principal& p, const P&) { return a.createAgent(r, p); }},
      {"GET", "/v1/agents", "read", false, false,
       [](Api& a, const HttpRequest&, const Principal& p, const P&) { return a.listAgents(p); }},
      {"GET", "/v1/agents/{id}", "read", false, false,
       [](Api& a, const HttpRequest&, const Principal& p, const P& m) { return a.getAgent(p, m.at("id")); }},
      {"POST", "/v1/agents/{id}/stop", "destroy", false, false,
       [](Api& a, const HttpRequest&, const Principal& p, const P& m) { return a.stopAgent(p, m.at("id")); }},
      {"GET", "/v1/agents/{id}/transcript", "read", false, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
         return a.agentTranscript(r, p, m.at("id"));
       }},
      {"GET", "/v1/environments", "read", false, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P&) { return a.listEnvironments(r, p); }},
      {"POST", "/v1/environments", "create", false, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P&) { return a.createEnvironment(r, p); }},
      {"GET", "/v1/environments/{id}", "read", true, false,
       [](Api& a, const HttpRequest&, const Principal&, const P& m) { return a.getEnvironment(m.at("id")); }},
      {"DELETE", "/v1/environments/{id}", "destroy", true, false,
       [](Api& a, const HttpRequest&, const Principal& p, const P& m) { return a.destroyEnvironment(p, m.at("id")); }},
      {"GET", "/v1/environments/{id}/stats", "read", true, false,
       [](Api& a, const HttpRequest&, const Principal&, const P& m) { return a.environmentStats(m.at("id")); }},
      {"GET", "/v1/stats", "read", false, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P&) { return a.fleetStatsRoute(r, p); }},
      {"POST", "/v1/environments/{id}/timeout", "timeout", true, false,
       [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
         return a.setEnvironmentTimeout(r, p, m.at("id"));
       }},
      {"POST", "/v1/environments/{id}/pause", "pause", true, false,
       [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
         return a.pauseEnvironment(r, p, m.at("id"), true);
       }},
      {"POST", "/v1/environments/{id}/resume", "pause", true, false,
       [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
         return a.pauseEnvironment(r, p, m.at("id"), false);
       }},
      {"POST", "/v1/environments/{id}/exec", "exec", true, false,
       [](Api& a, const HttpRequest& r, const Principal& p, const P& m) { return a.execRoute(r, p, m.at("id")); }},
      // Processes and shells run commands: they need the exec scope.
      {"GET", "/v1/environments/{id}/processes", "exec", true, true, processes},
      {"POST", "/v1/environments/{id}/processes", "exec", true, true, processes},
      {"GET", "/v1/environments/{id}/processes/{pid}", "exec", true, true, processes},
      {"GET", "/v1/environments/{id}/processes/{pid}/output", "exec", true, true, processes},
      {"POST", "/v1/environments/{id}/processes/{pid}/stdin", "exec", true, true, processes},
      {"POST", "/v1/environments/{id}/processes/{pid}/signal", "exec", true, true, processes},
      {"POST", "/v1/environments/{id}/processes/{pid}/resize", "exec", true, true, processes},
      {"GET", "/v1/environments/{id}/shell", "exec", true, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P& m) { return a.shellRoute(r, p, m.at("id")); }},
      {"GET", "/v1/environments/{id}/files", "files", true, true, files},
      {"PUT", "/v1/environments/{id}/files", "files", true, true, files},
      {"DELETE", "/v1/environments/{id}/files", "files", true, true, files},
      {"GET", "/v1/environments/{id}/files/list", "files", true, true, files},
      {"GET", "/v1/environments/{id}/files/stat", "files", true, true, files},
      {"POST", "/v1/environments/{id}/files/mkdir", "files", true, true, files},
      {"POST", "/v1/environments/{id}/files/move", "files", true, true, files},
      {"GET", "/v1/environments/{id}/network", "read", true, true, network},
      {"PUT", "/v1/environments/{id}/network", "read", true, true, network},
      {"GET", "/v1/environments/{id}/snapshots", "snapshots", true, true, environmentSnapshots},
      {"POST", "/v1/environments/{id}/snapshots", "snapshots", true, true, environmentSnapshots},
      {"POST", "/v1/environments/{id}/restore", "snapshots", true, true, environmentSnapshots},
      {"POST", "/v1/environments/{id}/fork", "create", true, true, environmentSnapshots},
      {"GET", "/v1/environments/{id}/changes", "files", true, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P& m) { return a.changesRoute(r, p, m.at("id")); }},
      // Any method: the request goes on to the server inside (docs/PORTS.md).
      {"*", "/v1/environments/{id}/ports/{port}/{path...}", "ports", true, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P& m) {
         return a.portsRoute(r, p, m.at("id"), m.at("port"));
       }},
      {"GET", "/v1/environments/{id}/previews", "ports", true, false, previews},
      {"POST", "/v1/environments/{id}/previews", "ports", true, false, previews},
      {"DELETE", "/v1/environments/{id}/previews/{preview_id}", "ports", true, false, previews},
      {"GET", "/v1/snapshots", "snapshots", false, true, snapshots},
      {"GET", "/v1/snapshots/{snapshot_id}", "snapshots", false, true, snapshots},
      {"DELETE", "/v1/snapshots/{snapshot_id}", "snapshots", false, true, snapshots},
      {"GET", "/v1/environments/{id}/permissions", "read", true, true, permissions},
      {"PUT", "/v1/environments/{id}/permissions", "read", true, true, permissions},
      {"GET", "/v1/approvals", "", false, true, approvals},
      {"GET", "/v1/approvals/{id}", "", false, true, approvals},
      {"POST", "/v1/approvals/{id}", "", false, true, approvals},
      {"GET", "/v1/keys", "", false, true, keys},
      {"POST", "/v1/keys", "", false, true, keys},
      {"DELETE", "/v1/keys/{id}", "", false, true, keys},
      {"GET", "/v1/events", "", false, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P&) { return a.eventsRoute(r, p); }},
      {"GET", "/v1/audit/verify", "", false, true,
       [](Api& a, const HttpRequest& r, const Principal& p, const P&) { return a.verifyRoute(r, p); }},
      {"GET", "/v1/templates", "read", false, false, templateRoutes},
      {"POST", "/v1/templates", "templates", false, false, templateRoutes},
      {"GET", "/v1/templates/{name}", "read", false, false, templateRoutes},
      {"DELETE", "/v1/templates/{name}", "templates", false, false, templateRoutes},
  };
  return table;
}

HttpResponse Api::route(const HttpRequest& req, const Principal& principal) {
  const RouteMatch match = findRoute(routes(), req.method, req.path);
  if (match.route == nullptr) {
    if (match.allowed.empty()) return errorResponse({404, "not_found", "no such endpoint: " + req.path, ""});
    return errorResponse(
        {405, "method_not_allowed", req.method + " " + req.path + ": use " + methodList(match.allowed), ""});
  }
  const Route& route = *match.route;
  if (*route.scope != '\0' && !principal.may(route.scope)) {
    return errorResponse({403, "forbidden", "this key lacks the '" + std::string(route.scope) + "' scope", ""});
  }
  // A key acts only on its own environments; others look like they do not exist.
  if (route.ownedEnvironment && !principal.master && environments_.ownerOf(match.params.at("id")) != principal.keyId) {
    return errorResponse({404, "not_found", "no environment " + match.params.at("id"), ""});
  }
  if (!route.takesQuery) {
    if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  }
  return route.handler(*this, req, principal, match.params);
}

HttpResponse Api::metrics(const Principal& principal) {
  HttpResponse r;
  r.contentType = "text/plain; version=0.0.4";
  r.body = metrics_.render(environments_.counters());
  // Each running environment the caller sees (a key: its own), by id, for
  // at most kMaxEnvironmentSeries of them: a scrape's size stays bounded.
  std::vector<EnvironmentUsage> usages;
  size_t omitted = 0;
  if (auto running = runningUsages(principal, ApiMetrics::kMaxEnvironmentSeries, omitted); running.ok()) {
    for (const auto& r : running.value()) {
      usages.push_back({r.record.id, r.record.ramMb << 20, backend::storageLimitBytes(r.record.storageGb), r.usage});
    }
  }
  r.body += ApiMetrics::renderEnvironments(usages, omitted);
  return r;
}

}  // namespace moat::api
