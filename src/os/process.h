#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

// Process and namespace primitives (clone3, pidfd, setns, ids).
namespace moat::os {

struct CloneOptions {
  uint64_t flags = 0;  // CLONE_NEW* and friends; CLONE_PIDFD is always added
  int cgroupFd = -1;   // with CLONE_INTO_CGROUP
};

struct Child {
  pid_t pid = -1;  // 0 in the child
  UniqueFd pidfd;  // parent only
};

// fork-like clone3: returns pid 0 in the child, which continues with a copy
// of the address space but none of glibc's fork handling: in a process
// with threads, the child may make only async-signal-safe calls (no
// allocation, no locks, no stdio) until it execs or exits.
Result<Child> clone3(const CloneOptions& options);

// clone3 with CLONE_VM | CLONE_VFORK: the child runs `fn(arg)` on a stack
// of its own, in the caller's memory, while the calling thread waits until
// it execs or exits. Nothing of the address space is copied and neither
// side takes copy-on-write faults afterwards (for a 4 MB process on this
// VM, fork + exec + wait 1.6 ms, this 0.7 ms). `fn` must end in an exec or
// _exit; what it allocates and does not free stays allocated in the
// caller, and per-process state of the memory (PR_SET_DUMPABLE, mappings)
// is the caller's. Where no trampoline exists for the architecture, a
// fork-like clone3 runs `fn` instead (same contract, slower).
Result<Child> cloneVfork(const CloneOptions& options, int (*fn)(void*), void* arg);

// A light child sharing the caller's memory (CLONE_VM) that runs `fn(arg)`
// on its own small stack and exits with its return value: no address space
// copy, for short-lived helpers such as a user namespace holder. `fn` must
// only make syscalls (no allocation, no locks).
Result<Child> cloneLight(uint64_t flags, int (*fn)(void*), void* arg);

// Waits for the child behind pidfd; returns the wait status (as waitpid).
Result<int> waitPidfd(int pidfd);
Status pidfdSendSignal(int pidfd, int signo);
// A pidfd for an existing process (pidfd_open); ESRCH when it is gone.
Result<UniqueFd> pidfdOpen(pid_t pid);
// True once the process behind pidfd has exited (a poll that does not wait).
bool pidfdExited(int pidfd);
// The wait status (as waitpid's) of the child behind pidfd once it has
// exited, waiting up to `waitMs` for that; nullopt while it runs. It is
// left unreaped (WNOWAIT): its owner still waits for it.
std::optional<int> exitStatusOf(int pidfd, int waitMs);
// The CPUs the calling thread may run on (sched_getaffinity).
Result<std::vector<int>> cpuAffinity();
// Restricts the calling thread (and what it forks from then on) to `cpus`
// by a raw system call: async-signal-safe, for a vforked child.
Status setCpuAffinity(const std::vector<int>& cpus);
// The network namespace of the process behind pidfd (an nsfs fd).
Result<UniqueFd> networkNamespaceOf(int pidfd);

Status setNamespace(int fd, int nstype);
Status unshareNamespaces(int flags);
Status setHostname(const std::string& name);
// fork(2) of a process with one thread: 0 in the child, its pid in the parent.
Result<pid_t> forkProcess();
// Become uid/gid `id` in the current user namespace and drop supplementary
// groups: the calling thread only, by raw system calls (switchIdsInChild),
// for a child that may share the memory, and so glibc's list of threads,
// of its creator.
Status becomeId(uid_t uid, gid_t gid);
Status closeFrom(int lowest);
// Marks every descriptor from `lowest` on close-on-exec (close_range).
// Returns 0 or errno; async-signal-safe.
int markCloseOnExecFrom(int lowest);
// becomeId for a vforked child of a process with threads: raw system calls,
// because glibc's wrappers apply an id change to every thread of the
// process, and the child would reach its parent's threads. Returns 0 or the
// errno of the step that failed; async-signal-safe.
int switchIdsInChild(uid_t uid, gid_t gid);
// Drops `cap` from the calling thread's bounding, permitted, effective and
// inheritable sets, by raw system calls (a vforked child's own credentials
// only). Returns 0 or the errno of the step that failed; async-signal-safe.
int dropCapabilityInChild(int cap);
Status setNoNewPrivs();
Status setDumpable(bool dumpable);
Status setParentDeathSignal(int signo);
// RLIMIT_NOFILE: raises the soft limit to the hard one, and the hard one
// to `wanted` when it is lower and the caller may (CAP_SYS_RESOURCE; never
// past /proc/sys/fs/nr_open); returns the limits as they were; sets them
// back.
Result<struct rlimit> raiseOpenFilesLimit(rlim_t wanted = 0);
// RLIMIT_NOFILE as it is now.
Result<struct rlimit> openFilesLimit();
Status setOpenFilesLimit(const struct rlimit& limit);
// The machine's memory in MiB (sysinfo); 1024 when it cannot be read.
uint64_t totalMemoryMb();
// execveat(fd, "", argv, envp, AT_EMPTY_PATH); returns only on failure.
// Null-terminated arrays made beforehand: nothing allocated on the way to
// the exec (for a cloneVfork child, whose allocations the caller keeps).
Error execFd(int fd, char* const argv[], char* const env[]);

std::string describeWaitStatus(int status);

// Runs `work` in a forked child (of a process whose other threads it need
// not meet: a CLI's, or one that only reads after) and returns what it
// returned, its error's message carried back through a pipe. For what must
// not happen in this process: dropping to another user, entering a
// namespace that should end with the child.
// `limit` (0: none): a child not done by then is killed, and the answer is
// kTimeout.
Status runInChild(const std::function<Status()>& work, std::chrono::milliseconds limit = std::chrono::milliseconds(0));

// Writes "<prefix><step>: <errno's name>\n" to fd, for a child that failed
// before its exec to say why where its parent will look (a console log).
// Async-signal-safe.
void reportInChild(int fd, const char* prefix, const char* step, int err);

// Every signal back to its default action and unblocked, including the
// real-time ones glibc reserves (32, 33), which sigaction(3) refuses to
// touch: ignored signals survive exec, so a command would inherit them.
// Async-signal-safe (vfork children call it).
void resetSignals();

// While it lives, the calling thread holds off the signals that end a
// command from its terminal or its supervisor (SIGINT, SIGTERM, SIGHUP,
// SIGQUIT): work that must not stop half done (a key made and not yet
// saved) finishes, and one that came meanwhile acts when it goes (after
// stdout and stderr are flushed).
class TerminationSignalsHeld {
 public:
  TerminationSignalsHeld();
  ~TerminationSignalsHeld();
  TerminationSignalsHeld(const TerminationSignalsHeld&) = delete;
  TerminationSignalsHeld& operator=(const TerminationSignalsHeld&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace moat::os
