// Pauses and resumes (docs/PAUSE.md): the backend stops every process of
// an environment but its pid 1; the store says so (state paused, when,
// and what became of its time to live), and so does the live table (what
// a pause refuses: commands, processes, file changes).
//
// The store says "paused" before the backend freezes and until after it
// thaws, so a moatd that dies between the two leaves a record that says
// paused over processes that may run, never the other way round: a start
// pauses again only what its store calls paused (recoverAfterRestart).
#include "manager/environment_manager.h"

namespace moat::manager {

using store::EnvironmentState;

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

Result<store::EnvironmentRecord> EnvironmentManager::pause(const std::string& id, const std::string& actor) {
  return pauseHeld(id, actor, false);
}

void EnvironmentManager::expire(const std::string& id) {
  auto record = get(id);
  if (!record.ok() || record->onExpiry != store::ExpiryAction::kPause) {
    (void)destroy(id, "expired");
    return;
  }
  {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    // Under way already (the reaper lists it until its pause is in force).
    if (stopping_ || !expiring_.insert(id).second) return;
    ++expiryWorkers_;
  }
  std::thread([this, id] {
    pauseAtExpiry(id);
    {
      std::lock_guard<std::mutex> lock(threadsMutex_);
      expiring_.erase(id);
      --expiryWorkers_;
    }
    expiryCv_.notify_all();
  }).detach();
}

void EnvironmentManager::pauseAtExpiry(const std::string& id) {
  auto paused = pauseHeld(id, "moatd", true);
  if (paused.ok()) return;
  // Gone, paused or given more time meanwhile: nothing to do. Otherwise its
  // time is up all the same: a limit holds when the pause asked for cannot
  // be made.
  auto now = get(id);
  if (!now.ok() || now->state != EnvironmentState::kRunning || now->expiresAtMs > nowMs()) return;
  (void)destroy(id, "expired (the pause its create asked for failed: " + paused.error().message() + ")");
}

Result<store::EnvironmentRecord> EnvironmentManager::pauseHeld(const std::string& id, const std::string& actor,
                                                               bool atExpiry) {
  auto held = exclusive(id);  // one pause, resume, restore or destroy of it at a time
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  MOAT_ASSIGN(auto record, get(id));
  if (record.state == EnvironmentState::kPaused) return record;
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
  audit_.record("environment.paused", id, actor, data);
  return get(id);
}

Result<store::EnvironmentRecord> EnvironmentManager::resume(const std::string& id, const std::string& actor) {
  auto held = exclusive(id);
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  MOAT_ASSIGN(auto record, get(id));
  if (record.state != EnvironmentState::kPaused) return record;
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
  reaperCv_.notify_all();
  audit_.record("environment.resumed", id, actor, {{"paused_ms", pausedMs}});
  return get(id);
}

}  // namespace moat::manager
