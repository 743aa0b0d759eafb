#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/microvm/vm.h"
#include "cli/run_options.h"
#include "common/result.h"
#include "isolation/cgroup/cgroup.h"
#include "isolation/namespaces/user_namespace.h"
#include "os/file_lock.h"

// `moat run --isolation microvm`: the command in a microVM guest
// (docs/MICROVM.md) instead of namespaces. The guest protocol is the same,
// so run.cc supervises the command alike.
namespace moat::cli {

class MicroVmRun {
 public:
  // Builds the template's root image, boots the guest (QEMU as a host id
  // range's root, jailed by no_new_privs and its sandbox) and sends
  // `firstFrames` (the command's Spawn).
  static Result<std::unique_ptr<MicroVmRun>> start(const RunOptions& options, const std::string& firstFrames);
  ~MicroVmRun();  // QEMU killed, its cgroup and directory removed, its ids given back

  int control() const { return vm_->control(); }
  std::string consoleTail() const { return vm_->consoleTail(); }

 private:
  MicroVmRun() = default;
  std::string dir_;
  os::FileLock held_;  // vms/run-ID.lock: while held, dir_ is this run's
  std::optional<isolation::namespaces::IdMapLease> ids_;
  std::unique_ptr<isolation::cgroup::Cgroup> cgroup_;  // QEMU's (removed after it is reaped)
  std::optional<backend::microvm::Vm> vm_;
};

}  // namespace moat::cli
