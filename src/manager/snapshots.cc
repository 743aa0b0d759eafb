// Snapshots, forks and restores of environments' writable layers: the
// EnvironmentManager's part, their records and holds (the backend keeps
// the files; docs/API.md, "Snapshots").
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/hex.h"
#include "common/log.h"
#include "init/changes_wire.h"
#include "manager/environment_manager.h"
#include "manager/stored_settings.h"

namespace moat::manager {

namespace {

std::string newSnapshotId() {
  auto hex = randomHex(6);
  return "snap-" + (hex.ok() ? hex.value() : std::string(12, '0'));
}

nlohmann::json snapshotData(const store::SnapshotRecord& s) { return {{"snapshot", s.id}, {"name", s.name}}; }

}  // namespace

Result<store::SnapshotRecord> EnvironmentManager::snapshot(const std::string& id, const std::string& name,
                                                           const std::string& actor) {
  return takeSnapshot(id, name, actor, false);
}

Result<store::SnapshotRecord> EnvironmentManager::snapshotOwnedBy(const std::string& id, const std::string& owner,
                                                                  const std::string& name, const std::string& actor) {
  if (owner.empty()) return Error::make(Code::kInvalidArgument, "a snapshot's owner is required");
  return takeSnapshot(id, name, actor, false, owner);
}

Result<store::SnapshotRecord> EnvironmentManager::takeSnapshot(const std::string& id, const std::string& name,
                                                               const std::string& actor, bool transient,
                                                               const std::string& owner,
                                                               std::vector<std::shared_ptr<Process>>* memory) {
  auto held = exclusive(id);
  MOAT_ASSIGN(auto record, get(id));
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));  // running: its volume is there
  if (!owner.empty()) record.owner = owner;
  MOAT_ASSIGN(auto mine, store_.listSnapshots(record.owner, ""));
  if (!transient && mine.size() >= config_.maxSnapshotsPerOwner) {
    return Error::make(Code::kCapacity, "at capacity: " + std::to_string(mine.size()) +
                                            " snapshots are kept (at most " +
                                            std::to_string(config_.maxSnapshotsPerOwner) + "); delete some first");
  }
  if (memory) {
    // Refused before anything is stored, by name.
    if (record.isolation != backend::isolationName(backend::Isolation::kMicroVm)) {
      return backend_.snapshotWithMemory(id, "").error();
    }
    if (record.pausedToDisk) return Error::make(Code::kConflict, checkpointedWhy(id));
    if (live.connection->peerVersion() < init::kQuietEndSince) {
      return Error::make(Code::kUnsupported, "environment " + id +
                                                 "'s guest runs a moat-init older than forks with memory (it was "
                                                 "started by an earlier moatd): fork it without memory");
    }
  } else if (record.isolation != backend::isolationName(backend::Isolation::kNamespaces)) {
    // What a microVM's programs wrote and its kernel holds in memory goes
    // to its disk first: the snapshot has every write that returned, as a
    // namespace environment's does.
    init::FileRequest sync;
    sync.op = init::FileOp::kSync;
    sync.path = "/";
    MOAT_ASSIGN(init::FileResult synced, live.connection->file(sync));
    if (synced.err != 0) {
      return Error::make(Code::kUnavailable,
                         "environment " + id + " could not write its files to its disk: " + synced.message);
    }
  }
  store::SnapshotRecord snap;
  snap.id = newSnapshotId();
  snap.environment = id;
  snap.owner = record.owner;
  snap.templateName = record.templateName;
  snap.storageGb = record.storageGb;
  snap.isolation = record.isolation;
  snap.name = name;
  snap.state = SnapshotState::kCreating;
  snap.createdAtMs = nowMs();
  // Recorded first: a moatd killed before the snapshot is finished leaves a
  // record the next one finds and rolls back (recoverSnapshots).
  MOAT_TRY(store_.insertSnapshot(snap));
  auto base = memory ? snapshotWithMemory(record, live, snap.id, *memory) : backend_.snapshot(id, snap.id);
  if (!base.ok()) {
    // Whatever of it was made (a microVM's volume copied, its guest then
    // not let go on) goes too.
    (void)backend_.deleteSnapshot(snap.id);
    (void)store_.deleteSnapshot(snap.id);
    return base.error();
  }
  snap.hostBase = base.value();
  snap.state = transient ? SnapshotState::kTransient : SnapshotState::kReady;
  Status stored = store_.setSnapshotState(snap.id, snap.state, snap.hostBase);
  if (!stored.ok()) {
    (void)backend_.deleteSnapshot(snap.id);
    (void)store_.deleteSnapshot(snap.id);
    return stored.error();
  }
  if (!transient) audit_.record("snapshot.created", id, actor, snapshotData(snap));
  return snap;
}

Result<uint32_t> EnvironmentManager::snapshotWithMemory(const store::EnvironmentRecord& record,
                                                        const LiveEnvironment& live, const std::string& snapshotId,
                                                        std::vector<std::shared_ptr<Process>>& processes) {
  const std::string& id = record.id;
  auto quiet = starts_.exclusive(id);  // no command half started
  // Its commands stop (a paused one's are), then moat-init has said all it
  // had to say (the barrier's answer, file op quiesce) and says nothing more
  // until it is told: the processes as moatd knows them are as the saved
  // moat-init knows them.
  const bool paused = live.paused;
  if (!paused) MOAT_TRY(holdProcesses(record, live.connection, true));
  auto goOn = [&] {
    if (paused) {
      endGuestQuiet(id, live.connection);
    } else if (Status resumed = holdProcesses(record, live.connection, false); !resumed.ok()) {
      moat::log::warnf("environment %s's processes did not go on after a memory fork: %s\n", id.c_str(),
                       resumed.error().message().c_str());
    }
  };
  if (Status suspended = suspendQuiet(live.connection,
                                      "environment " + id + " is being forked with its memory: try again in a moment");
      !suspended.ok()) {
    goOn();
    return suspended.error();
  }
  processes.clear();
  for (const auto& process : live.processes->all()) {
    if (process->info().state == ProcessState::kRunning) processes.push_back(process->forkedCopy());
  }
  auto base = backend_.snapshotWithMemory(id, snapshotId);
  live.connection->endSuspension();
  goOn();
  return base;
}

Result<backend::Changes> EnvironmentManager::changes(const std::string& id, const std::string& snapshotId,
                                                     const isolation::fs::LayerChangeLimits& limits) {
  // A microVM on disk is brought back for the review, which links it again:
  // networkMutex_ first, as everywhere.
  std::unique_lock<std::mutex> serial(networkMutex_, std::defer_lock);
  if (auto peek = get(id); peek.ok() && peek->pausedToDisk) serial.lock();
  // As a snapshot does: no restore swaps the files while they are read, and
  // the snapshot compared with stays.
  auto held = exclusive(id);
  auto using_ = holdSnapshot(snapshotId);
  MOAT_ASSIGN(auto record, get(id));
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));  // running: its volume is there
  if (record.isolation == backend::isolationName(backend::Isolation::kMicroVm)) {
    return guestChanges(record, live, snapshotId, limits);
  }
  backend::ChangesRequest request;
  request.id = id;
  request.templateName = record.templateName;
  request.limits = limits;
  if (!snapshotId.empty()) {
    MOAT_ASSIGN(auto snap, usableSnapshot(snapshotId, ""));
    if (snap.isolation != record.isolation) {
      return Error::make(Code::kInvalidArgument, "snapshot " + snapshotId + " is of a " + snap.isolation +
                                                     " environment, this one is " + record.isolation);
    }
    if (snap.templateName != record.templateName) {
      return Error::make(Code::kInvalidArgument, "snapshot " + snapshotId + " is of template '" + snap.templateName +
                                                     "', the environment's is '" + record.templateName + "'");
    }
    request.snapshot = snap.id;
  }
  return backend_.changes(request);
}

Result<backend::Changes> EnvironmentManager::guestChanges(const store::EnvironmentRecord& record,
                                                          const LiveEnvironment& live, const std::string& snapshotId,
                                                          const isolation::fs::LayerChangeLimits& limits) {
  const std::string& id = record.id;
  if (!snapshotId.empty()) {
    // Its snapshot's disk is a file no guest has mounted, and moatd mounts
    // no guest's file system.
    return Error::make(Code::kUnsupported, "a microvm environment's changes are against its template only (" +
                                               snapshotId + " is a disk no guest reads)");
  }
  if (record.state == EnvironmentState::kPaused) {
    // Its memory may be on disk: a review reads its files (pause.cc). First:
    // a connection a restart found on disk knows no version until then.
    MOAT_TRY(backForReadsHeld(record, live));
    if (record.backToDisk) putOffBackToDisk(id);
  }
  if (live.connection->peerVersion() < init::kGuestChangesSince) {
    return Error::make(Code::kUnsupported, "environment " + id +
                                               "'s guest runs a moat-init older than reviews of changes (it was "
                                               "started by an earlier moatd)");
  }
  // The guest walks its own overlay; what moat-init made in its root for
  // every guest is no change of its.
  isolation::fs::LayerChangeLimits asked = limits;
  for (const char* dir : {"/proc", "/sys", "/dev", "/tmp", "/workspace"}) asked.baseline[dir] = "/";
  init::FileRequest request;
  request.op = init::FileOp::kChanges;
  request.path = "/";
  request.data = init::encodeChangeLimits(asked);
  MOAT_ASSIGN(init::FileResult answer, live.connection->file(request));
  if (answer.err != 0) {
    return Error::make(Code::kUnavailable,
                       "environment " + id + "'s guest could not list its changes: " + answer.message);
  }
  auto changes = init::decodeChanges(answer.data, asked.maxChanges);
  if (!changes.ok()) {
    return Error::make(Code::kUnavailable, "environment " + id + "'s guest answered with a list moatd cannot read: " +
                                               changes.error().message());
  }
  return changes;
}

Result<std::vector<store::EnvironmentRecord>> EnvironmentManager::fork(const std::string& id,
                                                                       const ForkRequest& request) {
  if (request.count < 1 || request.count > kMaxForkCount) {
    return Error::make(Code::kInvalidArgument,
                       "count: from 1 to " + std::to_string(kMaxForkCount) + " forks at a time");
  }
  MOAT_ASSIGN(auto source, get(id));
  MOAT_ASSIGN(auto layers, permissions(id));
  CreateRequest copy;
  copy.taskId = request.taskId ? *request.taskId : source.taskId;
  copy.labels = request.labels ? *request.labels : source.labels;
  copy.ttlS = request.ttlS;
  copy.ttlRunsWhilePaused = source.ttlRunsWhilePaused;
  copy.onExpiry = source.onExpiry;
  copy.owner = request.owner;
  copy.cpus = source.cpus;
  copy.ramMb = source.ramMb;
  copy.storageGb = source.storageGb;
  copy.pids = source.pids;
  copy.env = source.env;
  if (!layers.empty()) {
    copy.permissions = layers.front();
    copy.furtherLayers.assign(layers.begin() + 1, layers.end());
  }
  MOAT_ASSIGN(copy.network, storedNetwork(source));
  MOAT_ASSIGN(copy.secrets, storedSecrets(source));
  // Through a snapshot nobody keeps: gone once the forks have their own
  // copies (volume first: a kill in between leaves a transient record,
  // rolled back). With memory: its processes' copies of that moment too.
  MOAT_ASSIGN(auto snap, takeSnapshot(id, "fork", request.owner, true, "", request.memory ? &copy.processes : nullptr));
  ScopeExit dropSnapshot([&] {
    (void)backend_.deleteSnapshot(snap.id);
    (void)store_.deleteSnapshot(snap.id);
  });
  copy.fromSnapshot = snap.id;
  copy.forkedFrom = id;
  copy.withMemory = request.memory;
  std::vector<store::EnvironmentRecord> forks;
  // All of them or none.
  ScopeExit dropForks([&] {
    for (const auto& made : forks) (void)destroy(made.id, "failed: a fork beside it failed", request.owner);
  });
  {
    // Made side by side, a host CPU each (a microVM's copy is mostly its
    // QEMU loading the state); a memory fork's each renamed and reseeded,
    // its commands still. The first failure stops the rest.
    const size_t lanes = std::min<size_t>(request.count, std::max(1u, std::thread::hardware_concurrency()));
    std::mutex mutex;
    size_t started = 0;
    Status failed;
    auto lane = [&] {
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (started == request.count || !failed.ok()) return;
          ++started;
        }
        auto made = create(copy);
        std::lock_guard<std::mutex> lock(mutex);
        if (made.ok()) {
          forks.push_back(std::move(made.value()));
        } else if (failed.ok()) {
          failed = made.error();
        }
      }
    };
    std::vector<std::thread> others;
    for (size_t i = 1; i < lanes; ++i) others.emplace_back(lane);
    lane();
    for (auto& t : others) t.join();
    MOAT_TRY(failed);
  }
  // Its commands were held still for the snapshot (docs/PAUSE.md, "Forks
  // with memory"): they go on in every copy once all are made (none of a
  // fork that failed has run), unless a person paused one meanwhile.
  for (const auto& made : request.memory ? forks : std::vector<store::EnvironmentRecord>{}) {
    auto held = exclusive(made.id);
    MOAT_ASSIGN(LiveEnvironment live, liveOf(made.id));
    if (!live.paused) MOAT_TRY(holdProcesses(made, live.connection, false));
  }
  dropForks.dismiss();
  return forks;
}

Result<store::SnapshotRecord> EnvironmentManager::usableSnapshot(const std::string& snapshotId,
                                                                 const std::string& forkOf) {
  MOAT_ASSIGN(auto snap, store_.getSnapshot(snapshotId));
  bool usable = snap && (snap->state == SnapshotState::kReady ||
                         (snap->state == SnapshotState::kTransient && !forkOf.empty() && snap->environment == forkOf));
  if (!usable) return Error::make(Code::kNotFound, "no snapshot " + snapshotId);
  return snap.value();
}

Result<std::vector<store::SnapshotRecord>> EnvironmentManager::snapshots(const std::string& owner,
                                                                         const std::string& environment) {
  MOAT_ASSIGN(auto all, store_.listSnapshots(owner, environment));
  std::erase_if(all, [](const store::SnapshotRecord& s) { return s.state != SnapshotState::kReady; });
  return all;
}

ScopeExit<std::function<void()>> EnvironmentManager::holdSnapshot(const std::string& snapshotId) {
  if (snapshotId.empty()) return ScopeExit<std::function<void()>>([] {});
  return snapshotUse_.shared(snapshotId);
}

Status EnvironmentManager::deleteSnapshot(const std::string& snapshotId, const std::string& actor) {
  // A restore or create copying from it finishes first: its environment
  // would fail (a restore's old files are already gone by then).
  auto deleting = snapshotUse_.exclusive(snapshotId);
  MOAT_ASSIGN(auto snap, getSnapshot(snapshotId));
  // Marked first: a moatd killed after the volume went and before the
  // record did would otherwise list a snapshot that is not there.
  MOAT_TRY(store_.setSnapshotState(snap.id, SnapshotState::kDeleting, snap.hostBase));
  if (Status s = backend_.deleteSnapshot(snap.id); !s.ok()) {
    (void)store_.setSnapshotState(snap.id, SnapshotState::kReady, snap.hostBase);
    return s.error();
  }
  MOAT_TRY(store_.deleteSnapshot(snap.id));
  audit_.record("snapshot.deleted", snap.environment, actor, snapshotData(snap));
  return {};
}

Result<store::EnvironmentRecord> EnvironmentManager::restore(const std::string& id, const std::string& snapshotId,
                                                             const std::string& actor) {
  // No network change between the old link going and the new one coming:
  // it would find no link, attach one, and the restore's own would fail.
  std::unique_lock<std::mutex> serial(networkMutex_);
  MOAT_ASSIGN(auto record, restoreFiles(id, snapshotId, actor));
  if (!record.network.empty()) {
    // Outside the exclusive hold: a failure destroys the environment, which takes it.
    Status s = restoreNetwork(id, "restored from snapshot " + snapshotId + ": the stored policy is put in force again");
    if (!s.ok()) {
      serial.unlock();
      (void)destroy(
          id, "failed: its network could not be restored with snapshot " + snapshotId + ": " + s.error().message(),
          actor);
      return s.error();
    }
  }
  return get(id);
}

Result<store::EnvironmentRecord> EnvironmentManager::restoreFiles(const std::string& id, const std::string& snapshotId,
                                                                  const std::string& actor) {
  auto held = exclusive(id);
  MOAT_ASSIGN(auto record, get(id));
  auto snapshotHeld = holdSnapshot(snapshotId);
  MOAT_ASSIGN(auto snap, getSnapshot(snapshotId));
  if (snap.isolation != record.isolation) {
    return Error::make(Code::kInvalidArgument, "snapshot " + snap.id + " is of a " + snap.isolation +
                                                   " environment; environment " + id + " is " + record.isolation);
  }
  if (snap.isolation == backend::isolationName(backend::Isolation::kMicroVm) && snap.storageGb != record.storageGb) {
    return Error::make(Code::kInvalidArgument, "snapshot " + snap.id + " holds a disk of " +
                                                   nlohmann::json(snap.storageGb).dump() + " GB; environment " + id +
                                                   "'s is " + nlohmann::json(record.storageGb).dump() + " GB");
  }
  if (snap.templateName != record.templateName) {
    return Error::make(Code::kInvalidArgument, "snapshot " + snap.id + " is of template " + snap.templateName +
                                                   "; environment " + id + " has " + record.templateName);
  }
  auto running = live_.find(id);
  if (!running) {
    return Error::make(Code::kConflict,
                       "environment " + id + " is " + stateName(record.state) + ": only a running one can be restored");
  }
  LiveEnvironment old = std::move(*running);
  const std::string why = "environment restored from snapshot " + snap.id;
  if (old.processes) old.processes->close(why);
  // The link goes with the old namespace. Stored first: once its slot is
  // free another environment may take it, and a moatd killed then must not
  // find two records naming it (this one is relinked at the next start).
  (void)store_.setNetwork(id, record.network, -1);
  if (egress_) egress_->forget(id);
  auto spec = specFor(record.templateName, record.cpus, record.ramMb, record.storageGb, record.pids,
                      backend::isolationNamed(record.isolation).value_or(backend::Isolation::kNamespaces));
  spec.id = id;
  spec.fromSnapshot = snap.id;
  spec.snapshotHostBase = snap.hostBase;
  // The environment is started again on the snapshot: no part of the old
  // one (processes, /tmp, /dev/shm, its network namespace) carries over.
  Status destroyed = backend_.destroy(id);
  auto created = destroyed.ok() ? backend_.create(spec) : Result<backend::Backend::Created>(destroyed.error());
  snapshotHeld.run();
  if (!created.ok()) {
    if (live_.take(id)) capacity_.release(record.ramMb);
    std::string reason = "failed: restoring snapshot " + snap.id + ": " + created.error().message();
    (void)backend_.destroy(id);
    (void)store_.setState(id, EnvironmentState::kFailed, reason);
    ended(id, reason);
    audit_.record("environment.destroyed", id, actor, {{"reason", reason}, {"state", "failed"}});
    return created.error();
  }
  auto connection = connect(id, std::move(created->control));
  record.netSlot = -1;
  int64_t expiresAtMs = old.expiresAtMs;
  if (record.state == EnvironmentState::kPaused) {
    // The restored environment's processes are new and run: its pause ends
    // (its time to live as a resume gives it back).
    expiresAtMs = expiryAfterPause(record, nowMs());
    if (Status s = store_.setPause(id, EnvironmentState::kRunning, 0, expiresAtMs); !s.ok()) {
      // The next start would pause a restored environment the store still
      // calls paused: said, and left to the next resume to set right.
      moat::log::warnf("recording the end of %s's pause: %s\n", id.c_str(), s.error().message().c_str());
    }
    // Its checkpoint went with it.
    if (record.pausedToDisk || record.backToDisk) (void)store_.setPausedMemory(id, store::PausedMemory::kRam);
    record.state = EnvironmentState::kRunning;
    record.pausedAtMs = 0;
    record.pausedToDisk = false;
    record.expiresAtMs = expiresAtMs;
    audit_.record("environment.resumed", id, actor, {{"reason", why}});
  }
  LiveEnvironment fresh = makeLive(connection, record);
  fresh.expiresAtMs = expiresAtMs;
  live_.put(id, std::move(fresh));
  old.connection.reset();  // joins its reader (outside the table's lock: it reports the old pid 1 gone)
  old.processes.reset();
  audit_.record("environment.restored", id, actor, snapshotData(snap));
  return record;
}

void EnvironmentManager::recoverSnapshots() {
  auto all = store_.listSnapshots("", "");
  if (!all.ok()) return;
  // What the backend keeps: when it cannot say (its storage cannot be
  // reached now), every record stays as it is for the next start.
  auto present = backend_.snapshots();
  if (!present.ok()) {
    moat::log::warnf("snapshots are not recovered this time: %s\n", present.error().message().c_str());
    return;
  }
  std::set<std::string> kept;
  for (const auto& snap : all.value()) {
    if (snap.state == SnapshotState::kReady) {
      kept.insert(snap.id);
      continue;
    }
    // Begun by a moatd that was killed before it finished: rolled back
    // (a deletion is finished; a fork's snapshot was never announced).
    // A volume that cannot be removed keeps its record (and is not
    // swept below): the next start tries again.
    if (Status s = backend_.deleteSnapshot(snap.id); !s.ok()) {
      moat::log::warnf("rolling back snapshot %s: %s\n", snap.id.c_str(), s.error().message().c_str());
      kept.insert(snap.id);
      continue;
    }
    (void)store_.deleteSnapshot(snap.id);
    if (snap.state == SnapshotState::kDeleting) {
      audit_.record("snapshot.deleted", snap.environment, "moatd",
                    {{"snapshot", snap.id}, {"name", snap.name}, {"reason", "moatd stopped while deleting it"}});
    } else if (snap.state != SnapshotState::kTransient) {
      audit_.record("snapshot.failed", snap.environment, "moatd",
                    {{"snapshot", snap.id}, {"reason", "moatd stopped while the snapshot was being taken"}});
    }
  }
  for (const auto& name : present.value()) {
    if (kept.count(name)) continue;
    Status s = backend_.deleteSnapshot(name);
    if (!s.ok()) moat::log::warnf("removing stray snapshot %s: %s\n", name.c_str(), s.error().message().c_str());
  }
}

}  // namespace moat::manager
