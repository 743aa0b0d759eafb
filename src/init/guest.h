#pragma once

#include "common/result.h"
#include "common/unique_fd.h"

// moat-init as the pid 1 of a microVM guest (`moat-init --guest`, started by
// the kernel from the initramfs moat writes, backend/microvm/): it makes
// the guest's root file system and finds its control connection, then
// serves the guest protocol as in every environment.
namespace moat::init {

// What the initramfs holds, where moat-init reads it.
inline constexpr const char* kGuestModuleList = "/moat/modules";  // module files, one per line, in load order
inline constexpr const char* kGuestPortName = "moat";             // the virtio-serial port of the control connection

// In the initramfs, as pid 1: mounts /proc, /sys and /dev; loads the
// modules; finds the control connection once the host has it open; with
// MOAT_GUEST_PARK=1 on the kernel's command line, says kParked there and
// waits for kResume (its identity and limits: a saved guest is parked
// here); makes the root (the template's image on the first disk,
// read-only, under an overlay whose writable layer is a tmpfs of
// MOAT_GUEST_STORAGE bytes, or Resume's) and switches to it; bounds the
// commands' tasks (MOAT_GUEST_PIDS, or Resume's); keeps MOAT_GUEST_CAPS.
// Returns the control connection.
Result<UniqueFd> prepareGuest();

}  // namespace moat::init
