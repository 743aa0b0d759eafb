// Pauses and resumes (docs/PAUSE.md): the backend stops every process of
// an environment but its pid 1; the store says so (state paused, when,
// and what became of its time to live), and so does the live table (what
// a pause refuses: commands, processes, file changes).
//
// The store says "paused" before the backend freezes and until after it
// thaws, so a moatd that dies between the two leaves a record that says
// paused over processes that may run, never the other way round: a start
// pauses again only what its store calls paused (recoverAfterRestart).
#include <chrono>

#include "common/hex.h"
#include "common/log.h"
#include "manager/environment_manager.h"
#include "manager/stored_settings.h"

namespace moat::manager {

using store::EnvironmentState;

std::string checkpointedWhy(const std::string& id) {
  return "environment " + id + " is checkpointed to disk: resume it (POST /v1/environments/" + id + "/resume) first";
}

int64_t expiryAfterPause(const store::EnvironmentRecord& record, int64_t nowMs) {
  if (record.ttlRunsWhilePaused) return record.expiresAtMs;
  return record.expiresAtMs + std::max<int64_t>(0, nowMs - record.pausedAtMs);
}

Status EnvironmentManager::holdProcesses(const store::EnvironmentRecord& record,
                                         const std::shared_ptr<InitConnection>& connection, bool hold) {
  if (record.isolation != backend::isolationName(backend::Isolation::kMicroVm)) {
    return hold ? backend_.pause(record.id) : backend_.resume(record.id);
  }
  if (connection->peerVersion() < init::kGuestCgroupSince) {
    return Error::make(Code::kUnsupported, "environment " + record.id +
                                               "'s guest runs a moat-init older than pauses of microVMs (it was "
                                               "started by an earlier moatd): it cannot be paused");
  }
  init::FileRequest request;
  request.op = hold ? init::FileOp::kPause : init::FileOp::kResume;
  request.path = "/";
  auto answer = connection->file(request);
  if (!answer.ok() && hold) {
    // No answer: the guest may freeze yet; it is let go on (idempotent),
    // so that nothing stays frozen under a record that says running.
    init::FileRequest resume = request;
    resume.op = init::FileOp::kResume;
    (void)connection->file(resume);
  }
  MOAT_TRY(answer);
  if (answer->err == 0) return {};
  return Error::make(answer->err == ETIMEDOUT ? Code::kTimeout : Code::kUnavailable,
                     "environment " + record.id + "'s guest could not " + (hold ? "pause" : "resume") +
                         " its processes: " + answer->message);
}

Result<LiveEnvironment> EnvironmentManager::unpausedLiveOf(const std::string& id, const char* what) {
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  if (live.paused) {
    return Error::make(Code::kConflict, "environment " + id + " is paused: resume it (POST /v1/environments/" + id +
                                            "/resume) to " + what);
  }
  return live;
}

Result<store::EnvironmentRecord> EnvironmentManager::pause(const std::string& id, const std::string& actor,
                                                           bool toDisk) {
  return pauseHeld(id, actor, false, toDisk);
}

Status EnvironmentManager::checkpointHeld(const store::EnvironmentRecord& record, const LiveEnvironment& live,
                                          const std::string& actor, const std::string& reason) {
  const std::string& id = record.id;
  // Nothing more is sent until it is back, and the last frame sent (the
  // barrier) is answered: moat-init has read everything before it (a guest
  // saved with half a request read would misread the next), and, told to
  // quiesce, sends nothing of its own after its answer (its commands'
  // output waits in their pipes, inside the checkpoint).
  MOAT_TRY(suspendQuiet(live.connection, checkpointedWhy(id)));
  // Its egress link lives in its QEMU's network namespace, which goes with
  // QEMU: taken away first, made again by the resume.
  // The caller holds networkMutex_ (taken before exclusive(), as a
  // restore takes them): no network change comes meanwhile.
  const bool linked = egress_ && egress_->slotOf(id).has_value();
  if (linked) {
    (void)egress_->detach(id);
    (void)store_.setNetwork(id, record.network, -1);
  }
  auto bytes = backend_.checkpoint(id);
  if (!bytes.ok()) {
    live.connection->endSuspension();
    endGuestQuiet(id, live.connection);  // it stays paused in RAM, or the caller's resume ends it too
    if (linked) (void)restoreNetwork(id, "its checkpoint failed: " + bytes.error().message());
    return bytes.error();
  }
  MOAT_TRY(store_.setPausedMemory(id, store::PausedMemory::kDisk));
  {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    loadFailed_.erase(id);  // a new checkpoint: a load of it is tried afresh
  }
  nlohmann::json data = {{"bytes", bytes.value()}};
  if (!reason.empty()) data["reason"] = reason;
  audit_.record("environment.checkpointed", id, actor, data);
  return {};
}

Status EnvironmentManager::restoreCheckpointHeld(const store::EnvironmentRecord& record, const LiveEnvironment& live,
                                                 store::PausedMemory after) {
  const std::string& id = record.id;
  auto spec = specFor(record.templateName, record.cpus, record.ramMb, record.storageGb, record.pids,
                      backend::isolationNamed(record.isolation).value_or(backend::Isolation::kNamespaces));
  spec.id = id;
  MOAT_ASSIGN(UniqueFd control, backend_.restoreCheckpoint(spec));
  // Its memory is in RAM again (a QEMU runs it): said at once, so that a
  // moatd that dies from here on finds it as it is.
  if (Status stored = store_.setPausedMemory(id, after); !stored.ok()) {
    moat::log::warnf("recording %s's restore: %s\n", id.c_str(), stored.error().message().c_str());
  }
  // A guest that does not take its connection back is ended, saying why.
  auto lost = [&](const std::string& why) {
    live.connection->close("environment " + id + " did not come back from its checkpoint: " + why);
    return Error::make(Code::kUnavailable, "environment " + id + " did not come back from its checkpoint: " + why);
  };
  if (Status resumed = live.connection->resumeOn(std::move(control)); !resumed.ok()) {
    return lost(resumed.error().message());
  }
  if (live.connection->peerVersion() == 0) return lost("its moat-init did not say Hello");
  sendExecPolicy(id, live.connection);  // this moatd's gate (a restart may have come between)
  // Its clock stood still while it was on disk.
  if (Status set = setGuestClock(id, live.connection); !set.ok()) {
    moat::log::warnf("%s\n", set.error().message().c_str());
  }
  auto stored = storedNetwork(record);
  if (stored.ok() && stored->mode != egress::Mode::kNone) {
    if (Status linked = restoreNetwork(id, "restored from its checkpoint"); !linked.ok()) {
      moat::log::warnf("environment %s's network after its restore: %s\n", id.c_str(),
                       linked.error().message().c_str());
    }
  }
  return {};
}

Status EnvironmentManager::suspendQuiet(const std::shared_ptr<InitConnection>& connection, const std::string& why) {
  init::FileRequest barrier;
  barrier.op = connection->peerVersion() >= init::kClockSince ? init::FileOp::kQuiesce : init::FileOp::kTasks;
  barrier.path = "/";
  Status quiet = connection->suspend(why, barrier);
  if (!quiet.ok()) connection->endSuspension();
  return quiet;
}

void EnvironmentManager::endGuestQuiet(const std::string& id, const std::shared_ptr<InitConnection>& connection) {
  if (connection->peerVersion() < init::kQuietEndSince) return;  // its quiet ends with the resume
  init::FileRequest end;
  end.op = init::FileOp::kQuiesce;
  end.path = "/";
  end.offset = init::kQuietEnd;
  auto ended = connection->file(end);
  if (!ended.ok() || ended->err != 0) {
    moat::log::warnf("environment %s's guest did not end its quiet: %s\n", id.c_str(),
                     ended.ok() ? ended->message.c_str() : ended.error().message().c_str());
  }
}

Status EnvironmentManager::setGuestClock(const std::string& id, const std::shared_ptr<InitConnection>& connection,
                                         const std::string& hostname) {
  if (connection->peerVersion() < (hostname.empty() ? init::kClockSince : init::kQuietEndSince)) {
    if (hostname.empty()) return {};  // an older guest's clock stays where it was saved
    return Error::make(Code::kUnsupported, "environment " + id + "'s guest cannot take a new name");
  }
  init::FileRequest clock;
  clock.op = init::FileOp::kClock;
  clock.path = "/";
  clock.target = hostname;
  clock.offset = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  MOAT_ASSIGN(clock.data, randomBytes(32));
  MOAT_ASSIGN(auto set, connection->file(clock));
  if (set.err != 0) {
    return Error::make(Code::kUnavailable, "environment " + id + "'s guest did not take its clock" +
                                               (hostname.empty() ? "" : ", name") + " and entropy: " + set.message);
  }
  return {};
}

void EnvironmentManager::expire(const std::string& id) {
  auto record = get(id);
  if (!record.ok() || !store::pausesAtExpiry(record->onExpiry)) {
    (void)destroy(id, "expired");
    return;
  }
  // Under way already if not (the reaper lists it until its pause is in
  // force).
  (void)aside(id, [this, id] { pauseAtExpiry(id); });
}

bool EnvironmentManager::aside(const std::string& id, std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    if (stopping_ || !asideIds_.insert(id).second) return false;
    ++asideWorkers_;
  }
  std::thread([this, id, work = std::move(work)] {
    work();
    {
      std::lock_guard<std::mutex> lock(threadsMutex_);
      asideIds_.erase(id);
      --asideWorkers_;
    }
    asideCv_.notify_all();
  }).detach();
  return true;
}

Result<init::FileResult> EnvironmentManager::readPausedGuest(const std::string& id, const LiveEnvironment& live,
                                                             const init::FileRequest& request) {
  // A return to disk may come between the restore and the read (it waits
  // for reads in flight, and new ones wait for it): then again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    MOAT_ASSIGN(auto record, get(id));
    if (record.state == EnvironmentState::kPaused && record.pausedToDisk) {
      std::lock_guard<std::mutex> serial(networkMutex_);  // the load links it again
      auto held = exclusive(id);
      MOAT_ASSIGN(record, get(id));
      MOAT_TRY(backForReadsHeld(record, live));
    }
    auto reading = starts_.shared(id);
    MOAT_ASSIGN(record, get(id));
    if (record.state == EnvironmentState::kPaused && record.pausedToDisk) continue;
    if (!record.backToDisk) return live.connection->file(request);
    putOffBackToDisk(id);
    auto answer = live.connection->file(request);
    putOffBackToDisk(id);  // from the read's end: a long read is not followed by the save at once
    return answer;
  }
  return Error::make(Code::kConflict, checkpointedWhy(id));
}

Status EnvironmentManager::backForReadsHeld(const store::EnvironmentRecord& record, const LiveEnvironment& live) {
  if (record.state != EnvironmentState::kPaused || !record.pausedToDisk) return {};
  const std::string& id = record.id;
  // A load that failed is not tried again by every read: a while first.
  {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    auto failed = loadFailed_.find(id);
    if (failed != loadFailed_.end() && nowMs() - failed->second.first < kLoadRetryMs) {
      return Error::make(Code::kUnavailable, "environment " + id +
                                                 "'s checkpoint could not be brought back for reads (" +
                                                 failed->second.second + "); tried again " +
                                                 std::to_string(kLoadRetryMs / 1000) + " s after that");
    }
  }
  Status loaded = [&] {
    MovesHeld move(checkpointMoves_);  // bounded host-wide: a read may start one
    return restoreCheckpointHeld(record, live, store::PausedMemory::kRamUntilIdle);
  }();
  {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    if (loaded.ok()) {
      loadFailed_.erase(id);
    } else {
      loadFailed_[id] = {nowMs(), loaded.error().message()};
    }
  }
  MOAT_TRY(loaded);
  putOffBackToDisk(id);
  audit_.record("environment.loaded", id, "moatd",
                {{"reason", "a file read"}, {"back_to_disk_after_s", config_.backToDiskAfterMs / 1000}});
  return {};
}

void EnvironmentManager::putOffBackToDisk(const std::string& id) {
  std::lock_guard<std::mutex> lock(threadsMutex_);
  int64_t& at = backToDiskAt_[id];
  at = std::max(at, nowMs() + config_.backToDiskAfterMs);
}

void EnvironmentManager::backToDisk(const std::string& id) {
  auto putOff = [&] {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    return backToDiskAt_.count(id) > 0;
  };
  if (putOff()) return;                               // before waiting on its reads: a stream of them keeps it
  std::lock_guard<std::mutex> serial(networkMutex_);  // the save takes its link away
  auto held = exclusive(id);
  auto quiet = starts_.exclusive(id);  // reads under way end first; new ones wait for the save
  if (putOff()) return;                // a read put it off meanwhile
  auto record = get(id);
  auto live = liveOf(id);
  if (!record.ok() || !live.ok() || record->state != EnvironmentState::kPaused || record->pausedToDisk ||
      !record->backToDisk) {
    return;  // resumed, destroyed or taken to disk meanwhile
  }
  const std::string why = "no file read for " + std::to_string(config_.backToDiskAfterMs / 1000) + " s";
  MovesHeld move(checkpointMoves_);
  if (Status saved = checkpointHeld(record.value(), live.value(), "moatd", why); !saved.ok()) {
    // It stays paused in RAM; tried again later.
    moat::log::warnf("environment %s back to disk: %s\n", id.c_str(), saved.error().message().c_str());
    putOffBackToDisk(id);
  }
}

void EnvironmentManager::pauseAtExpiry(const std::string& id) {
  auto record = get(id);
  const bool toDisk = record.ok() && record->onExpiry == store::ExpiryAction::kCheckpoint;
  auto paused = pauseHeld(id, "moatd", true, toDisk);
  if (paused.ok()) return;
  // Gone, paused or given more time meanwhile: nothing to do. Otherwise its
  // time is up all the same: a limit holds when the pause asked for cannot
  // be made.
  auto now = get(id);
  if (!now.ok() || now->state != EnvironmentState::kRunning || now->expiresAtMs > nowMs()) return;
  (void)destroy(id, "expired (the pause its create asked for failed: " + paused.error().message() + ")");
}

Result<store::EnvironmentRecord> EnvironmentManager::pauseHeld(const std::string& id, const std::string& actor,
                                                               bool atExpiry, bool toDisk) {
  // A checkpoint takes its link away: no network change (a PUT, a restore's
  // relink) meanwhile; before exclusive(), as everywhere.
  std::unique_lock<std::mutex> serial(networkMutex_, std::defer_lock);
  if (toDisk) serial.lock();
  auto held = exclusive(id);  // one pause, resume, restore or destroy of it at a time
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  MOAT_ASSIGN(auto record, get(id));
  if (toDisk && record.isolation != backend::isolationName(backend::Isolation::kMicroVm)) {
    return backend_.checkpoint(id).error();  // the backend says why it cannot
  }
  if (record.state == EnvironmentState::kPaused) {
    if (toDisk && !record.pausedToDisk) {
      auto quiet = starts_.exclusive(id);  // file reads under way end first; new ones wait, then bring it back
      MOAT_TRY(checkpointHeld(record, live, actor));  // it stays paused in RAM if this fails
      return get(id);
    }
    return record;
  }
  if (record.state != EnvironmentState::kRunning) {
    return Error::make(Code::kConflict, "environment " + id + " is " + stateName(record.state));
  }
  const int64_t now = nowMs();
  // A timeout set since the reaper looked moved the expiry on: not due.
  if (atExpiry && record.expiresAtMs > now) return record;
  // What a resume after it moves on by the pause's length: the time to
  // live again (as given last; an older record's, as created).
  const int64_t ttlS = record.ttlS > 0 ? record.ttlS : (record.expiresAtMs - record.createdAtMs) / 1000;
  const int64_t expiresAtMs = atExpiry ? now + ttlS * 1000 : record.expiresAtMs;
  // New commands and file changes are refused from here on; those already
  // on their way to moat-init are waited for (they hold starts_), so the
  // freezer finds every process they start.
  live_.update(id, [&](LiveEnvironment& live) { live.paused = true; });
  auto quiet = starts_.exclusive(id);
  auto undo = [&] { live_.update(id, [&](LiveEnvironment& live) { live.paused = false; }); };
  if (Status stored = store_.setPause(id, EnvironmentState::kPaused, now, expiresAtMs); !stored.ok()) {
    undo();
    return stored.error();
  }
  if (Status frozen = holdProcesses(record, live.connection, true); !frozen.ok()) {
    (void)store_.setPause(id, EnvironmentState::kRunning, 0, record.expiresAtMs);  // it runs, as before
    undo();
    return frozen.error();
  }
  if (!record.ttlRunsWhilePaused) live_.setExpiry(id, kNoExpiry);
  nlohmann::json data = {{"ttl_while_paused", record.ttlRunsWhilePaused ? "runs" : "stops"}};
  if (atExpiry) data["reason"] = "expired";
  data["memory"] = toDisk ? "disk" : "ram";
  audit_.record("environment.paused", id, actor, data);
  if (toDisk) {
    if (Status saved = checkpointHeld(record, live, actor); !saved.ok()) {
      // Left as it was before the pause: running, its memory in RAM.
      if (holdProcesses(record, live.connection, false).ok()) {
        (void)store_.setPause(id, EnvironmentState::kRunning, 0, record.expiresAtMs);
        undo();
        live_.setExpiry(id, record.expiresAtMs);
        audit_.record("environment.resumed", id, "moatd",
                      {{"reason", "its checkpoint to disk failed: " + saved.error().message()}});
      }
      return saved.error();
    }
  }
  return get(id);
}

Result<store::EnvironmentRecord> EnvironmentManager::resume(const std::string& id, const std::string& actor) {
  // A microVM's may restore its checkpoint, which links it again.
  std::unique_lock<std::mutex> serial(networkMutex_, std::defer_lock);
  if (auto peek = get(id); peek.ok() && peek->isolation == backend::isolationName(backend::Isolation::kMicroVm)) {
    serial.lock();
  }
  auto held = exclusive(id);
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  MOAT_ASSIGN(auto record, get(id));
  if (record.state != EnvironmentState::kPaused) return record;
  const bool fromDisk = record.pausedToDisk;
  if (fromDisk) MOAT_TRY(restoreCheckpointHeld(record, live));
  MOAT_TRY(holdProcesses(record, live.connection, false));
  const int64_t now = nowMs();
  const int64_t pausedMs = std::max<int64_t>(0, now - record.pausedAtMs);
  const int64_t expiresAtMs = expiryAfterPause(record, now);
  if (Status stored = store_.setPause(id, EnvironmentState::kRunning, 0, expiresAtMs); !stored.ok()) {
    (void)holdProcesses(record, live.connection, true);  // still paused, as the store says
    return stored.error();
  }
  live_.update(id, [&](LiveEnvironment& live) { live.paused = false; });
  live_.setExpiry(id, expiresAtMs);
  {
    // In RAM for reads until now: it stays, running (setPause cleared it).
    std::lock_guard<std::mutex> lock(threadsMutex_);
    backToDiskAt_.erase(id);
    loadFailed_.erase(id);
  }
  reaperCv_.notify_all();
  audit_.record("environment.resumed", id, actor, {{"paused_ms", pausedMs}, {"memory", fromDisk ? "disk" : "ram"}});
  return get(id);
}

}  // namespace moat::manager
