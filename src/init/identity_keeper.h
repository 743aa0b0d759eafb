#pragma once

#include <string>

#include "common/result.h"
#include "common/unique_fd.h"

// A microVM guest's identity after a restore (docs/PAUSE.md, "Forks with
// memory"): a copy of a running guest takes a name of its own, and its
// kernel's random generator is reseeded, so that no two copies draw the
// same numbers. Both need CAP_SYS_ADMIN, which moat-init gives up with the
// rest once the guest's root is made (guest.cc). A child forked before that
// keeps SYS_ADMIN alone and does these two things when moat-init asks,
// nothing else: it reads only moat-init's requests on a socket no command
// holds, and commands (without SYS_ADMIN or SYS_PTRACE) cannot trace it.
namespace moat::init {

class IdentityKeeper {
 public:
  IdentityKeeper() = default;
  // Forks the keeper (moat-init with one thread, its capabilities whole).
  static Result<IdentityKeeper> start();
  // Names the guest `hostname` (unless empty) and mixes `seed` into its
  // random pool, reseeding the generator. Waits at most kWait: a keeper
  // that does not answer by then (a command stopped it: commands may
  // signal it) is killed, and every later renewal fails at once.
  Status renew(const std::string& hostname, const std::string& seed);
  bool started() const { return static_cast<bool>(socket_); }
  static constexpr int kWaitMs = 2000;

 private:
  IdentityKeeper(UniqueFd socket, pid_t pid) : socket_(std::move(socket)), pid_(pid) {}
  UniqueFd socket_;
  pid_t pid_ = -1;
};

}  // namespace moat::init
