#include "manager/environment_manager.h"

#include <arpa/inet.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>

#include "common/base_environment.h"
#include "common/scope_exit.h"
#include "common/trace.h"
#include "manager/stored_settings.h"
#include "os/process.h"

namespace moat::manager {

namespace {

// What a client following a process is told when its environment goes.
std::string endReason(const std::string& destroyReason) {
  if (destroyReason == "destroyed") return "the environment was destroyed";
  if (destroyReason == "expired") return "the environment expired (its ttl passed)";
  return "the environment ended: " + destroyReason;
}

// The audit log's data holds integers only (docs/API.md, "Audit"): CPUs in
// thousandths, storage in MiB.
nlohmann::json createdData(const store::EnvironmentRecord& r, bool warm) {
  return {{"template", r.templateName},
          {"spec",
           {{"millicpus", static_cast<int64_t>(r.cpus * 1000 + 0.5)},
            {"ram_mb", r.ramMb},
            {"storage_mb", static_cast<int64_t>(r.storageGb * 1024 + 0.5)},
            {"pids", r.pids}}},
          {"ttl_s", (r.expiresAtMs - r.createdAtMs) / 1000},
          {"task_id", r.taskId},
          {"labels", r.labels},
          {"warm", warm}};
}

// A command's end as the audit log records it (exec.ended, process.ended).
nlohmann::json endedData(const ProcessInfo& info) {
  nlohmann::json j = {
      {"process", info.id}, {"argv", info.argv}, {"kind", info.kind}, {"state", processStateName(info.state)}};
  if (info.state == ProcessState::kExited) {
    j["exit_code"] = info.signal ? 128 + info.signal : info.exitCode;
    j["signal"] = info.signal;
    j["timed_out"] = info.timedOut;
    j["duration_ms"] = info.durationUs / 1000;
    j["stdout_bytes"] = info.stdoutBytes;
    j["stderr_bytes"] = info.stderrBytes;
  } else if (info.state == ProcessState::kFailed) {
    j["exit_code"] = info.spawnStage == "exec" && info.spawnErrno == ENOENT ? 127 : 126;
    j["error"] = info.spawnStage + ": " + std::strerror(info.spawnErrno);
  } else {
    j["reason"] = info.reason;
    j["duration_ms"] = info.endedAtMs - info.startedAtMs;
  }
  return j;
}

}  // namespace

namespace {

// The limits and pools as the manager keeps them: the memory limit is the
// host's when none is given; a pool's 0 resources are the default spec's,
// pools of no size are dropped, and one pool per (template, spec) holds the
// sizes of repeated ones.
ManagerConfig resolved(ManagerConfig config) {
  if (config.maxTotalMemoryMb == 0) config.maxTotalMemoryMb = os::totalMemoryMb();
  std::erase_if(config.warmPools, [](const WarmPool& p) { return p.size == 0; });
  std::vector<WarmPool> pools;
  for (WarmPool p : config.warmPools) {
    if (p.cpus <= 0) p.cpus = config.defaultCpus;
    if (p.ramMb == 0) p.ramMb = config.defaultRamMb;
    if (p.storageGb <= 0) p.storageGb = config.defaultStorageGb;
    if (p.pids == 0) p.pids = config.defaultPids;
    auto same = std::find_if(pools.begin(), pools.end(), [&](const WarmPool& q) {
      return q.keeps(p.templateName, p.cpus, p.ramMb, p.storageGb, p.pids);
    });
    if (same == pools.end()) {
      pools.push_back(p);
    } else {
      same->size += p.size;
    }
  }
  config.warmPools = std::move(pools);
  return config;
}

}  // namespace

EnvironmentManager::EnvironmentManager(ManagerConfig config, store::Store& store, backend::Backend& backend,
                                       audit::Recorder* audit)
    : config_(resolved(std::move(config))),
      store_(store),
      backend_(backend),
      audit_(audit ? *audit : audit::nullRecorder()) {
  reaper_ = std::thread([this] { reaperLoop(); });
  // The pool fills on its own thread: a slow create must not hold up expiry.
  if (!config_.warmPools.empty()) pooler_ = std::thread([this] { poolLoop(); });
}

void EnvironmentManager::poolLoop() {
  // A claimed environment's first commands come right after the claim; the
  // refill (a create: milliseconds of CPU) waits until they have run, so it
  // does not compete with them on a small machine.
  constexpr int64_t kRefillAfterClaimMs = 10;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    int64_t quietAt = pools_.lastClaimMs() + kRefillAfterClaimMs;
    if (nowMs() < quietAt) {
      poolCv_.wait_for(lock, std::chrono::milliseconds(quietAt - nowMs()));
      continue;
    }
    lock.unlock();
    refillPool();
    lock.lock();
    if (stopping_) break;
    poolCv_.wait_for(lock, std::chrono::milliseconds(500));
  }
}

void EnvironmentManager::stopThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  reaperCv_.notify_all();
  poolCv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  if (pooler_.joinable()) pooler_.join();
}

EnvironmentManager::~EnvironmentManager() {
  stopThreads();
  if (!detached_) destroyAll("moatd stopped");
  // Detached: dropping the connections leaves moat-init running; the backend
  // hands a new connection to the next moatd. Dropped here, while every member
  // their reader threads touch (onInitGone) still exists.
  std::map<std::string, Live> live;
  std::vector<ReadyEnvironment> pool = pools_.takeAll();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live.swap(live_);
  }
  live.clear();
  pool.clear();
}

void EnvironmentManager::interrupt() {
  stopThreads();
  std::vector<std::shared_ptr<InitConnection>> connections;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, l] : live_) connections.push_back(l.connection);
  }
  for (auto& [id, c] : pools_.connections()) connections.push_back(c);
  for (auto& c : connections) c->close("moatd is shutting down");
}

Status EnvironmentManager::recoverAfterRestart() {
  // Without the backend's list, nothing can be told apart: stop rather than
  // fail environments that may be running fine.
  MOAT_ASSIGN(auto owned, backend_.list());
  std::set<std::string> running(owned.begin(), owned.end());
  MOAT_ASSIGN(auto live, store_.liveEnvironments());
  std::set<std::string> recorded;
  // The egress links there are now. A moatd killed during an attach or a
  // detach may have left a link its store does not name, or named one that
  // is gone: links are adopted only where the store and the namespace agree.
  // If they cannot be listed, links are adopted as the store says.
  std::optional<std::set<uint32_t>> linked;
  if (egress_) {
    auto present = egress_->presentSlots();
    if (present.ok()) {
      linked = std::move(present.value());
    } else {
      std::fprintf(stderr, "moatd: listing the egress links: %s (adopting them as the store says)\n",
                   present.error().message().c_str());
    }
  }
  std::vector<std::string> relink;
  // A slot two records name (left by a moatd killed between freeing it and
  // storing so) is adopted by neither: which one's namespace holds the link
  // is not known, so both are relinked.
  std::map<int64_t, int> named;
  for (const auto& r : live) {
    if (r.netSlot >= 0 && r.state != EnvironmentState::kDestroying && running.count(r.id)) ++named[r.netSlot];
  }
  for (const auto& r : live) {
    recorded.insert(r.id);
    if (!running.count(r.id) || r.state == EnvironmentState::kDestroying) {
      if (running.count(r.id)) (void)backend_.destroy(r.id);
      const EnvironmentState state =
          r.state == EnvironmentState::kDestroying ? EnvironmentState::kGone : EnvironmentState::kFailed;
      const std::string reason =
          r.state == EnvironmentState::kDestroying ? r.reason : "moatd restarted and the environment was gone";
      (void)store_.setState(r.id, state, reason);
      audit_.record("environment.destroyed", r.id, "moatd", {{"reason", reason}, {"state", stateName(state)}});
      continue;
    }
    auto control = backend_.attach(r.id);
    if (!control.ok()) {
      (void)backend_.destroy(r.id);
      const std::string reason = "re-attach after a moatd restart failed: " + control.error().message();
      (void)store_.setState(r.id, EnvironmentState::kFailed, reason);
      audit_.record("environment.destroyed", r.id, "moatd", {{"reason", reason}, {"state", "failed"}});
      continue;
    }
    std::string id = r.id;
    auto connection = connect(id, std::move(control.value()));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_[id] = makeLive(connection, r);
      nextExpiryMs_ = std::min(nextExpiryMs_, r.expiresAtMs);
    }
    capacity_.count(r.ramMb);
    if (r.state != EnvironmentState::kRunning) (void)store_.setState(id, EnvironmentState::kRunning, "");
    auto stored = storedNetwork(r);
    const bool wantsLink = stored.ok() && stored->mode != egress::Mode::kNone;
    if (egress_ && r.netSlot >= 0 && (!linked || linked->count(static_cast<uint32_t>(r.netSlot))) &&
        named[r.netSlot] == 1) {
      auto secrets = storedSecrets(r);
      // A policy that cannot be read any more adopts the link shut.
      egress_->adopt(id, static_cast<uint32_t>(r.netSlot), stored.ok() ? stored.value() : egress::Policy{},
                     secrets.ok() ? secrets.value() : std::vector<egress::Secret>{});
    } else if (egress_ && (r.netSlot >= 0 || wantsLink)) {
      relink.push_back(id);  // once the links nobody holds are gone, below
    }
    audit_.record("environment.reattached", id, "moatd", nlohmann::json::object());
  }
  if (egress_ && linked) {
    // Left by an attach the previous moatd did not record: an environment
    // whose store says "none" must not keep a device. Best effort: what
    // cannot be removed now stays unused (no policy names its address, so
    // the proxy and the resolver ignore it) until its slot is taken again.
    egress_->removeUnadoptedLinks();
    // Created, or given a policy, with a link the previous moatd never
    // recorded (killed in between), or a recorded link that is gone: the
    // stored policy is put in force again.
    for (const auto& id : relink) {
      Status s = restoreNetwork(id, "moatd restarted: the stored policy had no link");
      if (!s.ok()) {
        (void)destroy(id, "failed: its network could not be restored after a moatd restart: " + s.error().message(),
                      "moatd");
      }
    }
  }
  // Made by a moatd that died before recording them: nobody knows of them.
  for (const auto& id : running) {
    if (!recorded.count(id)) (void)backend_.destroy(id);
  }
  recoverSnapshots();
  return {};
}

Status EnvironmentManager::restoreNetwork(const std::string& id, const std::string& why) {
  MOAT_ASSIGN(auto record, get(id));
  MOAT_ASSIGN(egress::Policy policy, storedNetwork(record));
  if (policy.mode == egress::Mode::kNone) {
    MOAT_TRY(store_.setNetwork(id, networkText(policy), -1));
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = live_.find(id); it != live_.end()) {
      for (auto& [k, v] : egress::Controller::environmentVariables(egress::EgressNetwork::linkFor(0))) {
        it->second.env.erase(k);
      }
    }
    return {};
  }
  auto secrets = storedSecrets(record);
  MOAT_TRY(connectNetwork(id, policy, secrets.ok() ? secrets.value() : std::vector<egress::Secret>{}));
  audit_.record("network.changed", id, "moatd", {{"network", policy.toJson()}, {"reason", why}});
  return {};
}

void EnvironmentManager::detach() {
  std::lock_guard<std::mutex> lock(mutex_);
  detached_ = true;
}

backend::Spec EnvironmentManager::specFor(const std::string& templateName, double cpus, uint64_t ramMb,
                                          double storageGb, uint64_t pids) const {
  backend::Spec spec;
  spec.templateName = templateName;
  spec.cpus = cpus;
  spec.memoryMb = ramMb;
  spec.pids = pids;
  spec.storageGb = storageGb;
  return spec;
}

backend::Spec EnvironmentManager::poolSpec(size_t pool) const {
  const WarmPool& p = pools_.pools()[pool];
  return specFor(p.templateName, p.cpus, p.ramMb, p.storageGb, p.pids);
}

std::optional<size_t> EnvironmentManager::poolFor(const store::EnvironmentRecord& record) const {
  return pools_.poolFor(record.templateName, record.cpus, record.ramMb, record.storageGb, record.pids);
}

void EnvironmentManager::refillPool() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_ || detached_) return;
    }
    // Only this thread refills: the pool found short stays short until it does.
    auto pool = pools_.shortOf(nowMs());
    if (!pool) return;
    const uint64_t ramMb = pools_.pools()[*pool].ramMb;
    if (!capacity_.take(ramMb).ok()) return;  // real requests come first
    pools_.refilling(*pool);
    auto spec = poolSpec(*pool);
    spec.id = backend::newEnvironmentId();  // named, so that a failed create can be cleaned up
    auto created = backend_.create(spec);
    if (!created.ok()) (void)backend_.destroy(spec.id);  // made but not handed over (a lost descriptor)
    std::shared_ptr<InitConnection> connection;
    if (created.ok()) {
      std::string id = created->id;
      connection = connect(id, std::move(created->control));
      warmUp(connection, id);
      if (connection->closed()) {
        (void)backend_.destroy(id);
        created = Error::make(Code::kGone, "a pool environment ended while warming up");
      }
    }
    if (!created.ok()) {
      capacity_.release(ramMb);
      pools_.refillFailed(*pool, nowMs());
      continue;
    }
    pools_.refilled(ReadyEnvironment{created->id, std::move(connection), *pool});
  }
}

Result<store::EnvironmentRecord> EnvironmentManager::create(const CreateRequest& request) {
  store::EnvironmentRecord record;
  record.id = backend::newEnvironmentId();
  record.taskId = request.taskId;
  record.templateName = request.templateName;
  record.cpus = request.cpus > 0 ? request.cpus : config_.defaultCpus;
  record.ramMb = request.ramMb > 0 ? request.ramMb : config_.defaultRamMb;
  record.storageGb = request.storageGb > 0 ? request.storageGb : config_.defaultStorageGb;
  record.pids = request.pids > 0 ? request.pids : config_.defaultPids;
  record.labels = request.labels;
  record.env = request.env;
  for (const auto& secret : request.secrets) record.env[secret.name] = secret.placeholder;
  record.owner = request.owner;
  if (request.network.mode != egress::Mode::kNone || !request.secrets.empty()) {
    if (!egress_) {
      return Error::make(Code::kUnavailable,
                         "egress control is not running in this moatd (see moatd --help): "
                         "only network mode \"none\" is available");
    }
    record.network = networkText(request.network);
    record.secrets = secretsText(request.secrets);
  }
  std::vector<gate::Permissions> layers = {request.permissions ? *request.permissions : config_.defaultPermissions};
  layers.insert(layers.end(), request.furtherLayers.begin(), request.furtherLayers.end());
  record.permissions = layersText(layers);
  std::optional<store::SnapshotRecord> from;
  auto snapshotHeld = holdSnapshot(request.fromSnapshot);  // until the backend has copied it
  if (!request.fromSnapshot.empty()) {
    MOAT_ASSIGN(auto snap, usableSnapshot(request.fromSnapshot, request.forkedFrom));
    if (request.owner != "master" && snap.owner != request.owner) {
      return Error::make(Code::kNotFound, "no snapshot " + request.fromSnapshot);
    }
    record.templateName = snap.templateName;
    if (request.storageGb <= 0) record.storageGb = snap.storageGb;
    from = std::move(snap);
  }
  record.state = EnvironmentState::kCreating;
  record.createdAtMs = nowMs();
  int64_t ttl = request.ttlS > 0 ? request.ttlS : config_.defaultTtlS;
  record.expiresAtMs = record.createdAtMs + ttl * 1000;
  // A warm environment of exactly this template and spec: a claim.
  if (auto warm = from ? std::nullopt : poolFor(record)) {
    if (auto taken = pools_.take(*warm, nowMs())) {
      ReadyEnvironment ready = std::move(*taken);
      record.id = ready.id;
      record.state = EnvironmentState::kRunning;
      // A DELETE of the id (seen in a listing) waits until it is live.
      auto held = exclusive(record.id);
      Status stored = store_.insertEnvironment(record);
      if (!stored.ok()) {
        pools_.putBack(std::move(ready));
        return stored.error();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        live_[record.id] = makeLive(ready.connection, record);
        nextExpiryMs_ = std::min(nextExpiryMs_, record.expiresAtMs);
      }
      pools_.claimed(*warm);  // counted once it is one
      // Its permissions are the claimer's: told before anyone else may reach it.
      sendExecPolicy(record.id, ready.connection);
      held.run();
      poolCv_.notify_all();  // refill
      audit_.record("environment.created", record.id, record.owner, createdData(record, true));
      if (request.network.mode != egress::Mode::kNone) {
        Status plugged = connectNetworkUnlessSet(record.id, request.network, request.secrets);
        if (!plugged.ok()) {
          (void)destroy(record.id, "failed: " + plugged.error().message());
          return plugged.error();
        }
      }
      return record;
    }
  }
  MOAT_TRY(capacity_.take(record.ramMb));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    creatingIds_.insert(record.id);
  }
  // It will not run: its place and memory go back.
  auto release = [&] {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      creatingIds_.erase(record.id);
      destroyRequested_.erase(record.id);
    }
    capacity_.release(record.ramMb);
  };
  traceStage("moatd: create");
  Status stored = store_.insertEnvironment(record);
  if (!stored.ok()) {
    release();
    return stored.error();
  }
  traceStage("moatd: inserted");
  auto spec = specFor(record.templateName, record.cpus, record.ramMb, record.storageGb, record.pids);
  spec.id = record.id;
  if (from) {
    spec.fromSnapshot = from->id;
    spec.snapshotHostBase = from->hostBase;
  }
  auto created = backend_.create(spec);
  snapshotHeld.run();
  traceStage("moatd: spawner answered");
  if (!created.ok()) {
    // The backend may have made it and failed only to hand it over (its
    // descriptor lost at moatd's limit): nothing of it may stay running.
    (void)backend_.destroy(record.id);
    release();
    (void)store_.setState(record.id, EnvironmentState::kFailed, created.error().message());
    nlohmann::json data = createdData(record, false);
    data["error"] = created.error().message();
    audit_.record("environment.failed", record.id, record.owner, std::move(data));
    return created.error();
  }
  std::string id = record.id;
  // From here until "running" is stored, a DELETE waits (and then finds the
  // environment live), or it came before and is honoured below. Checked and
  // made live in two steps, a DELETE between them was answered 204 and lost.
  auto held = exclusive(id);
  std::string destroyedBy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = destroyRequested_.find(id); it != destroyRequested_.end()) destroyedBy = it->second;
  }
  if (!destroyedBy.empty()) {
    // A DELETE came while the backend was creating it: honour it now.
    (void)backend_.destroy(id);
    release();
    (void)store_.setState(id, EnvironmentState::kGone, "destroyed");
    audit_.record("environment.created", id, record.owner, createdData(record, false));
    audit_.record("environment.destroyed", id, destroyedBy, {{"reason", "destroyed"}, {"state", "gone"}});
    return Error::make(Code::kConflict, "environment " + id + " was destroyed while being created");
  }
  auto connection = connect(id, std::move(created->control));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    creatingIds_.erase(id);
    live_[id] = makeLive(connection, record);
    nextExpiryMs_ = std::min(nextExpiryMs_, record.expiresAtMs);
  }
  record.state = EnvironmentState::kRunning;
  (void)store_.setState(id, EnvironmentState::kRunning, "");
  held.run();
  traceStage("moatd: running stored");
  nlohmann::json createdEvent = createdData(record, false);
  if (from && request.forkedFrom.empty()) createdEvent["from_snapshot"] = from->id;
  if (!request.forkedFrom.empty()) createdEvent["forked_from"] = request.forkedFrom;
  audit_.record("environment.created", id, record.owner, std::move(createdEvent));
  if (request.network.mode != egress::Mode::kNone) {
    Status plugged = connectNetworkUnlessSet(id, request.network, request.secrets);
    if (!plugged.ok()) {
      (void)destroy(id, "failed: " + plugged.error().message());
      return plugged.error();
    }
  }
  return record;
}

void EnvironmentManager::onInitGone(const std::string& id) {
  // moat-init went away. After a destroy that is expected; otherwise the
  // environment failed. The reaper thread decides and cleans up (this is the
  // connection's reader thread, which the cleanup joins).
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;  // a shutdown drops connections on purpose
    initGone_.push_back(id);
  }
  reaperCv_.notify_all();
}

Result<store::EnvironmentRecord> EnvironmentManager::get(const std::string& id) {
  MOAT_ASSIGN(auto record, store_.getEnvironment(id));
  if (!record) return Error::make(Code::kNotFound, "no environment " + id);
  return record.value();
}

std::string EnvironmentManager::ownerOf(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = live_.find(id); it != live_.end()) return it->second.owner;
  }
  auto record = get(id);
  return record.ok() ? record->owner : std::string();
}

std::map<std::string, std::string> EnvironmentManager::envOf(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  return it != live_.end() ? it->second.env : std::map<std::string, std::string>{};
}

Result<std::vector<store::EnvironmentRecord>> EnvironmentManager::list(const store::EnvironmentFilter& filter) {
  return store_.listEnvironments(filter);
}

EnvironmentManager::Live EnvironmentManager::makeLive(std::shared_ptr<InitConnection> connection,
                                                      const store::EnvironmentRecord& record) const {
  auto layers = storedLayers(record, config_.defaultPermissions);
  // A record whose permissions cannot be read gates everything shut.
  std::vector<gate::Permissions> closed;
  if (!layers.ok()) {
    gate::Permissions none = gate::Permissions::defaults();
    for (gate::Scope scope : gate::kScopes) none.scope(scope).rules = {gate::Rule{}};
    closed.push_back(none);
  }
  std::map<std::string, std::string> env = record.env;
  if (record.netSlot >= 0) {
    for (auto& [k, v] : egress::Controller::environmentVariables(
             egress::EgressNetwork::linkFor(static_cast<uint32_t>(record.netSlot)))) {
      env.emplace(k, v);
    }
  }
  return Live{std::move(connection),
              std::move(env),
              record.ramMb,
              std::make_shared<ProcessTable>(config_.processLimits),
              record.expiresAtMs,
              std::make_shared<const std::vector<gate::Permissions>>(layers.ok() ? layers.value() : closed),
              record.owner};
}

Result<gate::Evaluation> EnvironmentManager::evaluate(const std::string& id, const gate::Action& action,
                                                      const gate::Permissions* ceiling) {
  MOAT_ASSIGN(Live live, liveOf(id));
  return gate::evaluate(*live.permissions, ceiling, action);
}

Result<std::vector<gate::Permissions>> EnvironmentManager::permissions(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(id);
    if (it != live_.end()) return *it->second.permissions;
  }
  MOAT_ASSIGN(auto record, get(id));
  return storedLayers(record, config_.defaultPermissions);
}

Status EnvironmentManager::storeLayers(const std::string& id, std::vector<gate::Permissions> layers) {
  MOAT_TRY(store_.setPermissions(id, layersText(layers)));
  std::shared_ptr<InitConnection> connection;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(id);
    if (it != live_.end()) {
      it->second.permissions = std::make_shared<const std::vector<gate::Permissions>>(std::move(layers));
      connection = it->second.connection;
    }
  }
  if (connection) sendExecPolicy(id, connection);  // the new layers may judge programs
  return {};
}

std::shared_ptr<InitConnection> EnvironmentManager::connect(const std::string& id, UniqueFd control) {
  InitConnection::ExecHooks hooks;
  hooks.check = [this, id](const init::ExecCheck& check, InitConnection::ExecAnswer answer) {
    ExecCheckHook gate;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gate = execCheck_;
    }
    if (gate) return gate(id, check, std::move(answer));
    answer(false);  // moatd is starting or stopping: nothing judges programs yet or any more
  };
  hooks.report = [this, id](const init::ExecReport& report) {
    ExecReportHook hook;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hook = execReport_;
      if (!hook) {
        // Re-attached at start, before the gate is set: kept for it.
        if (earlyReports_.size() < kEarlyReports) earlyReports_.emplace_back(id, report);
        return;
      }
    }
    hook(id, report);
  };
  auto connection = std::make_shared<InitConnection>(
      std::move(control), [this, id] { onInitGone(id); }, std::move(hooks));
  sendExecPolicy(id, connection);
  return connection;
}

void EnvironmentManager::sendExecPolicy(const std::string& id, const std::shared_ptr<InitConnection>& connection) {
  ExecPolicyHook policy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    policy = execPolicy_;
  }
  // Until the gate is set (re-attaching at start): nothing, so moat-init
  // goes on judging by the rules the previous moatd gave it (a new one
  // asks about every program until it is told).
  if (!policy) return;
  (void)connection->setExecPolicy(policy(id));
}

void EnvironmentManager::setExecGate(ExecCheckHook check, ExecPolicyHook policy, ExecReportHook report) {
  std::vector<std::pair<std::string, init::ExecReport>> early;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    execCheck_ = std::move(check);
    execPolicy_ = std::move(policy);
    execReport_ = report;
    early.swap(earlyReports_);
  }
  if (report) {
    for (const auto& [id, r] : early) report(id, r);
  }
}

void EnvironmentManager::refreshExecPolicies() {
  std::vector<std::pair<std::string, std::shared_ptr<InitConnection>>> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, live] : live_) all.emplace_back(id, live.connection);
  }
  for (auto& warm : pools_.connections()) all.push_back(std::move(warm));
  for (const auto& [id, connection] : all) sendExecPolicy(id, connection);
}

Status EnvironmentManager::setPermissions(const std::string& id, const gate::Permissions& p, bool replace) {
  constexpr size_t kMaxLayers = 16;
  std::lock_guard<std::mutex> serial(permissionsMutex_);
  MOAT_ASSIGN(Live live, liveOf(id));
  std::vector<gate::Permissions> layers = *live.permissions;
  if (replace) {
    layers = {p};
  } else {
    if (layers.size() >= kMaxLayers) {
      return Error::make(Code::kInvalidArgument, "permissions: at most " + std::to_string(kMaxLayers) +
                                                     " layers; the master can replace them with one");
    }
    layers.push_back(p);
  }
  return storeLayers(id, std::move(layers));
}

Status EnvironmentManager::rememberRule(const std::string& id, gate::Scope scope, const gate::Rule& rule,
                                        bool everyLayer) {
  std::lock_guard<std::mutex> serial(permissionsMutex_);
  MOAT_ASSIGN(Live live, liveOf(id));
  std::vector<gate::Permissions> layers = *live.permissions;
  for (size_t i = 0; i < (everyLayer ? layers.size() : 1); ++i) layers[i].prepend(scope, rule);
  return storeLayers(id, std::move(layers));
}

Result<EnvironmentManager::Live> EnvironmentManager::liveOf(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(id);
    if (it != live_.end()) return it->second;
  }
  MOAT_ASSIGN(auto record, get(id));
  return Error::make(Code::kConflict, "environment " + id + " is " + stateName(record.state) +
                                          (record.reason.empty() ? "" : " (" + record.reason + ")"));
}

namespace {

// The command's environment: the documented base set, the environment's
// own variables, then the request's.
std::vector<std::string> commandEnvironment(const std::string& id, const std::string& cwd,
                                            const std::map<std::string, std::string>& own,
                                            const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> merged = own;
  for (const auto& [k, v] : extra) merged[k] = v;
  std::vector<std::string> env = baseEnvironment(id, cwd);
  for (const auto& [k, v] : merged) {
    std::string prefix = k + "=";
    std::erase_if(env, [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
    env.push_back(prefix + v);
  }
  return env;
}

// Exec keeps everything up to its output limit; moat-init stops forwarding there.
constexpr uint64_t kExecOutputMax = 16u << 20;

}  // namespace

void EnvironmentManager::warmUp(const std::shared_ptr<InitConnection>& connection, const std::string& id) {
  // The first command in a new environment pays for cold lookups through its
  // fresh overlay (the dynamic loader, libc: ~1 ms here). A pool environment
  // pays them before it is claimed, so the claimer's first exec does not.
  auto process = std::make_shared<Process>(0, std::vector<std::string>{"/usr/bin/true"}, "exec", false, false, 4096);
  init::SpawnRequest spawn;
  spawn.argv = {"/usr/bin/true"};
  spawn.env = commandEnvironment(id, "/workspace", {}, {});
  spawn.cwd = "/workspace";
  spawn.timeoutMs = 5000;
  spawn.outputLimit = 4096;
  if (process->start(connection, spawn, "", false).ok()) {
    (void)process->waitEnded(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  }
}

Result<std::shared_ptr<Process>> EnvironmentManager::startProcess(const std::string& id,
                                                                  const ProcessRequest& request) {
  MOAT_ASSIGN(Live live, liveOf(id));
  MOAT_ASSIGN(auto process,
              live.processes->add(request.argv, request.kind, request.pty, request.stdinOpen || request.pty,
                                  live.processes->limits().outputCapPerStream));
  init::SpawnRequest spawn;
  spawn.argv = request.argv;
  spawn.env = commandEnvironment(id, request.cwd, live.env, request.env);
  if (request.pty &&
      std::none_of(spawn.env.begin(), spawn.env.end(), [](const std::string& e) { return e.rfind("TERM=", 0) == 0; })) {
    spawn.env.push_back("TERM=xterm-256color");
  }
  spawn.cwd = request.cwd;
  spawn.stdinPipe = request.stdinOpen;
  spawn.pty = request.pty;
  spawn.timeoutMs = request.timeoutMs;
  audit_.record("process.started", id, request.actor,
                {{"process", process->id()},
                 {"argv", request.argv},
                 {"kind", request.kind},
                 {"cwd", request.cwd},
                 {"pty", request.pty},
                 {"env", request.env}});
  process->onEnded([recorder = &audit_, id, actor = request.actor](const ProcessInfo& info) {
    recorder->record("process.ended", id, actor, endedData(info));
  });
  // A moat-init older than flow control (an environment started before an
  // upgrade) forwards everything: the process is an ordinary one there.
  if (request.lossless && live.connection->peerVersion() >= init::kFlowControlSince) {
    process->makeLossless();
    std::lock_guard<std::mutex> lock(mutex_);
    lossless_.push_back(process);  // the reaper lets it go once nobody follows it
  }
  Status started = process->start(live.connection, spawn, "", false);
  if (started.ok() && request.pty) (void)process->resize(request.rows, request.cols);
  ++execs_;
  if (!started.ok()) {
    process->abandon(started.error().message());  // its end is recorded
    return started.error();
  }
  return process;
}

Result<std::vector<std::shared_ptr<Process>>> EnvironmentManager::processes(const std::string& id) {
  MOAT_ASSIGN(Live live, liveOf(id));
  return live.processes->all();
}

Result<std::shared_ptr<Process>> EnvironmentManager::process(const std::string& id, uint64_t processId) {
  MOAT_ASSIGN(Live live, liveOf(id));
  auto process = live.processes->find(processId);
  if (!process) {
    return Error::make(Code::kNotFound, "no process " + std::to_string(processId) + " in environment " + id);
  }
  return process;
}

Result<std::shared_ptr<void>> EnvironmentManager::reserveExecOutput(const std::string& caller, uint64_t outputLimit) {
  const uint64_t limit = outputLimit ? std::min(outputLimit, kExecOutputMax) : kExecOutputMax;
  return execOutput_.reserve(caller, 2 * limit);  // two streams
}

Result<ExecResult> EnvironmentManager::exec(const std::string& id, const ExecRequest& request,
                                            const std::map<std::string, std::string>& env) {
  MOAT_ASSIGN(Live live, liveOf(id));
  uint64_t limit = request.outputLimit ? std::min(request.outputLimit, kExecOutputMax) : kExecOutputMax;
  MOAT_ASSIGN(auto process, live.processes->add(request.argv, "exec", false, false, limit));
  ScopeExit forget([&] { live.processes->remove(process->id()); });
  init::SpawnRequest spawn;
  spawn.argv = request.argv;
  spawn.env = commandEnvironment(id, request.cwd, live.env, env);
  spawn.cwd = request.cwd;
  spawn.stdinPipe = request.withStdin;
  spawn.timeoutMs = request.timeoutMs;
  spawn.outputLimit = limit;
  ++execs_;
  audit_.record("exec.started", id, request.actor, [&] {
    nlohmann::json data = {{"process", process->id()}, {"argv", request.argv}, {"cwd", request.cwd}, {"env", env}};
    if (!request.stdinEvent.is_null()) data["stdin"] = request.stdinEvent;  // what it was given to read
    return data;
  }());
  // Every way out below ends the process; its end is recorded then.
  process->onEnded([recorder = &audit_, id, actor = request.actor](const ProcessInfo& info) {
    recorder->record("exec.ended", id, actor, endedData(info));
  });
  traceStage("moatd: exec");
  Status started = process->start(live.connection, spawn, request.stdinData, request.withStdin);
  if (!started.ok()) {
    process->abandon(started.error().message());
    return started.error();
  }
  traceStage("moatd: exec sent");
  // moat-init enforces the timeout; the grace covers the kill and the report.
  auto deadline =
      std::chrono::steady_clock::now() + (request.timeoutMs ? std::chrono::milliseconds(request.timeoutMs + 10000)
                                                            : std::chrono::milliseconds(24LL * 3600 * 1000));
  if (!process->waitEnded(deadline)) {
    (void)process->signal(SIGKILL);  // nobody waits for it any more
    process->abandon("moat-init did not report the end of the command in time");
    return Error::make(Code::kTimeout, "moat-init did not report the end of the command in time");
  }
  traceStage("moatd: exec ended");
  ProcessInfo info = process->info();
  ExecResult r;
  if (info.state == ProcessState::kLost) return Error::make(Code::kGone, info.reason);
  if (info.state == ProcessState::kFailed) {
    r.spawnErrno = info.spawnErrno;
    r.spawnStage = info.spawnStage;
    return r;
  }
  r.started = true;
  r.exitCode = info.exitCode;
  r.signal = info.signal;
  r.timedOut = info.timedOut;
  r.durationUs = info.durationUs;
  r.out = process->take(OutputStream::kStdout);
  r.err = process->take(OutputStream::kStderr);
  r.outTruncated = info.stdoutTruncated || info.stdoutDropped > 0;
  r.errTruncated = info.stderrTruncated || info.stderrDropped > 0;
  return r;
}

Result<init::FileResult> EnvironmentManager::file(const std::string& id, const init::FileRequest& request) {
  MOAT_ASSIGN(Live live, liveOf(id));
  return live.connection->file(request);
}

Result<store::EnvironmentRecord> EnvironmentManager::setTtl(const std::string& id, int64_t ttlS) {
  MOAT_TRY(liveOf(id));
  int64_t expiresAtMs = nowMs() + ttlS * 1000;
  MOAT_TRY(store_.setExpiry(id, expiresAtMs));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = live_.find(id); it != live_.end()) it->second.expiresAtMs = expiresAtMs;
    nextExpiryMs_ = std::min(nextExpiryMs_, expiresAtMs);
  }
  reaperCv_.notify_all();
  return get(id);
}

Status EnvironmentManager::writeNetworkFiles(const std::shared_ptr<InitConnection>& connection,
                                             const egress::EgressNetwork::Link& link) {
  auto write = [&](const std::string& path, const std::string& data) -> Status {
    init::FileRequest w;
    w.op = init::FileOp::kWrite;
    w.path = path;
    w.data = data;
    w.mode = 0644;
    w.flags = init::kFileCreateParents;
    MOAT_ASSIGN(init::FileResult r, connection->file(w));
    if (r.err != 0) return Error::fromErrno("write " + path + " in the environment", r.err);
    return {};
  };
  const std::string& ca = egress_->caCertificatePem();
  // The environment's own bundle plus moatd's CA, for programs that only
  // read the system's (and for the variables that name ours).
  std::string bundle;
  init::FileRequest read;
  read.op = init::FileOp::kRead;
  read.path = "/etc/ssl/certs/ca-certificates.crt";
  read.length = 4 << 20;
  auto existing = connection->file(read);
  bool haveSystemBundle = existing.ok() && existing->err == 0;
  if (haveSystemBundle) bundle = existing->data;
  if (!bundle.empty() && bundle.back() != '\n') bundle += '\n';
  bundle += ca;
  MOAT_TRY(write(egress::Controller::kCaPath, ca));
  MOAT_TRY(write(egress::Controller::kCaBundlePath, bundle));
  if (haveSystemBundle) MOAT_TRY(write(read.path, bundle));
  std::string gateway = egress::formatIpv4(ntohl(link.gateway));
  MOAT_TRY(write("/etc/resolv.conf", "# moat: names are answered by moatd's resolver (docs/EGRESS.md)\nnameserver " +
                                         gateway + "\noptions timeout:2 attempts:2\n"));
  return {};
}

Status EnvironmentManager::connectNetwork(const std::string& id, const egress::Policy& policy,
                                          const std::vector<egress::Secret>& secrets) {
  if (!egress_) return Error::make(Code::kUnavailable, "egress control is not running in this moatd");
  MOAT_ASSIGN(Live live, liveOf(id));
  MOAT_ASSIGN(UniqueFd netns, backend_.networkNamespace(id));
  MOAT_ASSIGN(auto link, egress_->attach(id, netns.get(), policy, secrets));
  Status s = writeNetworkFiles(live.connection, link);
  if (s.ok()) s = store_.setNetwork(id, networkText(policy), link.slot);
  if (!s.ok()) {
    (void)egress_->detach(id);
    return s;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = live_.find(id); it != live_.end()) {
    for (auto& [k, v] : egress::Controller::environmentVariables(link)) it->second.env[k] = v;
  }
  return {};
}

Status EnvironmentManager::connectNetworkUnlessSet(const std::string& id, const egress::Policy& policy,
                                                   const std::vector<egress::Secret>& secrets) {
  std::lock_guard<std::mutex> serial(networkMutex_);
  // A PUT .../network that came between "running" and here has put its
  // policy in force: it is the later word.
  if (egress_ && egress_->slotOf(id)) return {};
  return connectNetwork(id, policy, secrets);
}

Result<egress::Policy> EnvironmentManager::network(const std::string& id) {
  MOAT_ASSIGN(auto record, get(id));
  return storedNetwork(record);
}

Status EnvironmentManager::setNetwork(const std::string& id, const egress::Policy& policy) {
  std::lock_guard<std::mutex> serial(networkMutex_);
  MOAT_TRY(liveOf(id));
  if (!egress_) {
    if (policy.mode == egress::Mode::kNone) return {};
    return Error::make(Code::kUnavailable,
                       "egress control is not running in this moatd: only mode \"none\" is available");
  }
  bool linked = egress_->slotOf(id).has_value();
  if (policy.mode == egress::Mode::kNone) {
    if (linked) MOAT_TRY(egress_->detach(id));
    MOAT_TRY(store_.setNetwork(id, networkText(policy), -1));
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = live_.find(id); it != live_.end()) {
      for (auto& [k, v] : egress::Controller::environmentVariables(egress::EgressNetwork::linkFor(0))) {
        it->second.env.erase(k);
      }
    }
    return {};
  }
  if (linked) {
    MOAT_TRY(egress_->setPolicy(id, policy));
    return store_.setNetwork(id, networkText(policy), *egress_->slotOf(id));
  }
  MOAT_ASSIGN(auto record, get(id));
  auto secrets = storedSecrets(record);
  return connectNetwork(id, policy, secrets.ok() ? secrets.value() : std::vector<egress::Secret>{});
}

ScopeExit<std::function<void()>> EnvironmentManager::exclusive(const std::string& id) {
  return operations_.exclusive(id);
}

Status EnvironmentManager::destroy(const std::string& id, const std::string& reason, const std::string& actor) {
  // One destroy per environment at a time; the one that waited finds it
  // gone. A single lock for all destroys made every DELETE queue behind the
  // others' spawner round trips: with 64 clients, 58 of them waited there
  // and a destroy took seconds (docs/BENCHMARKS.md, "Load").
  traceStage("moatd: destroy");
  auto held = exclusive(id);
  bool here;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    here = live_.count(id) || creatingIds_.count(id);
  }
  if (!here) {
    // Not running here: known (gone, failed: done already) or not at all.
    MOAT_ASSIGN(auto record, get(id));
    if (record.state == EnvironmentState::kGone || record.state == EnvironmentState::kFailed) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!live_.count(id)) return {};
    }
  }
  Live live;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (creatingIds_.count(id)) {
      // The backend is still creating it; create() destroys it when done.
      destroyRequested_.emplace(id, actor);
      (void)store_.setState(id, EnvironmentState::kDestroying, reason);
      return {};
    }
    auto it = live_.find(id);
    if (it != live_.end()) {
      live = std::move(it->second);
      live_.erase(it);
      capacity_.release(live.ramMb);
    }
  }
  bool failed = reason.rfind("failed", 0) == 0;
  // Whoever follows a process hears why it ends before the kill lands.
  if (live.processes) live.processes->close(endReason(reason));
  if (endedHook_) endedHook_(id, endReason(reason));
  // Stored before its link's slot is freed: a moatd killed after another
  // environment took the slot must not find two records naming it.
  (void)store_.setState(id, EnvironmentState::kDestroying, reason);
  if (egress_) egress_->forget(id);  // its link goes with its namespace
  traceStage("moatd: destroying stored");
  Status s = backend_.destroy(id);
  traceStage("moatd: spawner destroyed");
  live.connection.reset();  // joins its reader: moat-init is gone by now
  // A failed destroy stays "destroying": the next moatd start finishes it.
  if (s.ok()) {
    (void)store_.setState(id, failed ? EnvironmentState::kFailed : EnvironmentState::kGone, reason);
    traceStage("moatd: gone stored");
  }
  nlohmann::json data = {{"reason", reason}, {"state", failed ? "failed" : "gone"}};
  if (!s.ok()) {
    data["state"] = "destroying";
    data["error"] = s.error().message();
  }
  audit_.record("environment.destroyed", id, actor, std::move(data));
  return s;
}

void EnvironmentManager::destroyAll(const std::string& reason) {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, live] : live_) ids.push_back(id);
  }
  for (auto& r : pools_.takeAll()) {
    (void)backend_.destroy(r.id);
    r.connection.reset();
    capacity_.release(pools_.pools()[r.pool].ramMb);
  }
  for (const auto& id : ids) (void)destroy(id, reason);
}

void EnvironmentManager::reaperLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    reaperCv_.wait_for(lock, std::chrono::milliseconds(200));
    if (stopping_) break;
    // Expiry from memory, and only once one is due: a store read per
    // environment every 200 ms cost moatd ~10% of a core with 1,000 idle
    // environments, a scan of them all ~2%. Expired ones count towards the
    // next expiry too, so one still there (its destroy failed) is tried again.
    std::vector<std::string> expired;
    int64_t now = nowMs();
    if (now >= nextExpiryMs_) {
      nextExpiryMs_ = INT64_MAX;
      for (const auto& [id, live] : live_) {
        if (live.expiresAtMs <= now) expired.push_back(id);
        nextExpiryMs_ = std::min(nextExpiryMs_, live.expiresAtMs);
      }
    }
    std::vector<std::string> gone = std::move(initGone_);
    initGone_.clear();
    std::vector<std::weak_ptr<Process>> lossless = std::move(lossless_);
    lossless_.clear();
    lock.unlock();
    // A pool member that died is dropped and destroyed.
    for (const auto& id : gone) {
      if (auto dead = pools_.remove(id)) {
        (void)backend_.destroy(id);
        dead->connection.reset();
        capacity_.release(pools_.pools()[dead->pool].ramMb);
      }
    }
    poolCv_.notify_all();
    for (const auto& id : gone) {
      {
        std::lock_guard<std::mutex> relock(mutex_);
        // Being destroyed, snapshotted or restored: decided once that ends.
        if (operations_.held(id)) {
          initGone_.push_back(id);
          continue;
        }
        // A restore replaced the connection that went: this one is alive.
        auto it = live_.find(id);
        if (it != live_.end() && it->second.connection && !it->second.connection->closed()) continue;
      }
      auto record = store_.getEnvironment(id);
      if (record.ok() && record.value() && record.value()->state == EnvironmentState::kRunning) {
        (void)destroy(id, "failed: pid 1 of the environment exited");
      }
    }
    for (const auto& id : expired) (void)destroy(id, "expired");
    // Lossless processes nobody follows any more go back to dropping.
    const auto wait = std::chrono::milliseconds(config_.processLimits.losslessWaitMs);
    const auto checked = std::chrono::steady_clock::now();  // after the destroys above
    std::erase_if(lossless, [&](const std::weak_ptr<Process>& weak) {
      auto process = weak.lock();
      return !process || !process->releaseIfUnfollowed(checked, wait);
    });
    lock.lock();
    lossless_.insert(lossless_.end(), lossless.begin(), lossless.end());
  }
}

Counters EnvironmentManager::counters() {
  Counters c;
  c.execs = execs_;
  c.warmPools = pools_.counts();
  for (const auto& p : c.warmPools) c.warmReady += p.ready;
  c.warmClaims = pools_.claims();
  auto all = store_.listEnvironments(store::EnvironmentFilter{});  // every state but gone
  if (all.ok()) {
    for (const auto& r : all.value()) ++c.byState[stateName(r.state)];
  }
  return c;
}

}  // namespace moat::manager
