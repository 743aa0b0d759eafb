// A pause of every process in an environment's cgroup but its pid 1
// (docs/PAUSE.md): the cgroup v2 freezer on a child cgroup, or the v1
// freezer hierarchy.
#include <sys/stat.h>
#include <time.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>

#include "isolation/cgroup/cgroup.h"
#include "os/file.h"

namespace moat::isolation::cgroup {
namespace {

// The child cgroup (v2) that holds a paused environment's processes.
constexpr const char* kPausedChild = "paused";
// Frozen processes fork nothing, so moving converges in a round or two; a
// program that forks faster than it is moved is stopped by this bound.
constexpr int kMoveRounds = 100;
constexpr auto kStopDeadline = std::chrono::seconds(5);
// How long the v1 freezer may say FREEZING before it is asked again (then
// twice as long each time: a large environment may take that long).
constexpr auto kRefreezeAfter = std::chrono::milliseconds(20);

// A thread's process (its status's Tgid), or 0 when it is gone.
pid_t processOf(pid_t tid) {
  auto status = os::readFile("/proc/" + std::to_string(tid) + "/status");
  if (!status.ok()) return 0;
  auto at = status->find("\nTgid:");
  return at == std::string::npos ? 0 : static_cast<pid_t>(std::strtol(status->c_str() + at + 6, nullptr, 10));
}

// The kernel's flag of a thread on its way out (PF_EXITING, stat's 9th
// field): a write of its id succeeds and moves nothing.
constexpr unsigned long kExitingFlag = 0x4;

// Whether a thread has exited or is exiting (a zombie leader waits for its
// other threads; an exiting thread may wait a whole time slice on a busy
// host before it is a zombie): it cannot be moved, and need not be, since
// it runs no more of its program.
bool exited(pid_t tid) {
  auto stat = os::readFile("/proc/" + std::to_string(tid) + "/stat");
  if (!stat.ok()) return true;
  auto close = stat->rfind(')');
  if (close == std::string::npos || close + 2 >= stat->size()) return true;
  const char state = (*stat)[close + 2];
  if (state == 'Z' || state == 'X') return true;
  // After the state: ppid, pgrp, session, tty_nr, tpgid, then the flags.
  const char* at = stat->c_str() + close + 3;
  for (int field = 0; field < 5 && at != nullptr; ++field) {
    at = std::strchr(at + 1, ' ');
  }
  if (at == nullptr) return true;
  return (std::strtoul(at + 1, nullptr, 10) & kExitingFlag) != 0;
}

// Moves every thread of `fromDir` (but `keep`'s) into `toDir`, round after
// round until none is left: decided by threads, not processes, so that a
// process whose leader exited (listed, but with nothing left to move) does
// not count. v1: thread by thread (`tasks`: every hierarchy's cgroup keeps
// listing its threads, so the check is against `toDir`'s); v2: each
// thread's whole process (`cgroup.procs`; threads of one process share a
// domain cgroup).
Status moveAll(Version version, const std::string& fromDir, const std::string& toDir, pid_t keep) {
  const bool v2 = version == Version::kV2;
  const std::string listing = v2 ? "/cgroup.threads" : "/tasks";
  std::string lastMoved;
  for (int round = 0; round < kMoveRounds; ++round) {
    const std::vector<pid_t> listed = idsIn(toDir + listing);
    const std::set<pid_t> there(listed.begin(), listed.end());
    lastMoved.clear();
    for (pid_t tid : idsIn(fromDir + listing)) {
      if (there.count(tid) || exited(tid)) continue;
      const pid_t process = processOf(tid);
      if (process == 0 || process == keep) continue;
      Status s = v2 ? os::writeExisting(toDir + "/cgroup.procs", std::to_string(process))
                    : os::writeExisting(toDir + "/tasks", std::to_string(tid));
      // One that exited meanwhile is nothing to move.
      if (!s.ok() && s.error().sysErrno != ESRCH) return s;
      lastMoved += " " + std::to_string(tid);
    }
    if (lastMoved.empty()) return {};
  }
  return Error::make(Code::kBusy, "threads kept appearing in " + fromDir +
                                      " while they were moved (the last round's:" + lastMoved + ")");
}

void pauseBriefly() {
  struct timespec ts = {0, 200 * 1000};  // 0.2 ms: a freeze takes ~0.5 ms here
  ::nanosleep(&ts, nullptr);
}

}  // namespace

std::string Cgroup::pauseDir() const {
  if (layout_.version == Version::kV2) return dirs_.empty() ? "" : dirs_[0] + "/" + kPausedChild;
  auto freezer = layout_.v1Parents.find("freezer");
  if (freezer == layout_.v1Parents.end() || name_.empty()) return "";
  return freezer->second + "/" + name_;
}

bool Cgroup::frozen() const {
  const std::string dir = pauseDir();
  if (dir.empty()) return false;
  if (layout_.version == Version::kV2) {
    auto state = os::readFile(dir + "/cgroup.freeze");
    return state.ok() && state->rfind("1", 0) == 0;
  }
  auto state = os::readFile(dir + "/freezer.state");
  return state.ok() && state->rfind("THAWED", 0) != 0;
}

Status Cgroup::freeze(pid_t keep) {
  if (dirs_.empty()) return Error::make(Code::kNotFound, "the environment's cgroup is gone");
  const std::string dir = pauseDir();
  if (dir.empty()) {
    return Error::make(Code::kUnsupported,
                       "this host's cgroup v1 freezer has no hierarchy of its own (it is mounted with a limit's "
                       "controller, or not at all): moat cannot pause environments here");
  }
  const bool v2 = layout_.version == Version::kV2;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    if (errno == ENOENT && !v2) {
      return Error::make(Code::kUnsupported, "this host's cgroup v1 freezer hierarchy has no moat cgroup (" +
                                                 dir.substr(0, dir.rfind('/')) + " could not be made)");
    }
    return Error::fromErrno("create cgroup " + dir);
  }
  const std::string stateFile = dir + (v2 ? "/cgroup.freeze" : "/freezer.state");
  const char* frozenValue = v2 ? "1" : "FROZEN";
  // Frozen before anything arrives: each process stops as it is moved in.
  MOAT_TRY(os::writeExisting(stateFile, frozenValue));
  Status moved = moveAll(layout_.version, dirs_[0], dir, keep);
  const auto deadline = std::chrono::steady_clock::now() + kStopDeadline;
  auto kickAfter = std::chrono::duration_cast<std::chrono::steady_clock::duration>(kRefreezeAfter);
  auto kick = std::chrono::steady_clock::now() + kickAfter;
  while (moved.ok()) {
    // v2: "frozen 1" once every process below has stopped; v1: FREEZING
    // until then.
    auto state = os::readFile(dir + (v2 ? "/cgroup.events" : "/freezer.state"));
    if (state.ok() && (v2 ? state->find("frozen 1") != std::string::npos : state->rfind("FROZEN", 0) == 0)) {
      return {};
    }
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      moved = Error::make(Code::kTimeout, "the environment's processes did not all stop within 5 s");
      break;
    }
    if (!v2 && now > kick) {
      // The v1 freezer can miss a process that went to sleep waiting for a
      // vfork child it had just frozen (the child never execs, the parent
      // never reaches the freezer: FREEZING for good). Thawed and frozen
      // again, every process is asked anew, the sleeping parent included.
      (void)os::writeExisting(stateFile, "THAWED");
      moved = os::writeExisting(stateFile, frozenValue);
      if (moved.ok()) moved = moveAll(layout_.version, dirs_[0], dir, keep);
      kickAfter *= 2;
      kick = now + kickAfter;
    }
    pauseBriefly();
  }
  (void)thaw();  // nothing stays half paused
  return moved;
}

Status Cgroup::thaw() {
  const std::string dir = pauseDir();
  if (dir.empty() || dirs_.empty() || !os::exists(dir)) return {};
  if (layout_.version == Version::kV1) {
    // The processes stay in the freezer hierarchy's cgroup (it limits
    // nothing); the next pause freezes it again, the end removes it.
    return os::writeExisting(dir + "/freezer.state", "THAWED");
  }
  MOAT_TRY(os::writeExisting(dir + "/cgroup.freeze", "0"));
  // Back into the environment's cgroup, and the child removed: a forked
  // process may land in it between the last move and the removal.
  for (int round = 0; round < kMoveRounds; ++round) {
    MOAT_TRY(moveAll(layout_.version, dir, dirs_[0], 0));
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return {};
    if (errno != EBUSY) return Error::fromErrno("remove cgroup " + dir);
    pauseBriefly();
  }
  return {};  // thawed; the child stays until the cgroup is removed
}

}  // namespace moat::isolation::cgroup
