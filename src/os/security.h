#pragma once

#include <linux/filter.h>

#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

// Capabilities, seccomp and Landlock: the calls that shrink what a process may do.
namespace moat::os {

int lastCapability();
// Drops every capability not in `keep` from the bounding set and clears the
// inheritable and ambient sets.
Status restrictCapabilities(const std::vector<int>& keep);
// Installs a classic-BPF seccomp filter (needs no_new_privs first).
Status installSeccomp(const std::vector<sock_filter>& program, bool allThreads = false);
// The same for a forked child before its exec (async-signal-safe: nothing
// allocated): 0 or the errno.
int installSeccompInChild(const sock_fprog& program);
// Landlock ABI version, or 0 when the kernel has none.
int landlockAbi();
// Whether seccomp filters may hand system calls to a supervisor
// (SECCOMP_RET_USER_NOTIF; the exec gate and the disk view need it).
bool seccompUserNotifAvailable();
// Confines signals and abstract unix sockets to the caller's Landlock domain
// (ABI >= 6). Returns false when the kernel cannot do it.
Result<bool> landlockScopeSelf();

// A Landlock ruleset that handles every file-system access right this
// kernel knows and allows only `rules`: each a descriptor (O_PATH will do)
// of a directory (the right for everything beneath it) or a file, and the
// LANDLOCK_ACCESS_FS_* rights there (a file's are cut to those a file can
// have). For a child to restrict itself to before an exec (ToolRun).
// "unsupported" when the kernel has no Landlock.
struct LandlockRule {
  int fd;
  uint64_t access;
};
Result<UniqueFd> landlockFileRuleset(const std::vector<LandlockRule>& rules);
// Restricts the calling process to `ruleset` (no_new_privs must be set).
// Async-signal-safe, for a forked child: 0 or the errno.
int landlockRestrictInChild(int ruleset);

}  // namespace moat::os
