// A pause of every process in an environment's cgroup but its pid 1
// (docs/PAUSE.md): the cgroup v2 freezer on a child cgroup, or the v1
// freezer hierarchy.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>

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

std::set<pid_t> pidsIn(const std::string& procsFile) {
  std::set<pid_t> pids;
  auto text = os::readFile(procsFile, 1 << 20);
  if (!text.ok()) return pids;
  std::istringstream in(text.value());
  for (long pid; in >> pid;) pids.insert(static_cast<pid_t>(pid));
  return pids;
}

// Moves every process listed in `from` (but `keep`, and those already in
// `to`) into `to`, round after round until none is left to move.
Status moveAll(const std::string& from, const std::string& to, pid_t keep) {
  for (int round = 0; round < kMoveRounds; ++round) {
    const std::set<pid_t> there = pidsIn(to);
    bool moved = false;
    for (pid_t pid : pidsIn(from)) {
      if (pid == keep || there.count(pid)) continue;
      Status s = os::writeExisting(to, std::to_string(pid));
      // One that exited meanwhile is nothing to move.
      if (!s.ok() && s.error().sysErrno != ESRCH) return s;
      moved = true;
    }
    if (!moved) return {};
  }
  return Error::make(Code::kBusy, "processes kept appearing in " + from + " while they were moved");
}

void pauseBriefly() {
  struct timespec ts = {0, 1000 * 1000};
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
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return Error::fromErrno("create cgroup " + dir);
  // Frozen before anything arrives: each process stops as it is moved in.
  MOAT_TRY(os::writeExisting(dir + (v2 ? "/cgroup.freeze" : "/freezer.state"), v2 ? "1" : "FROZEN"));
  Status moved = moveAll(procsFiles_[0], dir + "/cgroup.procs", keep);
  const auto deadline = std::chrono::steady_clock::now() + kStopDeadline;
  while (moved.ok()) {
    // v2: "frozen 1" once every process below has stopped; v1: FREEZING
    // until then.
    auto state = os::readFile(dir + (v2 ? "/cgroup.events" : "/freezer.state"));
    if (state.ok() && (v2 ? state->find("frozen 1") != std::string::npos : state->rfind("FROZEN", 0) == 0)) {
      return {};
    }
    if (std::chrono::steady_clock::now() > deadline) {
      moved = Error::make(Code::kTimeout, "the environment's processes did not all stop within 5 s");
      break;
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
    MOAT_TRY(moveAll(dir + "/cgroup.procs", procsFiles_[0], 0));
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return {};
    if (errno != EBUSY) return Error::fromErrno("remove cgroup " + dir);
    pauseBriefly();
  }
  return {};  // thawed; the child stays until the cgroup is removed
}

}  // namespace moat::isolation::cgroup
