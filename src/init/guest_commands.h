#pragma once

#include <cstdint>
#include <string>

#include "common/result.h"
#include "common/unique_fd.h"

namespace moat::init {

// The cgroup a microVM guest's commands run in (docs/PAUSE.md, "microVM
// environments"): a child of the guest's root cgroup, where moat-init
// stays. Made at boot on a cgroup2 mount with nsdelegate, which is then
// detached: moat-init keeps descriptors of it, and no path leads there. A
// command (root in the guest, without SYS_ADMIN) reaches it only from a
// cgroup namespace of its own, whose root is its own cgroup, this one or
// one below: with nsdelegate it cannot write this cgroup's own files (its
// pids.max, its cgroup.freeze), and a freeze of this cgroup holds every
// cgroup below it, whatever their own cgroup.freeze says. moat-init is
// not dumpable, so its descriptors are not a command's either.
class GuestCommands {
 public:
  // `pids`: the commands' bound on tasks ("" none).
  static Result<GuestCommands> make(const std::string& pids);

  // For CLONE_INTO_CGROUP: commands start in it (no migration).
  int directory() const { return dir_.get(); }
  // Every command stops where it is: kTimeout when they have not all
  // stopped within 5 s (then they are let go on). Idempotent.
  Status freeze();
  // Idempotent.
  Status thaw();
  // The tasks (processes and threads) of the commands.
  Result<uint64_t> tasks() const;

 private:
  std::string file(const char* name) const;
  UniqueFd dir_;  // the commands' cgroup directory
};

}  // namespace moat::init
