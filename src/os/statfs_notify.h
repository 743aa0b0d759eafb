#pragma once

#include <sys/statfs.h>
#include <sys/types.h>

#include <cstdint>

#include "common/result.h"
#include "common/unique_fd.h"
#include "os/exec_notify.h"

// The kernel side of an environment's `df`: a seccomp filter that hands
// every statfs and fstatfs of the calling process and its descendants to a
// listener, which answers some of them itself (docs/SECURITY.md, "Limits
// inside") and lets the rest run as they would.
namespace moat::os {

// Installs the filter on the calling process and returns the listener, for
// a process without the exec gate (whose listener takes these calls too:
// installExecListener(true)). The process needs no_new_privs.
// Notifications are read with receiveExecNotification (the same
// seccomp_notif).
Result<UniqueFd> installStatfsListener();

// statfs and fstatfs that the filter lets through (a third argument it
// checks for: kUnwatched), for moat-init's own calls, which would
// otherwise wait for moat-init. A process inside that passes it too gets
// the real answer, as without the filter: nothing to gain.
constexpr uint64_t kUnwatched = kUnwatchedStatfs;
int statfsUnwatched(const char* path, struct statfs* out);
int fstatfsUnwatched(int fd, struct statfs* out);

// Whether a notification is for statfs or fstatfs.
bool isStatfsCall(int nr);

// The file system the call asks about: statfs of /proc/TID/{root,cwd}/PATH
// (resolved with the caller's fsuid, fsgid and groups, on this thread only,
// so that a path the caller may not reach stays an error) or of
// /proc/TID/fd/N (a file it holds). An error on any doubt (the path
// unreadable or unreachable, too long, empty; a negative descriptor): the
// caller then lets the call run, and the kernel answers as for anyone.
Result<struct statfs> statfsAsCalled(const ExecNotification& n);

// Writes `answer` where the call's buffer is (through /proc/TID/mem, opened
// before the notification is checked to be still the caller's) and
// answers the call with 0. Fails without answering when the buffer cannot be
// written whole or the caller went: the caller then lets the call run
// (which faults as the kernel would, or answers nobody).
Status answerStatfs(int listener, const ExecNotification& n, const struct statfs& answer);

// The number in a sysfs attribute (btrfs's qgroup counters), read from its
// start again on each call.
Result<uint64_t> readSysfsNumber(int fd);

}  // namespace moat::os
