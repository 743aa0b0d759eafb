#include "manager/environment_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "common/log.h"
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
    if (!p.isolation) p.isolation = config.defaultIsolation;
    auto same = std::find_if(pools.begin(), pools.end(), [&](const WarmPool& q) {
      return q.keeps(p.templateName, p.cpus, p.ramMb, p.storageGb, p.pids, *p.isolation);
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

void EnvironmentManager::stopThreads() {
  markStopping();
  joinThreads();
}

void EnvironmentManager::markStopping() {
  {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    stopping_ = true;
  }
  reaperCv_.notify_all();
  poolCv_.notify_all();
}

void EnvironmentManager::joinThreads() {
  if (reaper_.joinable()) reaper_.join();
  if (pooler_.joinable()) pooler_.join();
  std::unique_lock<std::mutex> lock(threadsMutex_);
  asideCv_.wait(lock, [&] { return asideWorkers_ == 0; });
}

EnvironmentManager::~EnvironmentManager() {
  stopThreads();
  if (!detached_) destroyAll("moatd stopped");
  // Detached: dropping the connections leaves moat-init running; the backend
  // hands a new connection to the next moatd. Dropped here, while every member
  // their reader threads touch (onInitGone) still exists.
  std::vector<ReadyEnvironment> pool = pools_.takeAll();
  live_.takeAll().clear();
  pool.clear();
}

void EnvironmentManager::interrupt() {
  markStopping();
  // Closed first: a pause at expiry waiting on a guest's answer ends now.
  auto connections = live_.connections();
  for (auto& warm : pools_.connections()) connections.push_back(std::move(warm));
  for (auto& [id, c] : connections) c->close("moatd is shutting down");
  joinThreads();
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
      moat::log::warnf("listing the egress links: %s (adopting them as the store says)\n",
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
    // Checkpointed to disk (docs/PAUSE.md, "To disk"): nothing runs to
    // attach to; its connection waits for the resume. The backend's word
    // is the truth (a moatd that died between its checkpoint or restore
    // and the store's record left the record behind): the record follows.
    const bool onDisk = r.state == EnvironmentState::kPaused && backend_.checkpointed(r.id);
    // A guest in RAM whose record says disk was being brought back (for
    // reads, or by a resume the moatd before did not finish): it goes back
    // to disk in a while, as one brought back for reads does.
    const bool untilIdle = !onDisk && (r.backToDisk || r.pausedToDisk);
    if (r.state == EnvironmentState::kPaused && onDisk != r.pausedToDisk) {
      (void)store_.setPausedMemory(r.id, onDisk ? store::PausedMemory::kDisk : store::PausedMemory::kRamUntilIdle);
    }
    if (r.state == EnvironmentState::kPaused && untilIdle) putOffBackToDisk(r.id);
    auto control = onDisk ? Result<UniqueFd>(UniqueFd()) : backend_.attach(r.id);
    if (!control.ok()) {
      (void)backend_.destroy(r.id);
      const std::string reason = "re-attach after a moatd restart failed: " + control.error().message();
      (void)store_.setState(r.id, EnvironmentState::kFailed, reason);
      audit_.record("environment.destroyed", r.id, "moatd", {{"reason", reason}, {"state", "failed"}});
      continue;
    }
    std::string id = r.id;
    auto connection = connect(id, std::move(control.value()), onDisk ? checkpointedWhy(id) : "");
    // Counted before it is live: the reaper (running already) may destroy
    // it at once, and its release must find it counted.
    capacity_.count(r.ramMb);
    // What the store says of a pause holds: it is paused again (a moatd
    // that died between the record and the freezer left it running; the
    // store never says running over frozen processes: pause.cc). One that
    // cannot be paused again runs, and its record says so: never "paused"
    // over processes that run.
    store::EnvironmentRecord adopted = r;
    if (r.state == EnvironmentState::kPaused && !onDisk) {
      if (Status held = holdProcesses(r, connection, true); !held.ok()) {
        const int64_t left = expiryAfterPause(r, nowMs());
        adopted.state = EnvironmentState::kRunning;
        adopted.pausedAtMs = 0;
        adopted.expiresAtMs = left;
        (void)store_.setPause(id, EnvironmentState::kRunning, 0, left);
        audit_.record(
            "environment.resumed", id, "moatd",
            {{"reason", "its pause could not be put in force again after a moatd restart: " + held.error().message()}});
      }
    } else if (!onDisk && r.isolation == backend::isolationName(backend::Isolation::kMicroVm)) {
      // A moatd that died while it held a guest's commands still (a memory
      // fork's source, or a copy not yet let go) leaves them frozen under a
      // record that says running: they go on (a thaw of what runs is
      // nothing).
      (void)holdProcesses(r, connection, false);
    }
    live_.put(id, makeLive(connection, adopted));
    if (adopted.state != EnvironmentState::kRunning && adopted.state != EnvironmentState::kPaused) {
      (void)store_.setState(id, EnvironmentState::kRunning, "");
    }
    auto stored = storedNetwork(r);
    const bool wantsLink = stored.ok() && stored->mode != egress::Mode::kNone;
    if (egress_ && r.netSlot >= 0 && (!linked || linked->count(static_cast<uint32_t>(r.netSlot))) &&
        named[r.netSlot] == 1) {
      auto secrets = storedSecrets(r);
      // A policy that cannot be read any more adopts the link shut.
      egress_->adopt(id, static_cast<uint32_t>(r.netSlot), stored.ok() ? stored.value() : egress::Policy{},
                     secrets.ok() ? secrets.value() : std::vector<egress::Secret>{});
    } else if (egress_ && (r.netSlot >= 0 || wantsLink) && !onDisk) {  // on disk: linked by its resume
      relink.push_back(id);                                            // once the links nobody holds are gone, below
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

void EnvironmentManager::detach() {
  std::lock_guard<std::mutex> lock(threadsMutex_);
  detached_ = true;
}

backend::Spec EnvironmentManager::specFor(const std::string& templateName, double cpus, uint64_t ramMb,
                                          double storageGb, uint64_t pids, backend::Isolation isolation) const {
  backend::Spec spec;
  spec.isolation = isolation;
  spec.templateName = templateName;
  spec.cpus = cpus;
  spec.memoryMb = ramMb;
  spec.pids = pids;
  spec.storageGb = storageGb;
  return spec;
}

Status EnvironmentManager::microVmCreatable(const store::EnvironmentRecord& record) const {
  if (!config_.microvmMissing.empty()) {
    return Error::make(Code::kUnsupported,
                       "spec.isolation: microvm is not available on this host: " + config_.microvmMissing);
  }
  if (record.templateName == "host") {
    return Error::make(Code::kUnsupported,
                       "template: isolation microvm needs a root file system, an imported template or a directory "
                       "(the host's own tree is not made into an image; docs/MICROVM.md)");
  }
  if (record.storageGb > static_cast<double>(backend::kMicroVmMaxStorageGb)) {
    return Error::make(Code::kInvalidArgument, "spec.storage_gb: a microVM's disk holds at most " +
                                                   std::to_string(backend::kMicroVmMaxStorageGb) + " GB");
  }
  if (record.ramMb < backend::kMicroVmMinMemoryMb) {
    return Error::make(Code::kInvalidArgument, "spec.ram_mb: a microVM needs at least " +
                                                   std::to_string(backend::kMicroVmMinMemoryMb) +
                                                   " MB (its kernel's own)");
  }
  return {};
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
  // A named template's: held until the record is stored (a deletion waits),
  // its variables under the request's own.
  std::shared_ptr<void> templateHeld;
  auto useTemplate = [&]() -> Status {
    if (!templates_.defaults) return {};
    if (templates_.hold) templateHeld = templates_.hold(record.templateName);
    MOAT_ASSIGN(TemplateDefaults defaults, templates_.defaults(record.templateName));
    for (const auto& [k, v] : defaults.env) record.env.emplace(k, v);
    return {};
  };
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
  // A built template (docs/TEMPLATES.md, "Recipes"): a fork of its
  // snapshot, on its base; the template held until the record is stored.
  std::string fromSnapshot = request.fromSnapshot;
  std::string snapshotOwner = request.snapshotOwner;
  std::shared_ptr<void> builtHeld;
  if (fromSnapshot.empty() && templates_.defaults) {
    if (templates_.hold) builtHeld = templates_.hold(record.templateName);
    MOAT_ASSIGN(TemplateDefaults built, templates_.defaults(record.templateName));
    fromSnapshot = built.snapshot;
    snapshotOwner = built.snapshotOwner;
  }
  auto snapshotHeld = holdSnapshot(fromSnapshot);  // until the backend has copied it
  if (!fromSnapshot.empty()) {
    MOAT_ASSIGN(auto snap, usableSnapshot(fromSnapshot, request.forkedFrom));
    if (!snapshotOwner.empty() ? snap.owner != snapshotOwner
                               : request.owner != "master" && snap.owner != request.owner) {
      return Error::make(Code::kNotFound, "no snapshot " + fromSnapshot);
    }
    record.templateName = snap.templateName;
    if (request.storageGb <= 0) record.storageGb = snap.storageGb;
    from = std::move(snap);
  }
  // One from a snapshot (a fork, a restore, a built template) is what the
  // snapshot holds: a namespace environment's files or a microVM's disk.
  backend::Isolation isolation = request.isolation.value_or(config_.defaultIsolation);
  if (from) {
    const auto held = backend::isolationNamed(from->isolation).value_or(backend::Isolation::kNamespaces);
    if (request.isolation && *request.isolation != held) {
      if (request.fromSnapshot.empty()) {  // a built template's
        return Error::make(Code::kInvalidArgument, "spec.isolation: template " + request.templateName +
                                                       " was built on " + from->isolation +
                                                       " environments, and its environments are too");
      }
      return Error::make(Code::kInvalidArgument,
                         "spec.isolation: snapshot " + from->id + " is of a " + from->isolation +
                             " environment, so is an environment made from it (docs/MICROVM.md, \"Storage and "
                             "snapshots\")");
    }
    if (held == backend::Isolation::kMicroVm && request.storageGb > 0 && request.storageGb != from->storageGb) {
      return Error::make(Code::kInvalidArgument,
                         "spec.storage_gb: an environment made from a microVM's snapshot "
                         "has the snapshot's disk (" +
                             nlohmann::json(from->storageGb).dump() + " GB)");
    }
    isolation = held;
  }
  record.isolation = backend::isolationName(isolation);
  if (request.onExpiry == store::ExpiryAction::kCheckpoint && isolation != backend::Isolation::kMicroVm) {
    return Error::make(Code::kUnsupported,
                       "on_expiry: \"checkpoint\" needs a microvm environment (a namespace environment cannot be "
                       "checkpointed to disk yet: docs/PAUSE.md, \"To disk\")");
  }
  if (isolation == backend::Isolation::kMicroVm) {
    MOAT_TRY(microVmCreatable(record));
    record.accel = config_.microvmAccel;
  }
  MOAT_TRY(useTemplate());
  record.state = EnvironmentState::kCreating;
  record.createdAtMs = nowMs();
  int64_t ttl = request.ttlS > 0 ? request.ttlS : config_.defaultTtlS;
  record.expiresAtMs = record.createdAtMs + ttl * 1000;
  record.ttlRunsWhilePaused = request.ttlRunsWhilePaused;
  record.onExpiry = request.onExpiry;
  record.ttlS = ttl;
  // A warm environment of exactly this template, spec and isolation: a claim.
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
      live_.put(record.id, makeLive(ready.connection, record));
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
  live_.beginCreate(record.id);
  // It will not run: its place and memory go back.
  auto release = [&] {
    live_.abandonCreate(record.id);
    capacity_.release(record.ramMb);
  };
  // It failed once stored (its backend's part undone): its place and
  // memory go back, and its record and the audit say why.
  auto failed = [&](const Error& error) {
    release();
    (void)store_.setState(record.id, EnvironmentState::kFailed, error.message());
    nlohmann::json data = createdData(record, false);
    data["error"] = error.message();
    audit_.record("environment.failed", record.id, record.owner, std::move(data));
    return error;
  };
  traceStage("moatd: create");
  Status stored = store_.insertEnvironment(record);
  if (!stored.ok()) {
    release();
    return stored.error();
  }
  traceStage("moatd: inserted");
  auto spec = specFor(record.templateName, record.cpus, record.ramMb, record.storageGb, record.pids, isolation);
  spec.id = record.id;
  if (from) {
    spec.fromSnapshot = from->id;
    spec.snapshotHostBase = from->hostBase;
    spec.withMemory = request.withMemory;
  }
  auto created = backend_.create(spec);
  snapshotHeld.run();
  traceStage("moatd: spawner answered");
  if (!created.ok()) {
    // The backend may have made it and failed only to hand it over (its
    // descriptor lost at moatd's limit): nothing of it may stay running.
    (void)backend_.destroy(record.id);
    // As the success path: a DELETE's "destroying" is not written over.
    auto failedHeld = exclusive(record.id);
    const std::string destroyedBy = live_.destroyRequestedBy(record.id);
    release();
    if (!destroyedBy.empty()) {
      // A DELETE ended it while it was being made (a microVM's boot).
      (void)store_.setState(record.id, EnvironmentState::kGone, "destroyed");
      audit_.record("environment.created", record.id, record.owner, createdData(record, false));
      audit_.record("environment.destroyed", record.id, destroyedBy, {{"reason", "destroyed"}, {"state", "gone"}});
      return Error::make(Code::kConflict, "environment " + record.id + " was destroyed while being created");
    }
    return failed(created.error());
  }
  std::string id = record.id;
  // From here until "running" is stored, a DELETE waits (and then finds the
  // environment live), or it came before and is honoured below. Checked and
  // made live in two steps, a DELETE between them was answered 204 and lost.
  auto held = exclusive(id);
  const std::string destroyedBy = live_.destroyRequestedBy(id);
  if (!destroyedBy.empty()) {
    // A DELETE came while the backend was creating it: honour it now.
    (void)backend_.destroy(id);
    release();
    (void)store_.setState(id, EnvironmentState::kGone, "destroyed");
    audit_.record("environment.created", id, record.owner, createdData(record, false));
    audit_.record("environment.destroyed", id, destroyedBy, {{"reason", "destroyed"}, {"state", "gone"}});
    return Error::make(Code::kConflict, "environment " + id + " was destroyed while being created");
  }
  // A memory fork's processes run on in it: its own copies of them.
  std::vector<std::shared_ptr<Process>> adopted;
  for (const auto& process : request.processes) adopted.push_back(process->forkedCopy());
  auto connection = connect(id, std::move(created->control), "", adopted);
  if (request.withMemory) {
    // A memory fork's copy takes a fresh identity (its own name, its random
    // generator reseeded) before anyone can reach it: copies that drew the
    // same numbers would share secrets. Its commands stay still until the
    // fork lets every copy go (fork()).
    if (Status renewed = setGuestClock(id, connection, id); !renewed.ok()) {
      connection->close("failed: " + renewed.error().message());
      (void)backend_.destroy(id);
      return failed(renewed.error());
    }
  }
  LiveEnvironment live = makeLive(connection, record);
  for (const auto& process : adopted) adoptProcess(live, id, record.owner, process);
  live_.put(id, std::move(live));
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

Result<store::EnvironmentRecord> EnvironmentManager::get(const std::string& id) {
  MOAT_ASSIGN(auto record, store_.getEnvironment(id));
  if (!record) return Error::make(Code::kNotFound, "no environment " + id);
  return record.value();
}

std::string EnvironmentManager::ownerOf(const std::string& id) {
  if (auto live = live_.find(id)) return live->owner;
  auto record = get(id);
  return record.ok() ? record->owner : std::string();
}

std::map<std::string, std::string> EnvironmentManager::envOf(const std::string& id) {
  auto live = live_.find(id);
  return live ? std::move(live->env) : std::map<std::string, std::string>{};
}

Result<std::vector<store::EnvironmentRecord>> EnvironmentManager::list(const store::EnvironmentFilter& filter) {
  return store_.listEnvironments(filter);
}

LiveEnvironment EnvironmentManager::makeLive(std::shared_ptr<InitConnection> connection,
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
  LiveEnvironment live{std::move(connection),
                       std::move(env),
                       record.ramMb,
                       std::make_shared<ProcessTable>(config_.processLimits),
                       record.expiresAtMs,
                       std::make_shared<const std::vector<gate::Permissions>>(layers.ok() ? layers.value() : closed),
                       record.owner};
  live.paused = record.state == EnvironmentState::kPaused;
  if (live.paused && !record.ttlRunsWhilePaused) live.expiresAtMs = kNoExpiry;
  live.microVm = record.isolation == backend::isolationName(backend::Isolation::kMicroVm);
  if (templates_.defaults) {
    // A template in use cannot be deleted, so its defaults stay what they were.
    auto defaults = templates_.defaults(record.templateName);
    if (defaults.ok()) {
      if (!defaults->cwd.empty()) live.cwd = defaults->cwd;
      live.uid = defaults->uid;
      live.gid = defaults->gid;
    }
  }
  return live;
}

std::shared_ptr<InitConnection> EnvironmentManager::connect(const std::string& id, UniqueFd control,
                                                            const std::string& suspendedWhy,
                                                            const std::vector<std::shared_ptr<Process>>& adopted) {
  InitConnection::ExecHooks hooks;
  hooks.check = [this, id](const init::ExecCheck& check, InitConnection::ExecAnswer answer) {
    ExecCheckHook gate;
    {
      std::lock_guard<std::mutex> lock(hooksMutex_);
      gate = execCheck_;
    }
    if (gate) return gate(id, check, std::move(answer));
    answer(false);  // moatd is starting or stopping: nothing judges programs yet or any more
  };
  hooks.report = [this, id](const init::ExecReport& report) {
    ExecReportHook hook;
    {
      std::lock_guard<std::mutex> lock(hooksMutex_);
      hook = execReport_;
      if (!hook) {
        // Re-attached at start, before the gate is set: kept for it.
        if (earlyReports_.size() < kEarlyReports) earlyReports_.emplace_back(id, report);
        return;
      }
    }
    hook(id, report);
  };
  std::map<uint32_t, std::shared_ptr<ProcessSink>> sinks;
  for (const auto& process : adopted) sinks[process->initId()] = process;
  auto connection = std::make_shared<InitConnection>(
      std::move(control), [this, id] { onInitGone(id); }, std::move(hooks), suspendedWhy, std::move(sinks));
  for (const auto& process : adopted) process->adopt(connection);
  if (suspendedWhy.empty()) sendExecPolicy(id, connection);  // else once it is back
  return connection;
}

void EnvironmentManager::sendExecPolicy(const std::string& id, const std::shared_ptr<InitConnection>& connection) {
  ExecPolicyHook policy;
  {
    std::lock_guard<std::mutex> lock(hooksMutex_);
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
    std::lock_guard<std::mutex> lock(hooksMutex_);
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
  auto all = live_.connections();
  for (auto& warm : pools_.connections()) all.push_back(std::move(warm));
  for (const auto& [id, connection] : all) sendExecPolicy(id, connection);
}

Result<LiveEnvironment> EnvironmentManager::liveOf(const std::string& id) {
  if (auto live = live_.find(id)) return std::move(*live);
  MOAT_ASSIGN(auto record, get(id));
  return Error::make(Code::kConflict, "environment " + id + " is " + stateName(record.state) +
                                          (record.reason.empty() ? "" : " (" + record.reason + ")"));
}

Result<store::EnvironmentRecord> EnvironmentManager::setTtl(const std::string& id, int64_t ttlS) {
  auto held = exclusive(id);  // not across a pause or a resume
  MOAT_TRY(liveOf(id));
  MOAT_ASSIGN(auto record, get(id));
  // Paused with its time stopped: the new time counts from the resume
  // (which adds the pause's length to what is stored).
  const bool stopped = record.state == EnvironmentState::kPaused && !record.ttlRunsWhilePaused;
  int64_t expiresAtMs = (stopped ? record.pausedAtMs : nowMs()) + ttlS * 1000;
  MOAT_TRY(store_.setExpiry(id, expiresAtMs, ttlS));
  if (!stopped) live_.setExpiry(id, expiresAtMs);
  reaperCv_.notify_all();
  return get(id);
}

Result<backend::Usage> EnvironmentManager::usage(const std::string& id) {
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  auto usage = backend_.usage(id);
  if (usage.ok() && live.microVm && !live.connection->suspended() &&
      live.connection->peerVersion() >= init::kGuestCgroupSince) {
    // QEMU's cgroup holds QEMU's threads; the guest's own count its tasks.
    init::FileRequest tasks;
    tasks.op = init::FileOp::kTasks;
    tasks.path = "/";
    auto counted = live.connection->file(tasks);
    if (counted.ok() && counted->err == 0) usage->pids = std::strtoull(counted->data.c_str(), nullptr, 10);
  }
  if (usage.ok() && egress_) {
    auto carried = egress_->networkCounters(id);
    usage->networkKnown = carried.ok();
    if (carried.ok()) {
      usage->networkSentBytes = carried->sentBytes;
      usage->networkReceivedBytes = carried->receivedBytes;
    }
  }
  if (usage.ok() || usage.error().code != Code::kNotFound) return usage;
  // Gone between the two looks: say what it is now; still here, it is
  // between a restore's destroy and create.
  MOAT_TRY(liveOf(id));
  return Error::make(Code::kConflict, "environment " + id + " is being restored; ask again");
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
  if (!live_.runsOrIsBeingCreated(id)) {
    // Not running here: known (gone, failed: done already) or not at all.
    MOAT_ASSIGN(auto record, get(id));
    if (record.state == EnvironmentState::kGone || record.state == EnvironmentState::kFailed) {
      if (!live_.runs(id)) return {};
    }
  }
  LiveEnvironment live;
  switch (live_.takeForDestroy(id, actor, live)) {
    case LiveTable::Destroy::kRequested: {
      // The backend is still creating it; create() destroys it when done.
      (void)store_.setState(id, EnvironmentState::kDestroying, reason);
      // A microVM boots for seconds: it ends now, and its create with it.
      auto record = get(id);
      if (record.ok() && record->isolation == backend::isolationName(backend::Isolation::kMicroVm)) {
        (void)backend_.destroy(id);
      }
      return {};
    }
    case LiveTable::Destroy::kTaken:
      capacity_.release(live.ramMb);
      break;
    case LiveTable::Destroy::kAbsent:
      break;
  }
  bool failed = reason.rfind("failed", 0) == 0;
  // Whoever follows a process hears why it ends before the kill lands.
  if (live.processes) live.processes->close(endReason(reason));
  ended(id, endReason(reason));
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
  std::vector<std::string> ids = live_.ids();
  for (auto& r : pools_.takeAll()) {
    (void)backend_.destroy(r.id);
    r.connection.reset();
    capacity_.release(pools_.pools()[r.pool].ramMb);
  }
  for (const auto& id : ids) (void)destroy(id, reason);
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

void EnvironmentManager::ended(const std::string& id, const std::string& reason) {
  std::function<void(const std::string&, const std::string&)> hook;
  {
    std::lock_guard<std::mutex> lock(hooksMutex_);
    hook = endedHook_;
  }
  if (hook) hook(id, reason);
}

}  // namespace moat::manager
