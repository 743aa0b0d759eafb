#pragma once

#include <linux/filter.h>

#include <vector>

#include "common/result.h"

// Capabilities, seccomp and Landlock: the calls that shrink what a process may do.
namespace moat::os {

int lastCapability();
// Drops every capability not in `keep` from the bounding set and clears the
// inheritable and ambient sets.
Status restrictCapabilities(const std::vector<int>& keep);
// Installs a classic-BPF seccomp filter (needs no_new_privs first).
Status installSeccomp(const std::vector<sock_filter>& program, bool allThreads = false);
// Landlock ABI version, or 0 when the kernel has none.
int landlockAbi();
// Confines signals and abstract unix sockets to the caller's Landlock domain
// (ABI >= 6). Returns false when the kernel cannot do it.
Result<bool> landlockScopeSelf();

}  // namespace moat::os
