#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

// The exec gate's kernel side: a seccomp filter that hands every execve and
// execveat of the calling process and its descendants to a listener
// (SECCOMP_RET_USER_NOTIF), and what the listener needs to judge and answer.
namespace moat::os {

// Installs the filter on the calling process (before it has other threads)
// and returns the listener. The process needs no_new_privs. alsoStatfs:
// statfs and fstatfs go to the same listener (the kernel allows one
// listener in a process's filters), for init/disk_view.h.
Result<UniqueFd> installExecListener(bool alsoStatfs = false);
// The third argument of a statfs or fstatfs the filters let run
// (os/statfs_notify.h's statfsUnwatched).
constexpr uint64_t kUnwatchedStatfs = 0x6d6f61742d646600;  // "moat-df"

struct ExecNotification {
  uint64_t id = 0;
  pid_t pid = 0;
  int nr = 0;  // execve or execveat
  uint64_t args[6] = {};
};
// Reads the next notification (the listener polled readable). ENOENT: the
// process went meanwhile (nothing to answer).
Result<ExecNotification> receiveExecNotification(int listener);
// Lets the exec go on (the kernel then re-reads its arguments: a process
// racing the check can change them), or fails it with `err`.
Status answerExecNotification(int listener, uint64_t id, bool allow, int err = EPERM);
// Whether the notification still stands for the same process (its pid was
// not reused since what was read of it).
bool execNotificationValid(int listener, uint64_t id);

// Up to `len` bytes of another process's memory at `addr`, fewer where its
// mapping ends (process_vm_readv transfers whole iovec elements only, so the
// read is split where each page ends). -1 with errno on failure.
ssize_t readProcessMemory(pid_t pid, uint64_t addr, void* out, size_t len);

struct ExecAttempt {
  std::string filename;  // the file it names (fexecve: the descriptor's file)
  std::vector<std::string> argv;
  // The name the kernel will give the new program (its AT_EXECFN): the path
  // as passed, or "/dev/fd/N[/path]" for one relative to a descriptor.
  std::string execFn;
  // The same file as moat-init reaches it: /proc/PID/{root,cwd,fd/N}/...
  std::string procPath;
  bool viaDescriptor = false;  // fexecve: `filename` is the descriptor's file's name
};
// What the exec asked for, read from the process's memory (process_vm_readv),
// whole: an argv longer than the kernel takes is an error (E2BIG).
Result<ExecAttempt> readExecAttempt(const ExecNotification& n);
// "pid comm" of the process's parent, its parent's, ... up to pid 1 (at
// most `depth`).
std::vector<std::string> parentChain(pid_t pid, int depth = 8);

}  // namespace moat::os
