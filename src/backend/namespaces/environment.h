#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/result.h"
#include "common/unique_fd.h"
#include "isolation/cgroup/cgroup.h"
#include "isolation/fs/rootfs.h"
#include "isolation/namespaces/user_namespace.h"

namespace moat::backend::namespaces {

// How pid 1 comes to be. kExec execs the moat-init binary: a fresh image
// holding nothing of the creating process (what a long-lived daemon with
// secrets in memory wants). kInProcess runs the same supervisor code in the
// cloned child without an exec: ~0.6 ms faster, right for the one-shot CLI,
// whose memory holds nothing worth hiding (and pid 1 is not dumpable either way).
enum class InitMode { kExec, kInProcess };

struct EnvironmentSpec {
  std::string stateDir;
  std::string templateName = "host";
  double cpus = 1;
  uint64_t memoryMb = 1024;
  uint64_t pids = 1024;
  double storageGb = 4;                           // fractional: 0.5 is 512 MiB
  std::vector<isolation::fs::BindMount> volumes;  // explicit host dirs only
  InitMode initMode = InitMode::kExec;
  // Frames (init::encodeFrame) queued on the control socket before pid 1
  // starts, so its first request needs no round trip (moat run's Spawn).
  std::string firstFrames;
  // 12 lowercase hex digits; empty: a new random one.
  std::string id;
  // Not empty: the writable layer starts as a copy of this snapshot of the
  // storage pool (fork, restore) instead of empty; its files were owned by
  // the host id range from snapshotHostBase and are moved to the new one.
  std::string fromSnapshot;
  uint32_t snapshotHostBase = 0;
  // Survives the loss of its control connection: a new one can be handed
  // over (reconnect()), as moatd's spawner does after a moatd restart.
  bool reattachable = false;
  // A fresh network namespace (os::newNetworkNamespace) to join instead of
  // making one at clone time, which is the costliest namespace (~0.5 ms);
  // moatd's spawner keeps a few ready. The caller keeps the descriptor and
  // must not hand the namespace out again. -1: make one.
  int networkNamespaceFd = -1;
  // Say once per process, on stderr, when the environment's /proc cannot
  // show its limits (LXCFS missing or failing): moatd's spawner does; a
  // `moat run` keeps its command's stderr to the command.
  bool warnWithoutLimitsView = false;
};

// The open files limit pid 1 of a new environment starts with, for a creator
// that raised its own (moatd's spawner holds three descriptors per
// environment). Not set: pid 1 inherits the creator's.
void setEnvironmentOpenFilesLimit(const struct rlimit& limit);

// One environment of the namespace backend: its own user, pid, mount,
// network, uts, ipc and cgroup namespaces, cgroup limits, an overlay root on
// a quota-limited volume, seccomp, Landlock and a reduced capability set,
// with moat-init as pid 1 serving the guest protocol on controlFd().
class Environment {
 public:
  // `userNamespace`: one made ahead (isolation::namespaces::readyUserNamespace),
  // taken over with its id range instead of making one; ignored (and
  // dropped) by a create from a snapshot, whose range the snapshot decides.
  static Result<std::unique_ptr<Environment>> create(
      const EnvironmentSpec& spec,
      std::optional<isolation::namespaces::ReadyUserNamespace> userNamespace = std::nullopt);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  const std::string& id() const { return id_; }
  // The guest protocol connection; moat-init's Hello is the first frame.
  int controlFd() const { return control_.get(); }
  // Hands the connection over (to moatd); destroy() still kills pid 1.
  UniqueFd releaseControl() { return std::move(control_); }
  // A fresh control connection to moat-init, which drops the old one
  // (reattachable environments only).
  Result<UniqueFd> reconnect();
  // pid 1's network namespace: where moatd plugs an egress link in.
  Result<UniqueFd> networkNamespace() const;
  // A read-only snapshot of the writable layer, named `name` in the storage
  // pool (point in time, like a power cut: what was written is in it,
  // processes are not); returns the host uid its files' root maps to.
  Result<uint32_t> snapshot(const std::string& name) const;
  // Stops every process but pid 1 (which goes on answering file reads)
  // where it is; resume() lets them go on (docs/PAUSE.md). Idempotent.
  Status pause();
  Status resume();
  uint64_t oomKills() const { return cgroup_ ? cgroup_->oomKills() : 0; }
  isolation::cgroup::Usage usage() const { return cgroup_ ? cgroup_->usage() : isolation::cgroup::Usage{}; }
  // Kills everything inside and removes every trace outside the volume
  // directory, then the volume itself. Idempotent.
  Status destroy();

 private:
  Environment() = default;

  std::string id_;
  std::string stateDir_;
  UniqueFd control_;
  UniqueFd initPidfd_;
  pid_t initPid_ = -1;   // as the host sees it (a pause keeps it running)
  UniqueFd lock_;        // held for the environment's life; a free lock marks a leftover
  UniqueFd rendezvous_;  // reattachable: where new control connections are sent
  std::unique_ptr<isolation::cgroup::Cgroup> cgroup_;
  isolation::namespaces::IdMapLease idmap_;  // this environment's host uid/gid range
  bool haveVolume_ = false;
  bool destroyed_ = false;
};

// Removes what environments of crashed or killed moat processes left behind
// (their processes are already gone: moat-init dies with its client).
void collectLeftovers(const std::string& stateDir);

// Starts the host's LXCFS (isolation/proc/lxcfs.h) when none runs, off
// the path of a first create; says on stderr, once per process (and its
// forks), when environments will show the host's values instead. moatd
// calls it before it forks its spawner.
void prepareLimitsView();

// Where moat-init lives: MOAT_INIT, else next to the running executable.
Result<std::string> findInitBinary();

}  // namespace moat::backend::namespaces
