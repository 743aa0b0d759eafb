#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/microvm/guest_kernel.h"
#include "common/result.h"
#include "common/unique_fd.h"

// One microVM: QEMU's `microvm` machine booting the guest kernel with an
// initramfs whose /init is moat-init (`--guest`), the template's root file
// system as an erofs image on its first disk, and the guest protocol on a
// virtio-serial port that QEMU connects to a unix socket of the host.
namespace moat::backend::microvm {

struct VmSpec {
  GuestKernel kernel;
  std::string initBinary;  // moat-init (static): the guest's /init
  std::string rootImage;   // buildRootImage's
  std::string workDir;     // private, the VM's own: initramfs, socket, console log
  unsigned cpus = 1;
  uint64_t memoryMb = 256;
  uint64_t storageBytes = 1ull << 30;  // the writable layer (a tmpfs in the guest's memory)
  bool kvm = false;                    // false: TCG (emulated)
  // QEMU's own ids (a host range's root, never 0 in use): it runs as them,
  // with no_new_privs and its own seccomp sandbox; workDir and its files
  // become theirs. 0: the caller's (tests that are not root).
  uid_t uid = 0;
  gid_t gid = 0;
};

// The root file system of the template directory `treeFd` (O_PATH will
// do: reached through it, not by a path that could be swapped for a link)
// as an erofs image at `image` (mkfs.erofs, erofs-utils).
Status buildRootImage(int treeFd, const std::string& image);

// The guest's initramfs: moat-init as /init, /dev/console, the modules
// guestModules() takes from the kernel's modules directory and their list.
Result<std::string> guestInitramfs(const GuestKernel& kernel, const std::string& initBinary);

// QEMU's command line for `spec`, with its files at `initramfs`, `socket`
// and `consoleLog`.
std::vector<std::string> qemuArgv(const std::string& qemu, const VmSpec& spec, const std::string& initramfs,
                                  const std::string& socket, const std::string& consoleLog);

// The TSC frequency a TCG guest is told (it cannot measure it: the microvm
// machine has no PIT to calibrate against by default): the host's, which
// TCG's TSC counts at.
uint64_t hostTscKhz();

class Vm {
 public:
  // Writes the initramfs, starts QEMU (dies with the calling thread's
  // process) and connects to its control socket.
  static Result<Vm> start(const VmSpec& spec);
  Vm(Vm&& other) noexcept
      : pid_(std::exchange(other.pid_, -1)),
        pidfd_(std::move(other.pidfd_)),
        control_(std::move(other.control_)),
        console_(std::move(other.console_)) {}
  Vm& operator=(Vm&&) = delete;
  ~Vm();  // kills QEMU and waits for it

  int control() const { return control_.get(); }
  UniqueFd takeControl() { return std::move(control_); }
  int pidfd() const { return pidfd_.get(); }
  pid_t pid() const { return pid_; }
  // The end of what the guest's console printed (the kernel's and
  // moat-init's own messages; printable characters only): why a guest that
  // ended did.
  std::string consoleTail() const;

 private:
  Vm() = default;
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  UniqueFd control_;
  UniqueFd console_;  // the console log, as moat made it
};

}  // namespace moat::backend::microvm
