#include <cstdint>
#include <nlohmann/json.hpp>

#include "api/api.h"
#include "api/validation.h"
#include "templates/catalog.h"

// /v1/environments and /v1/environments/{id}: list, create, get, destroy,
// the time to live, and what one uses now (stats). (The caller's scope and, for a key, that it owns
// the environment: checked by the route table, api.cc.)
namespace moat::api {

HttpResponse Api::listEnvironments(const HttpRequest& req, const Principal& principal) {
  store::EnvironmentFilter filter;
  if (!principal.master) filter.owner = principal.keyId;
  for (const auto& [k, v] : req.queryAll) {
    if (k == "task_id") {
      filter.taskId = v;
    } else if (k == "state") {
      filter.state = store::environmentStateNamed(v);
      if (!filter.state && !v.empty()) {  // empty: no filter, as without it
        return errorResponse(invalid("state", "one of creating, running, destroying, gone, failed; not '" + v + "'"));
      }
    } else if (k == "label") {
      auto eq = v.find('=');
      if (eq == std::string::npos) return errorResponse(invalid("label", "expected key=value"));
      filter.labels[v.substr(0, eq)] = v.substr(eq + 1);
    } else {
      return errorResponse({400, "unknown_field", "unknown query parameter " + k, k});
    }
  }
  auto list = environments_.list(filter);
  if (!list.ok()) return errorResponse(fromError(list.error()));
  json arr = json::array();
  for (const auto& r : list.value()) arr.push_back(environmentJson(r));
  return respond(200, {{"environments", arr}});
}

HttpResponse Api::createEnvironment(const HttpRequest& req, const Principal& principal) {
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j,
                          {"task_id", "template", "spec", "ttl_s", "ttl_while_paused", "on_expiry", "labels", "env",
                           "permissions", "network", "secrets", "snapshot"},
                          "")) {
    return errorResponse(*e);
  }
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
    const bool directory = create.templateName.rfind("/", 0) == 0;
    if (create.templateName != "host" && !directory && !templates::validName(create.templateName)) {
      return errorResponse(invalid("template",
                                   "'host', a template's name (GET /v1/templates) or an absolute root file "
                                   "system directory; not '" +
                                       create.templateName.substr(0, 80) + "'"));
    }
    // A directory template shows that host directory to the environment's
    // root: only the master token may choose one.
    if (directory && !principal.master) {
      return errorResponse(
          {403, "forbidden", "template: only the master token may use a directory template", "template"});
    }
  }
  if (j.contains("spec")) {
    SpecFields spec;
    if (auto e =
            specFields(j["spec"], "spec.", static_cast<double>(environments_.config().maxTotalMemoryMb), spec, true)) {
      return errorResponse(*e);
    }
    create.isolation = spec.isolation;
    create.cpus = spec.cpus;
    create.ramMb = spec.ramMb;
    create.storageGb = spec.storageGb;
    create.pids = spec.pids;
  }
  if (j.contains("ttl_s")) {
    if (auto e =
            number(j["ttl_s"], "ttl_s", 1, static_cast<double>(environments_.config().maxTtlS), true, create.ttlS)) {
      return errorResponse(*e);
    }
  }
  if (j.contains("ttl_while_paused")) {
    const json& t = j["ttl_while_paused"];
    if (!t.is_string() || (t != "stops" && t != "runs")) {
      return errorResponse(invalid("ttl_while_paused",
                                   "must be \"stops\" (the default: a pause stops the time to "
                                   "live) or \"runs\""));
    }
    create.ttlRunsWhilePaused = t == "runs";
  }
  if (j.contains("on_expiry")) {
    const json& a = j["on_expiry"];
    auto action = a.is_string() ? store::expiryActionNamed(a.get<std::string>()) : std::nullopt;
    if (!action) {
      return errorResponse(invalid("on_expiry",
                                   "must be \"destroy\" (the default), \"pause\" (the environment is "
                                   "paused when its time to live runs out: docs/PAUSE.md) or \"checkpoint\" "
                                   "(paused with its memory on disk: microvm environments)"));
    }
    create.onExpiry = *action;
    // Kept paused past its time, it holds its memory and its place until
    // someone resumes or destroys it: what a pause may do, so the key
    // must be one that may pause.
    if (store::pausesAtExpiry(create.onExpiry) && !principal.may("pause")) {
      return errorResponse({403, "forbidden",
                            "on_expiry: \"" + std::string(store::actionName(create.onExpiry)) +
                                "\" keeps the environment past its time to live: it needs the key's pause scope",
                            "on_expiry"});
    }
  }
  // Paused at expiry with its time running on, it would be due again at
  // once: a pause at expiry stops the time to live.
  if (store::pausesAtExpiry(create.onExpiry) && create.ttlRunsWhilePaused) {
    return errorResponse(invalid("on_expiry", "\"" + std::string(store::actionName(create.onExpiry)) +
                                                  "\" needs ttl_while_paused \"stops\" (the time to live stops "
                                                  "while the environment is paused at its expiry; a resume gives it "
                                                  "ttl_s again)"));
  }
  if (j.contains("labels")) {
    if (auto e = stringMap(j["labels"], "labels", false, create.labels)) return errorResponse(*e);
  }
  if (j.contains("env")) {
    if (auto e = stringMap(j["env"], "env", true, create.env)) return errorResponse(*e);
  }
  if (j.contains("permissions")) {
    auto parsed = parsePermissions(j["permissions"], environments_.config().defaultPermissions, perr);
    if (!parsed.ok()) return errorResponse(perr);
    create.permissions = parsed.value();
  }
  if (auto e = parseNetwork(j, create)) return errorResponse(*e);
  if (j.contains("snapshot")) {
    // The files come from the snapshot; so does the template under them.
    if (j.contains("template")) return errorResponse(invalid("template", "a snapshot brings its own template"));
    if (auto e = snapshotField(j, "snapshot", create.fromSnapshot)) return errorResponse(*e);
    if (!visibleSnapshot(principal, create.fromSnapshot).ok()) {
      return errorResponse({404, "not_found", "no snapshot " + create.fromSnapshot, "snapshot"});
    }
  }
  auto created = environments_.create(create);
  if (!created.ok()) return errorResponse(fromError(created.error()));
  return respond(201, environmentJson(created.value()));
}

HttpResponse Api::getEnvironment(const std::string& id) {
  auto r = environments_.get(id);
  if (!r.ok()) return errorResponse(fromError(r.error()));
  return respond(200, environmentJson(r.value()));
}

namespace {

json statsJson(const store::EnvironmentRecord& r, const backend::Usage& u) {
  auto known = [](bool isKnown, uint64_t value) { return isKnown ? json(value) : json(nullptr); };
  return {{"id", r.id},
          {"at", timestamp(nowMs())},
          {"cpu_usec", known(u.cpuKnown, u.cpuUsec)},
          {"cpus", r.cpus},
          {"memory_bytes", u.memoryBytes},
          {"memory_limit_bytes", r.ramMb << 20},
          {"pids", u.pids},
          {"pids_limit", r.pids},
          {"oom_kills", u.oomKills},
          {"storage_bytes", known(u.storageKnown, u.storageBytes)},
          {"storage_limit_bytes", backend::storageLimitBytes(r.storageGb)},
          {"network_sent_bytes", known(u.networkKnown, u.networkSentBytes)},
          {"network_received_bytes", known(u.networkKnown, u.networkReceivedBytes)}};
}

}  // namespace

HttpResponse Api::environmentStats(const std::string& id) {
  auto record = environments_.get(id);
  if (!record.ok()) return errorResponse(fromError(record.error()));
  auto usage = environments_.usage(id);
  if (!usage.ok()) return errorResponse(fromError(usage.error()));
  return respond(200, statsJson(record.value(), usage.value()));
}

HttpResponse Api::fleetStatsRoute(const HttpRequest& req, const Principal& principal) {
  if (auto e = onlyQuery(req, {"follow", "interval_ms"})) return errorResponse(*e);
  bool follow = false;
  if (auto e = queryFlag(req, "follow", follow)) return errorResponse(*e);
  uint64_t intervalMs = 2000;
  if (auto e = queryNumber(req, "interval_ms", 60000, 10, intervalMs)) return errorResponse(*e);
  if (intervalMs < 500) return errorResponse(invalid("interval_ms", "from 500 to 60000 (milliseconds)"));
  if (!follow) return fleetStats(principal);
  // A reading every interval, as Server-Sent Events ("stats"), until the
  // client goes, moatd stops or the key is revoked.
  HttpResponse response;
  response.contentType = "text/event-stream";
  response.headers.emplace_back("Cache-Control", "no-cache");
  response.stream = [this, principal, intervalMs, stillActive = keys_.stillActive(principal)](const BodyWriter& write) {
    for (;;) {
      if (!stillActive()) {
        (void)write(": error: the API key of this request was revoked\n\n");
        return;
      }
      HttpResponse now = fleetStats(principal);
      if (now.status != 200) {
        (void)write(": error: " + now.body + "\n\n");
        return;
      }
      if (!write("event: stats\ndata: " + now.body + "\n\n")) return;
      std::unique_lock<std::mutex> lock(streamsMutex_);
      if (streamsCv_.wait_for(lock, std::chrono::milliseconds(intervalMs), [this] { return streamsStopping_; })) return;
    }
  };
  return response;
}

Result<std::vector<Api::RunningUsage>> Api::runningUsages(const Principal& principal, size_t max, size_t& beyond) {
  store::EnvironmentFilter filter;
  if (!principal.master) filter.owner = principal.keyId;
  filter.state = store::EnvironmentState::kRunning;
  MOAT_ASSIGN(auto list, environments_.list(filter));
  std::vector<RunningUsage> out;
  beyond = 0;
  for (auto& record : list) {
    if (out.size() >= max) {
      ++beyond;
      continue;
    }
    auto usage = environments_.usage(record.id);
    if (!usage.ok()) continue;  // it ended meanwhile
    out.push_back({std::move(record), usage.value()});
  }
  return out;
}

HttpResponse Api::fleetStats(const Principal& principal) {
  size_t beyond = 0;
  auto running = runningUsages(principal, SIZE_MAX, beyond);
  if (!running.ok()) return errorResponse(fromError(running.error()));
  json all = json::array();
  for (const auto& r : running.value()) all.push_back(statsJson(r.record, r.usage));
  return respond(200, {{"at", timestamp(nowMs())}, {"environments", all}});
}

HttpResponse Api::destroyEnvironment(const Principal& principal, const std::string& id) {
  Status s = environments_.destroy(id, "destroyed", principal.owner());
  if (!s.ok()) return errorResponse(fromError(s.error()));
  return noContent();
}

HttpResponse Api::setEnvironmentTimeout(const HttpRequest& req, const Principal& principal, const std::string& id) {
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  if (auto e = onlyFields(body.value(), {"ttl_s"}, "")) return errorResponse(*e);
  if (!body->contains("ttl_s")) return errorResponse(invalid("ttl_s", "required"));
  int64_t ttl = 0;
  if (auto e = number((*body)["ttl_s"], "ttl_s", 1, static_cast<double>(environments_.config().maxTtlS), true, ttl)) {
    return errorResponse(*e);
  }
  auto r = environments_.setTtl(id, ttl);
  if (!r.ok()) return errorResponse(fromError(r.error()));
  audit_.record("environment.ttl_set", id, principal.owner(), {{"ttl_s", ttl}, {"expires_at_ms", r->expiresAtMs}});
  return respond(200, environmentJson(r.value()));
}

HttpResponse Api::pauseEnvironment(const HttpRequest& req, const Principal& principal, const std::string& id,
                                   bool pause) {
  // A pause's `memory`: "ram" (the default) or "disk" (a checkpoint,
  // docs/PAUSE.md); a resume has no fields. An empty body is {}.
  bool toDisk = false;
  if (!req.body.empty()) {
    ApiError perr{};
    auto body = parseObject(req.body, perr);
    if (!body.ok()) return errorResponse(perr);
    auto unknown = pause ? onlyFields(body.value(), {"memory"}, "") : onlyFields(body.value(), {}, "");
    if (unknown) return errorResponse(*unknown);
    if (pause && body->contains("memory")) {
      const auto& memory = (*body)["memory"];
      if (!memory.is_string() || (memory != "ram" && memory != "disk")) {
        return errorResponse(invalid("memory", "must be \"ram\" or \"disk\""));
      }
      toDisk = memory == "disk";
    }
  }
  auto r = pause ? environments_.pause(id, principal.owner(), toDisk) : environments_.resume(id, principal.owner());
  if (!r.ok()) return errorResponse(fromError(r.error()));
  return respond(200, environmentJson(r.value()));
}

}  // namespace moat::api
