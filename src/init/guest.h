#pragma once

#include <cstdint>
#include <optional>

#include "common/result.h"
#include "common/unique_fd.h"
#include "init/guest_commands.h"
#include "init/identity_keeper.h"

// moat-init as the pid 1 of a microVM guest (`moat-init --guest`, started by
// the kernel from the initramfs moat writes, backend/microvm/): it makes
// the guest's root file system and finds its control connection, then
// serves the guest protocol as in every environment.
namespace moat::init {

// What the initramfs holds, where moat-init reads it.
inline constexpr const char* kGuestModuleList = "/moat/modules";  // module files, one per line, in load order
inline constexpr const char* kGuestPortName = "moat";             // the virtio-serial port of the control connection
// The serial numbers of the guest's disks (virtio-blk), found by them
// rather than by the order the kernel probed them in: the template's image,
// and the writable layer's disk when the host gives one
// (MOAT_GUEST_DISK=1 on the kernel's command line; else a tmpfs).
inline constexpr const char* kGuestRootSerial = "moat-root";
inline constexpr const char* kGuestDiskSerial = "moat-disk";

// The guest's one network device, on QEMU's user-mode network (the host
// side names the same addresses on QEMU's command line): every connection
// the guest makes, QEMU makes from its own network namespace, where
// moatd's egress link is when the environment has a network policy, and
// nothing when it has none (docs/MICROVM.md, "Network"). Host byte order.
inline constexpr const char* kGuestNic = "eth0";
inline constexpr uint32_t kGuestNetwork = 0x0a000200;  // 10.0.2.0/24
inline constexpr uint8_t kGuestPrefixLen = 24;
inline constexpr uint32_t kGuestGateway = 0x0a000202;  // 10.0.2.2: QEMU
inline constexpr uint32_t kGuestAddress = 0x0a00020f;  // 10.0.2.15

// In the initramfs, as pid 1: mounts /proc, /sys and /dev; loads the
// modules; brings up loopback and kGuestNic with kGuestAddress; finds the control connection once the host has it open;
// with MOAT_GUEST_PARK=1 on the kernel's command line, says kParked there and waits for kResume (its identity and
// limits: a saved guest is parked here); makes the root (the template's image, read-only, under an overlay whose
// writable layer is the ext4 file system on the host's disk with MOAT_GUEST_DISK=1, else a tmpfs of MOAT_GUEST_STORAGE
// bytes, or Resume's) and switches to it; makes the commands' cgroup, their
// tasks bounded (MOAT_GUEST_PIDS, or Resume's); keeps MOAT_GUEST_CAPS.
struct Guest {
  UniqueFd control;  // the control connection
  std::optional<GuestCommands> commands;
  IdentityKeeper identity;  // started before the capabilities went
  UniqueFd upperLayer;      // its overlay's writable layer (a directory)
  UniqueFd lowerLayer;      // its root image, mounted
};
Result<Guest> prepareGuest();

}  // namespace moat::init
