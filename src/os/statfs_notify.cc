#include "os/statfs_notify.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "os/file.h"

namespace moat::os {

Result<UniqueFd> installStatfsListener() {
  // x86-64's statfs and fstatfs only (it has no statfs64): other
  // architectures' calls are the environment's main filter's, which kills
  // them.
  struct sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_statfs, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fstatfs, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      // moat-init's own (kUnwatched as the third argument) run.
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(kUnwatched), 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2]) + 4),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(kUnwatched >> 32), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  long fd = ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
  if (fd < 0) return Error::fromErrno("seccomp statfs listener");
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return UniqueFd(static_cast<int>(fd));
}

int statfsUnwatched(const char* path, struct statfs* out) {
  return static_cast<int>(::syscall(SYS_statfs, path, out, kUnwatched));
}

int fstatfsUnwatched(int fd, struct statfs* out) {
  return static_cast<int>(::syscall(SYS_fstatfs, fd, out, kUnwatched));
}

bool isStatfsCall(int nr) { return nr == SYS_statfs || nr == SYS_fstatfs; }

namespace {

// The caller's file-system identity, from /proc/TID/status: its fsuid and
// fsgid (the fourth of the Uid and Gid lines) and its groups.
struct FsCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

Result<FsCredentials> fsCredentialsOf(pid_t pid) {
  MOAT_ASSIGN(std::string status, readFile("/proc/" + std::to_string(pid) + "/status", 64 << 10));
  FsCredentials c;
  bool uid = false, gid = false;
  std::istringstream lines(status);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "Uid:" || key == "Gid:") {
      unsigned long ids[4];
      if (!(words >> ids[0] >> ids[1] >> ids[2] >> ids[3])) return Error::fromErrno("parse " + key, EINVAL);
      if (key == "Uid:") c.uid = static_cast<uid_t>(ids[3]), uid = true;
      if (key == "Gid:") c.gid = static_cast<gid_t>(ids[3]), gid = true;
    } else if (key == "Groups:") {
      for (unsigned long g; words >> g;) c.groups.push_back(static_cast<gid_t>(g));
    }
  }
  if (!uid || !gid) return Error::fromErrno("no Uid or Gid in /proc/" + std::to_string(pid) + "/status", EINVAL);
  return c;
}

// For the scope of one call, this thread (only: raw syscalls, not glibc's
// process-wide wrappers) reaches files as `c` does: fs ids and groups, and
// so without the file capabilities root has (the kernel drops them while
// the fsuid is not 0). Its own are restored at the end.
class ActingAs {
 public:
  explicit ActingAs(const FsCredentials& c) {
    // On the heap: the answering thread's stack is small (NGROUPS_MAX
    // groups are 256 KiB).
    long n = ::syscall(SYS_getgroups, 0, nullptr);
    if (n < 0) return;
    own_.resize(static_cast<size_t>(n));
    if (n > 0 && ::syscall(SYS_getgroups, n, own_.data()) != n) return;
    // Nor moat-init's CAP_SYS_PTRACE (other processes' /proc links), which
    // is not a file capability that the fsuid change drops.
    if (::syscall(SYS_capget, &capHeader_, caps_) != 0) return;
    changed_ = true;
    __user_cap_data_struct lowered[2] = {caps_[0], caps_[1]};
    lowered[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    ok_ = ::syscall(SYS_capset, &capHeader_, lowered) == 0;
    ok_ = ok_ && ::syscall(SYS_setgroups, c.groups.size(), c.groups.data()) == 0;
    ::syscall(SYS_setfsgid, c.gid);
    ::syscall(SYS_setfsuid, c.uid);
    ok_ = ok_ && static_cast<uid_t>(::syscall(SYS_setfsuid, -1)) == c.uid &&
          static_cast<gid_t>(::syscall(SYS_setfsgid, -1)) == c.gid;
  }
  ~ActingAs() {
    if (!changed_) return;
    ::syscall(SYS_setfsuid, ::getuid());
    ::syscall(SYS_setfsgid, ::getgid());
    ::syscall(SYS_setgroups, own_.size(), own_.data());
    ::syscall(SYS_capset, &capHeader_, caps_);
    // A change of fs ids makes the process as dumpable as the host's
    // fs.suid_dumpable says: moat-init stays out of reach.
    ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  }
  ActingAs(const ActingAs&) = delete;
  ActingAs& operator=(const ActingAs&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
  bool changed_ = false;
  std::vector<gid_t> own_;
  __user_cap_header_struct capHeader_ = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps_[2] = {};
};

}  // namespace

Result<struct statfs> statfsAsCalled(const ExecNotification& n) {
  const std::string proc = "/proc/" + std::to_string(n.pid);
  struct statfs st;
  if (n.nr == SYS_fstatfs) {
    // A file the caller holds: nothing to resolve.
    auto fd = static_cast<int>(n.args[0]);
    if (fd < 0) return Error::fromErrno("fstatfs descriptor", EBADF);
    const std::string path = proc + "/fd/" + std::to_string(fd);
    if (statfsUnwatched(path.c_str(), &st) != 0) return Error::fromErrno("statfs " + path);
    return st;
  }
  if (n.nr != SYS_statfs) return Error::fromErrno("not a statfs call", ENOSYS);
  char name[PATH_MAX];
  ssize_t got = readProcessMemory(n.pid, n.args[0], name, sizeof name);
  if (got <= 0) return Error::fromErrno("statfs path", got == 0 ? EFAULT : errno);
  const void* end = std::memchr(name, '\0', static_cast<size_t>(got));
  if (!end) return Error::fromErrno("statfs path", ENAMETOOLONG);
  std::string given(name, static_cast<const char*>(end) - name);
  if (given.empty()) return Error::fromErrno("statfs path", ENOENT);
  // Where the caller's resolution starts, reached with moat-init's rights
  // (a caller that changed its ids is not dumpable: its /proc entries are
  // root's only)...
  const std::string base = proc + (given[0] == '/' ? "/root" : "/cwd");
  UniqueFd start(::open(base.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!start) return Error::fromErrno("open " + base);
  size_t first = given.find_first_not_of('/');
  const std::string rest = first == std::string::npos ? "." : given.substr(first);
  // ...and the path from there with the caller's: what it may not reach (a
  // directory it may not search) stays an error, as the kernel makes it,
  // and the call then runs as it would (review finding L7).
  MOAT_ASSIGN(FsCredentials caller, fsCredentialsOf(n.pid));
  UniqueFd file;
  {
    ActingAs as(caller);
    if (!as.ok()) return Error::fromErrno("act as the caller", EPERM);
    // No /proc magic link (another process's root, cwd or descriptors),
    // and an absolute path stays under the caller's root.
    struct open_how how {};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_NO_MAGICLINKS | (given[0] == '/' ? RESOLVE_IN_ROOT : 0);
    file.reset(static_cast<int>(::syscall(SYS_openat2, start.get(), rest.c_str(), &how, sizeof how)));
    if (!file) return Error::fromErrno("open " + given + " as the caller");
  }
  if (fstatfsUnwatched(file.get(), &st) != 0) return Error::fromErrno("statfs " + given);
  return st;
}

Status answerStatfs(int listener, const ExecNotification& n, const struct statfs& answer) {
  const uint64_t addr = n.nr == SYS_fstatfs || n.nr == SYS_statfs ? n.args[1] : 0;
  if (!addr) return Error::fromErrno("statfs buffer", EFAULT);
  // The memory of the process the descriptor was opened on: checked below
  // to be the caller's (its pid not reused since the notification).
  UniqueFd mem(::open(("/proc/" + std::to_string(n.pid) + "/mem").c_str(), O_RDWR | O_CLOEXEC));
  if (!mem) return Error::fromErrno("open caller's memory");
  if (!execNotificationValid(listener, n.id)) return Error::fromErrno("statfs caller", ENOENT);
  // Through the memory file, which writes past a page's protection (as a
  // debugger's write does): a read-only buffer gets the answer where the
  // real call would fault. The caller's own memory only, which it may
  // change itself.
  ssize_t wrote = ::pwrite(mem.get(), &answer, sizeof answer, static_cast<off_t>(addr));
  if (wrote != static_cast<ssize_t>(sizeof answer)) {
    return Error::fromErrno("write statfs answer", wrote < 0 ? errno : EFAULT);
  }
  struct seccomp_notif_resp resp;
  std::memset(&resp, 0, sizeof resp);
  resp.id = n.id;
  resp.val = 0;
  resp.error = 0;
  if (::ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp) != 0) return Error::fromErrno("seccomp answer");
  return {};
}

Result<uint64_t> readSysfsNumber(int fd) {
  char buf[64];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return Error::fromErrno("read sysfs number", n == 0 ? ENODATA : errno);
  buf[n] = '\0';
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(buf, &end, 10);
  if (errno != 0 || end == buf || (*end != '\n' && *end != '\0')) return Error::fromErrno("sysfs number", EINVAL);
  return static_cast<uint64_t>(v);
}

}  // namespace moat::os
