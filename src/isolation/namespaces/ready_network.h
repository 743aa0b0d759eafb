#pragma once

#include <optional>
#include <string>

#include "common/result.h"
#include "common/unique_fd.h"

// Network namespaces made ahead of the environments that join them. Making
// one (the kernel's per-namespace set-up, then its loopback up) is ~1 ms
// here, the largest single step of an environment's start.
namespace moat::isolation::namespaces {

// A new network namespace with its loopback up, as an environment's starts.
// Only the calling thread enters it, and it comes back before this returns.
Result<UniqueFd> readyNetwork();

// One such namespace kept for the next `moat run` on this host, as an nsfs
// bind mount at <dir>/ready (root's directory, 0700), named in
// <dir>/ready.id. A run takes it under <dir>/ready.lock: it clears the name
// (a copy of the mount in another mount namespace is then no longer handed
// out) and unmounts it, so the run holds the only reference and the
// namespace ends with the environment; never shared, never used twice. The run then
// makes the next one while its command runs, off the start-up path. A run
// that finds none (the first one, or one beside another run) gets a new
// namespace from its clone as before.
inline constexpr const char* kReadyNetworkDir = "/run/moat/netns";

// The ready namespace, or nothing (none ready, someone else at the slot, or
// the slot holds something that is not a network namespace).
std::optional<UniqueFd> takeReadyNetwork(const std::string& dir = kReadyNetworkDir);

// Makes the next one unless one is ready or another process is at the slot.
Status makeReadyNetwork(const std::string& dir = kReadyNetworkDir);

}  // namespace moat::isolation::namespaces
