#include "os/process.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/sanitizer.h"
#include "os/file.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace moat::os {
namespace {

// clone3's arguments for `options`, the child's pidfd going to *pidfd.
struct clone_args cloneArgs(const CloneOptions& options, int* pidfd) {
  struct clone_args args;
  std::memset(&args, 0, sizeof args);
  args.flags = options.flags | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(pidfd);
  args.exit_signal = SIGCHLD;
  if (options.cgroupFd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<uint64_t>(options.cgroupFd);
  }
  return args;
}

}  // namespace

Result<Child> clone3(const CloneOptions& options) {
  int pidfd = -1;
  struct clone_args args = cloneArgs(options, &pidfd);
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid < 0) return Error::fromErrno("clone3");
  Child child;
  child.pid = static_cast<pid_t>(pid);
  if (pid > 0) child.pidfd.reset(pidfd);
  return child;
}

// x86-64 only. Not under AddressSanitizer: it does not know the child's
// stack, warns on the child's first noreturn call (into the environment's
// output) and may report false positives; sanitized builds fork instead.
#if defined(__x86_64__) && !MOAT_ASAN
#define MOAT_VFORK_TRAMPOLINE 1
#else
#define MOAT_VFORK_TRAMPOLINE 0
#endif

#if MOAT_VFORK_TRAMPOLINE
namespace {

// Calls clone3; in the child (on its new stack) calls fn(arg) and exits
// with its result, never returning into the caller's frames.
long clone3Run(struct clone_args* args, int (*fn)(void*), void* arg) {
  register long rax asm("rax") = SYS_clone3;
  register struct clone_args* rdi asm("rdi") = args;
  register size_t rsi asm("rsi") = sizeof *args;
  register int (*r12)(void*) asm("r12") = fn;
  register void* r13 asm("r13") = arg;
  asm volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"  // the child: an outermost frame on its own stack
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov %[exit], %%eax\n\t"
      "syscall\n\t"
      "hlt\n"
      "1:"
      : "+r"(rax)
      : "r"(rdi), "r"(rsi), "r"(r12), "r"(r13), [exit] "i"(SYS_exit)
      : "rcx", "r11", "memory");
  return rax;
}

}  // namespace
#endif

Result<Child> cloneVfork(const CloneOptions& options, int (*fn)(void*), void* arg) {
#if MOAT_VFORK_TRAMPOLINE
  constexpr size_t kStackSize = 256 * 1024;
  // One per thread that makes children, made once; the child is done with
  // it (exec or exit) before the thread can call again.
  thread_local void* stack = nullptr;
  if (stack == nullptr) {
    void* p = ::mmap(nullptr, kStackSize, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Error::fromErrno("mmap a stack for clone3");
    stack = p;
  }
  int pidfd = -1;
  struct clone_args args = cloneArgs(options, &pidfd);
  args.flags |= CLONE_VM | CLONE_VFORK;
  args.stack = reinterpret_cast<uint64_t>(stack);
  args.stack_size = kStackSize;
  long pid = clone3Run(&args, fn, arg);
  if (pid < 0) return Error::fromErrno("clone3", static_cast<int>(-pid));
  Child child;
  child.pid = static_cast<pid_t>(pid);
  child.pidfd.reset(pidfd);
  return child;
#else
  MOAT_ASSIGN(Child child, clone3(options));
  if (child.pid == 0) ::_exit(fn(arg));
  return child;
#endif
}

Result<Child> cloneLight(uint64_t flags, int (*fn)(void*), void* arg) {
  constexpr size_t kStackSize = 64 * 1024;
  // Static, so it outlives this call; the helpers are short-lived and the
  // caller waits for each before making the next.
  alignas(16) static char stack[kStackSize];
  int pidfd = -1;
  int pid = ::clone(fn, stack + kStackSize, static_cast<int>(flags) | CLONE_VM | CLONE_PIDFD | SIGCHLD, arg, &pidfd);
  if (pid < 0) return Error::fromErrno("clone");
  Child child;
  child.pid = pid;
  child.pidfd.reset(pidfd);
  return child;
}

Result<int> waitPidfd(int pidfd) {
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  for (;;) {
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED) == 0) break;
    if (errno != EINTR) return Error::fromErrno("waitid");
  }
  if (info.si_code == CLD_EXITED) return (info.si_status & 0xff) << 8;
  return info.si_status & 0x7f;  // killed or dumped: the signal number
}

Status pidfdSendSignal(int pidfd, int signo) {
  if (::syscall(SYS_pidfd_send_signal, pidfd, signo, nullptr, 0) != 0 && errno != ESRCH) {
    return Error::fromErrno("pidfd_send_signal");
  }
  return {};
}

Result<UniqueFd> pidfdOpen(pid_t pid) {
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) return Error::fromErrno("pidfd_open " + std::to_string(pid));
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return UniqueFd(static_cast<int>(fd));
}

bool pidfdExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;  // readable once it exited; an error counts as gone
}

std::optional<int> exitStatusOf(int pidfd, int waitMs) {
  pollfd p{pidfd, POLLIN, 0};
  while (::poll(&p, 1, waitMs) < 0 && errno == EINTR) {
  }
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno != EINTR) return std::nullopt;
  }
  if (info.si_pid == 0) return std::nullopt;  // still running
  if (info.si_code == CLD_EXITED) return (info.si_status & 0xff) << 8;
  return info.si_status & 0x7f;
}

Result<std::vector<int>> cpuAffinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return Error::fromErrno("sched_getaffinity");
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

Status setCpuAffinity(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  if (::syscall(SYS_sched_setaffinity, 0, sizeof set, &set) != 0) return Error::fromErrno("sched_setaffinity");
  return {};
}

Status setNamespace(int fd, int nstype) {
  if (::setns(fd, nstype) != 0) return Error::fromErrno("setns");
  return {};
}

Status unshareNamespaces(int flags) {
  if (::unshare(flags) != 0) return Error::fromErrno("unshare");
  return {};
}

Status setHostname(const std::string& name) {
  if (::sethostname(name.data(), name.size()) != 0) return Error::fromErrno("sethostname");
  return {};
}

Result<pid_t> forkProcess() {
  const pid_t pid = ::fork();
  if (pid < 0) return Error::fromErrno("fork");
  return pid;
}

Status becomeId(uid_t uid, gid_t gid) {
  if (int err = switchIdsInChild(uid, gid)) return Error::fromErrno("set uid and gid", err);
  return {};
}

Status closeFrom(int lowest) {
  if (::syscall(SYS_close_range, lowest, ~0U, 0) != 0) return Error::fromErrno("close_range");
  return {};
}

int markCloseOnExecFrom(int lowest) {
  return ::syscall(SYS_close_range, lowest, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */) == 0 ? 0 : errno;
}

int dropCapabilityInChild(int cap) {
  if (::syscall(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) return errno;
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (::syscall(SYS_capget, &header, data) != 0) return errno;
  const int word = cap / 32;
  const uint32_t bit = 1u << (cap % 32);
  data[word].permitted &= ~bit;
  data[word].effective &= ~bit;
  data[word].inheritable &= ~bit;
  if (::syscall(SYS_capset, &header, data) != 0) return errno;
  return 0;
}

int switchIdsInChild(uid_t uid, gid_t gid) {
  if (::syscall(SYS_setgroups, 0, nullptr) != 0) return errno;
  if (::syscall(SYS_setresgid, gid, gid, gid) != 0) return errno;
  if (::syscall(SYS_setresuid, uid, uid, uid) != 0) return errno;
  return 0;
}

Status setNoNewPrivs() {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Error::fromErrno("prctl NO_NEW_PRIVS");
  return {};
}

Status setDumpable(bool dumpable) {
  if (::prctl(PR_SET_DUMPABLE, dumpable ? 1 : 0, 0, 0, 0) != 0) {
    return Error::fromErrno("prctl SET_DUMPABLE");
  }
  return {};
}

Status setParentDeathSignal(int signo) {
  if (::prctl(PR_SET_PDEATHSIG, signo, 0, 0, 0) != 0) return Error::fromErrno("prctl PDEATHSIG");
  return {};
}

Result<struct rlimit> raiseOpenFilesLimit(rlim_t wanted) {
  struct rlimit before;
  if (::getrlimit(RLIMIT_NOFILE, &before) != 0) return Error::fromErrno("getrlimit NOFILE");
  if (wanted > before.rlim_max && before.rlim_max != RLIM_INFINITY) {
    rlim_t most = before.rlim_max;
    if (auto text = readFile("/proc/sys/fs/nr_open", 64); text.ok()) {
      most = std::max<rlim_t>(most, std::strtoull(text->c_str(), nullptr, 10));
    }
    const rlim_t to = std::min(wanted, most);
    struct rlimit higher = {to, to};
    if (::setrlimit(RLIMIT_NOFILE, &higher) == 0) return before;  // else (EPERM): the hard limit as it is
  }
  struct rlimit raised = {before.rlim_max, before.rlim_max};
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) return Error::fromErrno("setrlimit NOFILE");
  return before;
}

Result<struct rlimit> openFilesLimit() {
  struct rlimit now;
  if (::getrlimit(RLIMIT_NOFILE, &now) != 0) return Error::fromErrno("getrlimit NOFILE");
  return now;
}

Status setOpenFilesLimit(const struct rlimit& limit) {
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return Error::fromErrno("setrlimit NOFILE");
  return {};
}

Error execFd(int fd, char* const argv[], char* const env[]) {
  ::syscall(SYS_execveat, fd, "", argv, env, AT_EMPTY_PATH);
  return Error::fromErrno("execveat moat-init");
}

void reportInChild(int fd, const char* prefix, const char* step, int err) {
  const char* name = ::strerrorname_np(err);  // a table's entry: nothing allocated
  for (const char* part : {prefix, step, ": ", name != nullptr ? name : "an unknown error", "\n"}) {
    (void)!::write(fd, part, std::strlen(part));
  }
}

TerminationSignalsHeld::TerminationSignalsHeld() {
  sigset_t held;
  sigemptyset(&held);
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&held, signo);
  ::pthread_sigmask(SIG_BLOCK, &held, &previous_);
}

TerminationSignalsHeld::~TerminationSignalsHeld() {
  // A held signal may end the process the moment it is let through: what
  // it printed meanwhile goes out first.
  std::fflush(stdout);
  std::fflush(stderr);
  ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

void resetSignals() {
  struct KernelSigaction {
    void* handler;
    unsigned long flags;
    void* restorer;
    uint64_t mask;
  } act{};  // SIG_DFL is 0
  for (int sig = 1; sig <= 64; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    ::syscall(SYS_rt_sigaction, sig, &act, nullptr, sizeof(uint64_t));
  }
  uint64_t none = 0;
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, nullptr, sizeof none);
}

std::string describeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + ::strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

Result<UniqueFd> networkNamespaceOf(int pidfd) {
  // The pid from the pidfd's fdinfo, then /proc (PIDFD_GET_NET_NAMESPACE
  // needs 6.11). An open pidfd does not keep its pid from being reused once
  // the process is reaped: the process must still be alive after the open,
  // or the namespace opened may be another process's.
  std::string info;
  {
    UniqueFd f(::open(("/proc/self/fdinfo/" + std::to_string(pidfd)).c_str(), O_RDONLY | O_CLOEXEC));
    if (!f) return Error::fromErrno("open fdinfo of pidfd");
    char buf[1024];
    ssize_t n = ::read(f.get(), buf, sizeof buf);
    if (n <= 0) return Error::fromErrno("read fdinfo of pidfd");
    info.assign(buf, static_cast<size_t>(n));
  }
  auto at = info.find("Pid:\t");
  if (at == std::string::npos) return Error::make(Code::kNotFound, "pidfd has no Pid in fdinfo");
  long pid = std::strtol(info.c_str() + at + 5, nullptr, 10);
  if (pid <= 0) return Error::make(Code::kNotFound, "the process behind the pidfd has exited");
  UniqueFd ns(::open(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns) return Error::fromErrno("open /proc/" + std::to_string(pid) + "/ns/net");
  if (::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) != 0) {
    return Error::make(Code::kNotFound, "the process behind the pidfd has exited");
  }
  return ns;
}

uint64_t totalMemoryMb() {
  struct sysinfo info;
  if (::sysinfo(&info) != 0) return 1024;
  return static_cast<uint64_t>(info.totalram) * info.mem_unit / (1024 * 1024);
}

Status runInChild(const std::function<Status()>& work, std::chrono::milliseconds limit) {
  int pipeFds[2];
  if (::pipe2(pipeFds, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  UniqueFd readEnd(pipeFds[0]), writeEnd(pipeFds[1]);
  pid_t pid = ::fork();
  if (pid < 0) return Error::fromErrno("fork");
  if (pid == 0) {
    readEnd.reset();
    Status s = work();
    std::string message = s.ok() ? "" : s.error().message();
    if (!s.ok() && message.empty()) message = "failed";
    (void)!::write(writeEnd.get(), message.data(), message.size());
    ::_exit(s.ok() ? 0 : 1);
  }
  writeEnd.reset();
  std::string message;
  char buffer[512];
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (limit.count() > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      struct pollfd p = {readEnd.get(), POLLIN, 0};
      int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        // Stopped or stuck (the user it acts as may SIGSTOP it): ended.
        ::kill(pid, SIGKILL);
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        return Error::make(Code::kTimeout, "the child did not finish within " + std::to_string(limit.count()) + " ms");
      }
    }
    ssize_t n = ::read(readEnd.get(), buffer, sizeof buffer);
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    message.append(buffer, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!message.empty()) return Error::make(Code::kSyscall, message);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Error::make(Code::kSyscall, "the child " + describeWaitStatus(status) + " without saying why");
  }
  return {};
}

}  // namespace moat::os
