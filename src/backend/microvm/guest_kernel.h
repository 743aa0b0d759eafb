#pragma once

#include <string>
#include <vector>

#include "common/result.h"

// The kernel a microVM guest boots: the host's own distribution kernel (on
// Debian, linux-image-cloud-amd64: virtio drivers as modules), or the one
// MOAT_GUEST_KERNEL names. moat builds no kernel.
namespace moat::backend::microvm {

struct GuestKernel {
  std::string image;       // /boot/vmlinuz-VERSION
  std::string version;     // VERSION
  std::string modulesDir;  // /lib/modules/VERSION (may not exist: drivers built in)
};

// MOAT_GUEST_KERNEL (a vmlinuz-VERSION path), else the newest
// /boot/vmlinuz-*; an error naming what to install when there is none.
Result<GuestKernel> findGuestKernel();

// What a guest loads before its root and control connection exist.
const std::vector<std::string>& guestModules();

// The module files (paths relative to the modules directory) that loading
// `wanted` takes, each after what it depends on, from the text of
// modules.dep. A wanted module modules.dep does not list is taken as built
// in. An error for a line it cannot read.
Result<std::vector<std::string>> moduleLoadOrder(const std::string& modulesDep, const std::vector<std::string>& wanted);

}  // namespace moat::backend::microvm
