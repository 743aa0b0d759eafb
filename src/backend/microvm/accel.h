#pragma once

#include <chrono>
#include <string>

#include "backend/microvm/guest_kernel.h"

// Which accelerator QEMU runs guests on (docs/MICROVM.md, "KVM or TCG"):
// KVM where a /dev/kvm boots a kernel, TCG (emulated) otherwise. A /dev/kvm
// that opens and answers every ioctl may still fail to run a guest (a
// nested PVM one does), so only a boot tells: the guest kernel booted under
// KVM with nothing to run, to its panic and QEMU's end.
namespace moat::backend::microvm {

struct AccelChoice {
  bool kvm = false;
  std::string why;  // what decided it, for the log and /healthz
};

struct AccelProbe {
  // /dev/kvm (QEMU 7.2 always opens that one; a test names a stand-in
  // for the checks on this side).
  std::string device = "/dev/kvm";
  // How long the probe boot may take: a kernel under KVM reaches its
  // panic in well under a second; one that cannot run stalls.
  std::chrono::milliseconds wait = std::chrono::seconds(10);
  // Where the answer is kept for the host's boot (the same device, QEMU
  // and kernel): the moatds started after the first do not boot again.
  // Empty: not kept.
  std::string keptIn = "/run/moat/kvm-probe";
};

// The names an operator may give (moatd --microvm-accel, MOAT_MICROVM_ACCEL).
inline bool accelNamed(const std::string& name) { return name == "auto" || name == "kvm" || name == "tcg"; }

// `asked`: "kvm" or "tcg" (the operator's word, taken as it is), or "auto"
// (the default): TCG when the device cannot be opened to read and write,
// else a probe boot of `kernel` by QEMU (MOAT_QEMU or qemu-system-x86_64)
// under KVM; KVM when QEMU ends by itself within the wait, TCG with the
// reason otherwise.
AccelChoice chooseAccel(const std::string& asked, const GuestKernel& kernel, const AccelProbe& probe = {});

}  // namespace moat::backend::microvm
