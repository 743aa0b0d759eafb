#include "os/exec_notify.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

// Linux 6.6; Debian 12's headers predate them.
#ifndef SECCOMP_IOCTL_NOTIF_SET_FLAGS
#define SECCOMP_IOCTL_NOTIF_SET_FLAGS SECCOMP_IOW(4, __u64)
#endif
#ifndef SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
#define SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP (1UL << 0)
#endif

namespace moat::os {

Result<UniqueFd> installExecListener(bool alsoStatfs) {
  // Other architectures' calls are left to the environment's main filter,
  // which kills them; only x86-64's execve and execveat are handed over
  // (and statfs and fstatfs, for the disk view: a process's filters can
  // have one listener only, so both share this one).
  std::vector<struct sock_filter> code = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
  };
  std::vector<long> calls = {SYS_execve, SYS_execveat};
  if (alsoStatfs) calls.insert(calls.end(), {SYS_statfs, SYS_fstatfs});
  for (size_t i = 0; i < calls.size(); ++i) {
    // execs: to the notify return below, past the remaining checks and the
    // allow; statfs calls: to the check of their third argument after it.
    auto skip = static_cast<unsigned char>(calls.size() - i + (i >= 2 ? 1 : 0));
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(calls[i]), skip, 0));
  }
  code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF));
  if (alsoStatfs) {
    // statfs and fstatfs jump here instead: moat-init's own calls
    // (statfs_notify.h's kUnwatched as the third argument) run.
    code.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])));
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(kUnwatchedStatfs), 0, 3));
    code.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2]) + 4));
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(kUnwatchedStatfs >> 32), 0, 1));
    code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF));
  }
  struct sock_fprog prog = {static_cast<unsigned short>(code.size()), code.data()};
  long fd = ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
  if (fd < 0) return Error::fromErrno("seccomp exec listener");
  // No listener after this one: when several filters hand a call over, the
  // newest filter's listener gets it, so a process that installed its own
  // would answer its execs itself, past this one.
  struct sock_filter noMore[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_seccomp, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, SECCOMP_FILTER_FLAG_NEW_LISTENER, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog noMoreProg = {static_cast<unsigned short>(sizeof noMore / sizeof noMore[0]), noMore};
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &noMoreProg) != 0) {
    int err = errno;
    ::close(static_cast<int>(fd));
    return Error::fromErrno("seccomp: no listener after the exec gate's", err);
  }
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  // The exec'ing process waits while the listener answers: the kernel wakes
  // each on the other's CPU at once instead of through the scheduler's
  // queue (a kernel without it answers EINVAL: slower, the same).
  (void)::ioctl(static_cast<int>(fd), SECCOMP_IOCTL_NOTIF_SET_FLAGS, SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP);
  return UniqueFd(static_cast<int>(fd));
}

Result<ExecNotification> receiveExecNotification(int listener) {
  struct seccomp_notif req;
  std::memset(&req, 0, sizeof req);
  if (::ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) return Error::fromErrno("seccomp notification");
  ExecNotification n;
  n.id = req.id;
  n.pid = static_cast<pid_t>(req.pid);
  n.nr = req.data.nr;
  for (int i = 0; i < 6; ++i) n.args[i] = req.data.args[i];
  return n;
}

Status answerExecNotification(int listener, uint64_t id, bool allow, int err) {
  struct seccomp_notif_resp resp;
  std::memset(&resp, 0, sizeof resp);
  resp.id = id;
  if (allow) {
    resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
  } else {
    resp.error = -err;
  }
  if (::ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp) != 0) return Error::fromErrno("seccomp answer");
  return {};
}

bool execNotificationValid(int listener, uint64_t id) {
  return ::ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0;
}

ssize_t readProcessMemory(pid_t pid, uint64_t addr, void* out, size_t len) {
  constexpr uint64_t kPage = 4096;
  constexpr size_t kMaxPieces = 64;  // 256 KiB
  struct iovec remote[kMaxPieces];
  size_t count = 0, total = 0;
  while (total < len && count < kMaxPieces) {
    uint64_t from = addr + total;
    size_t piece = std::min<uint64_t>(len - total, kPage - from % kPage);
    remote[count++] = {reinterpret_cast<void*>(from), piece};
    total += piece;
  }
  struct iovec local {
    out, total
  };
  return ::process_vm_readv(pid, &local, 1, remote, count, 0);
}

namespace {

// More than the kernel takes (the arguments and the environment together
// get at most 3/4 of an 8 MiB stack, 6 MiB; one argument 128 KiB): an exec
// this long fails with E2BIG anyway, and every exec shorter is read whole.
constexpr size_t kMaxBytes = 8u << 20;
constexpr size_t kPointersPerRead = 512;  // one page of the argv array

// NUL-terminated strings of another process, read through a window of its
// memory: an argv's strings usually lie side by side, so one read serves
// many (and a million pointers to one string cost one read, not a million).
class RemoteStrings {
 public:
  explicit RemoteStrings(pid_t pid) : pid_(pid) {}

  // The string at `addr`, at most `room` bytes (cut to `room` when longer).
  Result<std::string> read(uint64_t addr, size_t room) {
    std::string out;
    while (out.size() < room) {
      uint64_t at = addr + out.size();
      if (at < start_ || at >= start_ + len_) MOAT_TRY(fill(at));
      size_t off = static_cast<size_t>(at - start_);
      const char* p = window_ + off;
      const char* end = static_cast<const char*>(std::memchr(p, '\0', len_ - off));
      if (end) {
        out.append(p, static_cast<size_t>(end - p));
        break;
      }
      out.append(p, len_ - off);
    }
    if (out.size() > room) out.resize(room);
    return out;
  }

 private:
  static constexpr size_t kWindow = 64u << 10;

  // Up to kWindow bytes from `at`, as far as the mapping goes.
  Status fill(uint64_t at) {
    ssize_t n = readProcessMemory(pid_, at, window_, kWindow);
    if (n <= 0) return Error::fromErrno("read exec argument", n == 0 ? EFAULT : errno);
    start_ = at;
    len_ = static_cast<size_t>(n);
    return {};
  }

  pid_t pid_;
  char window_[kWindow];
  uint64_t start_ = 0;
  size_t len_ = 0;
};

}  // namespace

Result<ExecAttempt> readExecAttempt(const ExecNotification& n) {
  const bool at = n.nr == SYS_execveat;
  uint64_t pathAddr = at ? n.args[1] : n.args[0];
  uint64_t argvAddr = at ? n.args[2] : n.args[1];
  ExecAttempt a;
  auto strings = std::make_unique<RemoteStrings>(n.pid);  // 64 KiB: not on moat-init's stack
  MOAT_ASSIGN(a.filename, strings->read(pathAddr, 4096));
  const int dirfd = static_cast<int>(n.args[0]);
  const bool emptyPath = at && a.filename.empty();  // fexecve: the descriptor's file
  const std::string proc = "/proc/" + std::to_string(n.pid);
  if (!at || dirfd == AT_FDCWD || a.filename.rfind('/', 0) == 0) {
    a.execFn = a.filename;
  } else {
    a.execFn = "/dev/fd/" + std::to_string(dirfd) + (emptyPath ? "" : "/" + a.filename);
  }
  // The file the kernel will open, from moat-init (pid 1 of the same
  // namespaces): through the process's own root, working directory or
  // descriptor, which name resolution inside starts from.
  if (emptyPath) {
    a.procPath = proc + "/fd/" + std::to_string(dirfd);
  } else if (a.filename[0] == '/') {
    a.procPath = proc + "/root" + a.filename;
  } else if (!at || dirfd == AT_FDCWD) {
    a.procPath = proc + "/cwd/" + a.filename;
  } else {
    a.procPath = proc + "/fd/" + std::to_string(dirfd) + "/" + a.filename;
  }
  if (emptyPath) {
    // The name judged is the descriptor's file's.
    a.viaDescriptor = true;
    char target[4096];
    ssize_t len = ::readlink(a.procPath.c_str(), target, sizeof target);
    if (len > 0) a.filename.assign(target, static_cast<size_t>(len));
  }
  if (!argvAddr) return a;
  size_t used = a.filename.size();
  uint64_t ptrs[kPointersPerRead];
  size_t have = 0;  // pointers in ptrs, from index `base` of the array
  size_t base = 0;
  for (size_t i = 0;; ++i) {
    if (i == base + have) {
      // The next piece of the pointer array (as much of it as is mapped).
      base = i;
      ssize_t got = readProcessMemory(n.pid, argvAddr + i * sizeof(uint64_t), ptrs, sizeof ptrs);
      if (got < static_cast<ssize_t>(sizeof(uint64_t))) {
        return Error::fromErrno("read exec argv", got < 0 ? errno : EFAULT);
      }
      have = static_cast<size_t>(got) / sizeof(uint64_t);
    }
    uint64_t ptr = ptrs[i - base];
    if (!ptr) return a;
    used += sizeof(uint64_t);
    if (used >= kMaxBytes) return Error::fromErrno("read exec argv: longer than any exec takes", E2BIG);
    size_t room = kMaxBytes - used;
    MOAT_ASSIGN(std::string arg, strings->read(ptr, room));
    if (arg.size() == room) return Error::fromErrno("read exec argv: longer than any exec takes", E2BIG);
    used += arg.size() + 1;
    a.argv.push_back(std::move(arg));
  }
}

std::vector<std::string> parentChain(pid_t pid, int depth) {
  std::vector<std::string> chain;
  for (int i = 0; i < depth && pid > 1; ++i) {
    char buf[512];
    UniqueFd stat(::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC));
    if (!stat) break;
    ssize_t n = ::read(stat.get(), buf, sizeof buf - 1);
    if (n <= 0) break;
    std::string text(buf, static_cast<size_t>(n));
    size_t open = text.find('('), close = text.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 4 > text.size()) break;
    pid_t ppid = static_cast<pid_t>(std::atoi(text.c_str() + close + 4));
    if (i > 0) chain.push_back(std::to_string(pid) + " " + text.substr(open + 1, close - open - 1));
    pid = ppid;
  }
  return chain;
}

}  // namespace moat::os
