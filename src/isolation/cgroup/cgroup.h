#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "isolation/cgroup/layout.h"

namespace moat::isolation::cgroup {

struct Limits {
  double cpus = 0;           // CPU time per wall second; 0: unlimited
  uint64_t memoryBytes = 0;  // hard limit, swap included; 0: unlimited
  uint64_t pids = 0;         // tasks; 0: unlimited
  // v1 with a cpuset hierarchy: a cpuset cgroup with these CPUs (cpus.h);
  // empty, or one that cannot be made: none (the affinity still applies).
  std::vector<int> cpuSet;
};

// One knob write: file relative to the environment's cgroup directory of
// `controller` ("" on v2, where there is one directory), and its value.
struct KnobWrite {
  std::string controller;
  std::string file;
  std::string value;
  bool optional = false;  // skipped when the kernel lacks the file
};

// The writes that enforce `limits` on a layout's version (pure; unit-tested
// for both versions without cgroupfs).
std::vector<KnobWrite> limitWrites(Version version, const Limits& limits);

// What an environment's processes use now.
struct Usage {
  // CPU time since the cgroup began; none where the host has no CPU
  // accounting (cgroup v1 without the cpuacct controller).
  std::optional<uint64_t> cpuUsec;
  uint64_t memoryBytes = 0;  // v1: page cache included, as the limit counts it
  uint64_t pids = 0;         // tasks (processes and threads)
  uint64_t oomKills = 0;
};

// The texts of the files Cgroup::usage() reads; none: the file is missing.
// v2: cpu.stat, memory.current, pids.current, memory.events; v1:
// cpuacct.usage (nanoseconds), memory.usage_in_bytes, pids.current,
// memory.oom_control.
struct UsageFiles {
  std::optional<std::string> cpu, memory, pids, memoryEvents;
};
// Pure: unit-tested for both versions without cgroupfs.
Usage usageFrom(Version version, const UsageFiles& files);

// One environment's cgroup (one directory on v2, one per controller on v1).
// Removed when the object dies; a failed create removes what it made.
class Cgroup {
 public:
  static Result<Cgroup> create(const Layout& layout, const std::string& name, const Limits& limits);
  // The cgroup `name` that a process before this one made (its limits as
  // they are): "not_found" when it is not there.
  static Result<Cgroup> open(const Layout& layout, const std::string& name);
  Cgroup(Cgroup&& other) noexcept;
  Cgroup& operator=(Cgroup&&) = delete;
  ~Cgroup();

  // The files a single-threaded process writes "0" to in order to join.
  // On v1 these are the per-thread `tasks` files: moving only the calling
  // thread skips the global threadgroup lock whose RCU sync costs
  // milliseconds per migration. (v2 uses CLONE_INTO_CGROUP instead.)
  const std::vector<std::string>& joinFiles() const { return joinFiles_; }
  const std::vector<std::string>& procsFiles() const { return procsFiles_; }
  // v2 only: a directory fd for CLONE_INTO_CGROUP.
  Result<UniqueFd> openDirectory() const;
  // Times the kernel's OOM killer fired inside this cgroup.
  uint64_t oomKills() const { return usage().oomKills; }
  // Zero for what cannot be read (a cgroup being removed).
  Usage usage() const;
  // The processes in it now (the first directory's cgroup.procs).
  std::vector<pid_t> processes() const;
  // Kills every process in the cgroup (v2 cgroup.kill; v1 by pid list),
  // paused ones too (v1: thawed after the kill, so they die without running).
  void killAll() const;

  // A pause (freeze.cc): every process but `keep` (pid 1, which goes on
  // answering) stops where it is until thaw(). v2: they move into a child
  // cgroup that is frozen (cgroup.freeze), under the same limits; v1: into
  // a cgroup of the freezer hierarchy, which needs one of its own (the
  // layout's "freezer" parent; kUnsupported without). A process forked
  // meanwhile is found and moved too. Idempotent; kTimeout when they did
  // not all stop within 5 s (then nothing stays frozen).
  Status freeze(pid_t keep);
  // Lets them go on (v2: back into this cgroup). Idempotent.
  Status thaw();
  // Whether a pause holds it now.
  bool frozen() const;
  // Removes the directories; retries briefly while the kernel finishes exits.
  Status remove();
  // Lets go of it without removing it (its processes outlive this object).
  void leaveInPlace() { dirs_.clear(); }

 private:
  Cgroup(Layout layout, std::vector<std::string> dirs);
  Status applyLimits(const Limits& limits);
  void addFiles(const std::string& dir);

  // Where a pause puts the processes; "" where it cannot be (v1 without a
  // freezer hierarchy of its own).
  std::string pauseDir() const;

  Layout layout_;
  std::string name_;
  std::vector<std::string> dirs_;  // v2: one; v1: cpu, memory, pids, then cpuacct and cpuset if made
  std::vector<std::string> procsFiles_;
  std::vector<std::string> joinFiles_;
  bool cpuacct_ = false;  // v1: dirs_[3] is cpuacct's
};

// The ids a cgroup file lists, one per line (cgroup.procs, tasks,
// cgroup.threads); none when it cannot be read (a cgroup being removed).
std::vector<pid_t> idsIn(const std::string& file);

// The host's cgroup layout with moat's parent cgroups made, once per
// process (reading mountinfo and walking the parents took ~0.5 ms of each
// create). `again` re-reads both (the parents were removed under us).
Result<Layout> preparedHostLayout(bool again);

// Removes the cgroups under the layout's parents whose names begin with
// `prefix` and that are empty (what a process that died holding them left;
// one with a process in it stays).
void removeEmptyNamed(const Layout& layout, const std::string& prefix);

// A cgroup under the prepared parents; should those have gone since
// (ENOENT), they are prepared again (into `layout`) and it is tried once more.
Result<std::unique_ptr<Cgroup>> createUnderPreparedParents(Layout& layout, const std::string& name,
                                                           const Limits& limits);

}  // namespace moat::isolation::cgroup
