// moat-probe: runs inside a moat environment and tries one escape or
// forbidden action (an "attempt"), then reports what happened on one line:
//
//   blocked: <detail>   exit 0  the attempt failed, as it should
//   ESCAPED: <detail>   exit 1  the attempt succeeded: a hole in the sandbox
//   ok: <detail>        exit 0  a sanity attempt that is meant to succeed did
//   FAILED: <detail>    exit 1  ... and did not
//   usage: ...          exit 2  bad arguments
//
// Static and dependency-free (plain C++ and raw syscalls), so it runs from a
// read-only bind of the build directory in any template. Attempts that would
// change host state if they succeeded are written to be harmless then: they
// write back the value they read, pass arguments the kernel rejects only
// after its permission checks, or undo what they did before reporting.
#include <dirent.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/mount.h>
#include <linux/nsfs.h>
#include <linux/perf_event.h>
#include <linux/reboot.h>
#include <linux/sched.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/msg.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Args = std::vector<std::string>;

// <sys/mount.h> clashes with <linux/mount.h> in Debian 12's glibc.
constexpr int kMntDetach = 2;

// --- reporting ---------------------------------------------------------------

std::string oneLine(const std::string& s) {
  std::string out;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7f ? '?' : c);
  }
  return out;
}

[[noreturn]] void report(const char* verdict, const std::string& detail, int code) {
  std::printf("%s: %s\n", verdict, oneLine(detail).c_str());
  std::fflush(stdout);
  ::_exit(code);
}
[[noreturn]] void blocked(const std::string& d) { report("blocked", d, 0); }
[[noreturn]] void escaped(const std::string& d) { report("ESCAPED", d, 1); }
[[noreturn]] void okay(const std::string& d) { report("ok", d, 0); }
[[noreturn]] void failed(const std::string& d) { report("FAILED", d, 1); }
[[noreturn]] void usage(const std::string& d) { report("usage", d, 2); }

std::string errName(int err) {
  const char* name = ::strerrorname_np(err);
  return name ? name : "errno " + std::to_string(err);
}

// Collects the parts of a multi-step attempt: any escaped part makes the
// whole attempt ESCAPED.
class Outcome {
 public:
  // A refusal counts only with an errno the protecting layer gives (its
  // mount namespace: ENOENT; a read-only mount: EROFS; ...): any other
  // failure shows nothing about the layer.
  void deny(const std::string& what, int err, std::initializer_list<int> expected) {
    for (int e : expected) {
      if (err == e) {
        good_.push_back(what + " " + errName(err));
        return;
      }
    }
    std::string want;
    for (int e : expected) want += (want.empty() ? "" : " or ") + errName(e);
    escape(what + " failed with " + errName(err) + ", not " + want + " (the layer's refusal)");
  }
  void note(const std::string& what) { good_.push_back(what); }
  void escape(const std::string& what) { bad_.push_back(what); }

  // A call that must fail with one of `expected` (the errno of a permission
  // check: any other failure means the call got past the checks and only
  // stumbled over the deliberately invalid arguments).
  void call(const std::string& what, long rc, int err, std::initializer_list<int> expected) {
    if (rc >= 0) {
      escape(what + " succeeded (returned " + std::to_string(rc) + ")");
      return;
    }
    for (int e : expected) {
      if (err == e) {
        good_.push_back(what + " " + errName(err));
        return;
      }
    }
    escape(what + " got past the permission checks: failed with " + errName(err) + " instead of a denial");
  }

  [[noreturn]] void finish() const {
    if (!bad_.empty()) escaped(join(bad_) + (good_.empty() ? "" : " (blocked: " + join(good_) + ")"));
    blocked(join(good_));
  }

 private:
  static std::string join(const std::vector<std::string>& parts) {
    std::string s;
    for (const auto& p : parts) s += (s.empty() ? "" : "; ") + p;
    return s;
  }
  std::vector<std::string> good_, bad_;
};

// --- helpers -------------------------------------------------------------------

bool readFile(const std::string& path, std::string& out, int& err) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    err = errno;
    return false;
  }
  out.clear();
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (64u << 20)) break;
  }
  ::close(fd);
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  parts.push_back(cur);
  return parts;
}

std::vector<std::string> lines(const std::string& s) {
  auto v = split(s, '\n');
  if (!v.empty() && v.back().empty()) v.pop_back();
  return v;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescapeMount(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && s.size() - i > 3 && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct MountEntry {
  std::string root, mountPoint, mountOptions, fsType, source, superOptions;
};

std::vector<MountEntry> mountInfo() {
  std::string text;
  int err = 0;
  if (!readFile("/proc/self/mountinfo", text, err)) failed("read /proc/self/mountinfo: " + errName(err));
  std::vector<MountEntry> entries;
  for (const auto& line : lines(text)) {
    std::istringstream in(line);
    std::vector<std::string> f;
    std::string w;
    while (in >> w) f.push_back(w);
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 6 || dash + 2 >= f.size()) continue;
    MountEntry e;
    e.root = unescapeMount(f[3]);
    e.mountPoint = unescapeMount(f[4]);
    e.mountOptions = f[5];
    e.fsType = f[dash + 1];
    e.source = unescapeMount(f[dash + 2]);
    e.superOptions = dash + 3 < f.size() ? f[dash + 3] : "";
    entries.push_back(e);
  }
  return entries;
}

bool hasOption(const std::string& options, const std::string& opt) {
  for (const auto& o : split(options, ',')) {
    if (o == opt) return true;
  }
  return false;
}

std::map<std::string, std::string> procStatus() {
  std::string text;
  int err = 0;
  if (!readFile("/proc/self/status", text, err)) failed("read /proc/self/status: " + errName(err));
  std::map<std::string, std::string> fields;
  for (const auto& line : lines(text)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    size_t v = line.find_first_not_of(" \t", colon + 1);
    fields[line.substr(0, colon)] = v == std::string::npos ? "" : line.substr(v);
  }
  return fields;
}

long number(const std::string& s) {
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0') usage("not a number: " + s);
  return v;
}

std::vector<int> procPids() {
  std::vector<int> pids;
  DIR* d = ::opendir("/proc");
  if (!d) failed("opendir /proc: " + errName(errno));
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) {
      pids.push_back(std::stoi(name));
    }
  }
  ::closedir(d);
  return pids;
}

// Runs fn in a forked child, which reports a long through a pipe. Returns
// false when the child died by a signal (stored in *signo).
bool inChild(const std::function<long()>& fn, long* value, int* signo) {
  int p[2];
  if (::pipe(p) != 0) failed("pipe: " + errName(errno));
  pid_t pid = ::fork();
  if (pid < 0) failed("fork: " + errName(errno));
  if (pid == 0) {
    ::close(p[0]);
    long v = fn();
    ssize_t n = ::write(p[1], &v, sizeof v);
    ::_exit(n == sizeof v ? 0 : 3);
  }
  ::close(p[1]);
  long v = 0;
  ssize_t n = ::read(p[0], &v, sizeof v);
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    *signo = WTERMSIG(status);
    return false;
  }
  if (n != sizeof v) failed("child reported nothing (status " + std::to_string(status) + ")");
  *value = v;
  return true;
}

bool isDevNull(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
}

// --- attempts: host files ----------------------------------------------------------

// host-file PATH: a host file (the test's canary) must not be reachable by
// its host path, through /proc/<pid>/root, or by walking up with "..".
[[noreturn]] void hostFile(const Args& a) {
  if (a.size() != 1 || a[0].empty() || a[0][0] != '/') usage("host-file ABSOLUTE_PATH");
  const std::string& path = a[0];
  std::string dots;
  for (int i = 0; i < 16; ++i) dots += "../";
  Outcome o;
  for (const std::string& p : {path, "/proc/self/root" + path, "/proc/1/root" + path,
                               "/proc/self/cwd/" + dots + path.substr(1), dots + path.substr(1)}) {
    std::string content;
    int err = 0;
    if (readFile(p, content, err)) {
      o.escape("read " + p + " (" + std::to_string(content.size()) + " bytes: " + content.substr(0, 64) + ")");
    } else {
      o.deny(p, err, {ENOENT, EACCES});
    }
  }
  o.finish();
}

// open-by-handle TYPE HEX: the "shocker" breakout. The test computed the
// file handle of a host file on the host; /usr (and /dev, a bind of a
// directory in moat's state) are binds of the same host file system, so a
// mount fd for either is all the kernel would need.
[[noreturn]] void openByHandle(const Args& a) {
  if (a.size() != 2 || a[1].size() % 2 != 0 || a[1].size() > 2 * MAX_HANDLE_SZ) {
    usage("open-by-handle HANDLE_TYPE HEX_BYTES");
  }
  std::vector<unsigned char> storage(sizeof(file_handle) + MAX_HANDLE_SZ);
  auto* fh = reinterpret_cast<file_handle*>(storage.data());
  fh->handle_type = static_cast<int>(number(a[0]));
  fh->handle_bytes = static_cast<unsigned>(a[1].size() / 2);
  for (size_t i = 0; i < fh->handle_bytes; ++i) {
    fh->f_handle[i] = static_cast<unsigned char>(std::stoi(a[1].substr(2 * i, 2), nullptr, 16));
  }
  Outcome o;
  for (const char* mountPath : {"/usr", "/dev", "/", "/workspace"}) {
    int mfd = ::open(mountPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (mfd < 0) {
      o.deny(std::string("open ") + mountPath, errno, {ENOENT});
      continue;
    }
    long fd = ::syscall(SYS_open_by_handle_at, mfd, fh, O_RDONLY | O_CLOEXEC);
    int err = errno;
    if (fd >= 0) {
      char buf[64] = {};
      ssize_t n = ::read(static_cast<int>(fd), buf, sizeof buf - 1);
      o.escape(std::string("open_by_handle_at via ") + mountPath + " opened the host file (" + std::to_string(n) +
               " bytes: " + std::string(buf, n > 0 ? static_cast<size_t>(n) : 0) + ")");
      ::close(static_cast<int>(fd));
    } else {
      o.call(std::string("open_by_handle_at via ") + mountPath, fd, err, {EPERM, ENOSYS});
    }
    ::close(mfd);
  }
  // The other half: unprivileged in the kernel, so only seccomp denies it.
  std::vector<unsigned char> own(sizeof(file_handle) + MAX_HANDLE_SZ);
  auto* ofh = reinterpret_cast<file_handle*>(own.data());
  ofh->handle_bytes = MAX_HANDLE_SZ;
  int mountId = 0;
  long rc = ::syscall(SYS_name_to_handle_at, AT_FDCWD, "/workspace", ofh, &mountId, 0);
  o.call("name_to_handle_at /workspace", rc, errno, {EPERM, ENOSYS});
  o.finish();
}

// shadow: /etc/shadow inside is empty or unreadable, and holds no hashes.
[[noreturn]] void shadow(const Args&) {
  std::string text;
  int err = 0;
  if (!readFile("/etc/shadow", text, err)) blocked("/etc/shadow unreadable: " + errName(err));
  if (text.empty()) blocked("/etc/shadow is empty");
  std::string rootLine;
  for (const auto& line : lines(text)) {
    auto f = split(line, ':');
    if (f.size() > 1 && f[0] == "root") rootLine = line;
    if (f.size() > 1 && !f[1].empty() && f[1][0] == '$') {
      escaped("/etc/shadow holds a password hash for " + f[0]);
    }
  }
  blocked("/etc/shadow has " + std::to_string(text.size()) + " bytes, no hashes; root entry: " + rootLine);
}

// mountinfo-paths: every absolute host path that mountinfo reveals (overlay
// layer options, mount sources) must not lead anywhere inside.
[[noreturn]] void mountinfoPaths(const Args&) {
  std::set<std::string> paths;
  for (const auto& m : mountInfo()) {
    if (!m.source.empty() && m.source[0] == '/') paths.insert(m.source);
    for (const auto& opt : split(m.superOptions, ',')) {
      auto eq = opt.find('=');
      if (eq == std::string::npos) continue;
      std::string key = opt.substr(0, eq);
      if (key != "lowerdir" && key != "upperdir" && key != "workdir" && key != "datadir" && key != "lowerdir+" &&
          key != "datadir+") {
        continue;
      }
      for (const auto& p : split(opt.substr(eq + 1), ':')) {
        if (!p.empty() && p[0] == '/') paths.insert(unescapeMount(p));
      }
    }
  }
  if (paths.empty()) blocked("mountinfo shows no host paths");
  Outcome o;
  for (const auto& p : paths) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      o.deny(p, errno, {ENOENT});
      continue;
    }
    std::string what = "opened " + p;
    DIR* d = ::fdopendir(fd);
    if (d) {
      int count = 0;
      std::string names;
      while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
        if (count++ < 8) names += std::string(" ") + e->d_name;
      }
      ::closedir(d);
      what += " (directory with " + std::to_string(count) + " entries:" + names + ")";
    } else {
      ::close(fd);
    }
    o.escape(what);
  }
  o.finish();
}

// --- attempts: mounts and namespaces ---------------------------------------------

[[noreturn]] void mountTmpfs(const Args&) {
  Outcome o;
  for (const char* target : {"/tmp", "/workspace", "/proc"}) {
    long rc = ::syscall(SYS_mount, "tmpfs", target, "tmpfs", 0, "size=1m");
    int err = errno;
    if (rc == 0) ::syscall(SYS_umount2, target, kMntDetach);
    o.call(std::string("mount tmpfs on ") + target, rc, err, {EPERM});
  }
  // Remounting the read-only host /usr read-write.
  long rc = ::syscall(SYS_mount, nullptr, "/usr", nullptr, MS_REMOUNT | MS_BIND, nullptr);
  o.call("remount /usr rw", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void newMountApi(const Args&) {
  Outcome o;
  long fd = ::syscall(SYS_fsopen, "tmpfs", 0);
  int err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("fsopen tmpfs", fd, err, {EPERM});
  fd = ::syscall(SYS_open_tree, AT_FDCWD, "/usr", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("open_tree clone /usr", fd, err, {EPERM});
  fd = ::syscall(SYS_fspick, AT_FDCWD, "/usr", 0);
  err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("fspick /usr", fd, err, {EPERM});
  mount_attr attr{};
  attr.attr_clr = MOUNT_ATTR_RDONLY;
  long rc = ::syscall(SYS_mount_setattr, AT_FDCWD, "/usr", 0, &attr, sizeof attr);
  o.call("mount_setattr /usr read-write", rc, errno, {EPERM});
  rc = ::syscall(SYS_move_mount, AT_FDCWD, "/usr", AT_FDCWD, "/tmp", 0);
  o.call("move_mount /usr", rc, errno, {EPERM});
  o.finish();
}

// umount-mask: the masks over /proc entries cannot be removed.
[[noreturn]] void umountMask(const Args&) {
  Outcome o;
  for (const char* p : {"/proc/kcore", "/proc/kallsyms", "/proc/keys", "/proc/sys", "/usr"}) {
    long rc = ::syscall(SYS_umount2, p, kMntDetach);
    o.call(std::string("umount2 ") + p, rc, errno, {EPERM});
  }
  o.finish();
}

[[noreturn]] void pivotRoot(const Args&) {
  Outcome o;
  ::mkdir("/tmp/old", 0700);
  long rc = ::syscall(SYS_pivot_root, "/tmp", "/tmp/old");
  o.call("pivot_root /tmp /tmp/old", rc, errno, {EPERM});
  if (::chdir("/") == 0) {
    rc = ::syscall(SYS_pivot_root, ".", ".");
    o.call("pivot_root . .", rc, errno, {EPERM});
  }
  o.finish();
}

// chroot: CAP_SYS_CHROOT is kept, so only seccomp stands between a process
// and the classic chroot(subdir) + chdir("..") walk-out.
[[noreturn]] void chrootAttempt(const Args&) {
  Outcome o;
  ::mkdir("/tmp/jail", 0700);
  long rc = ::syscall(SYS_chroot, "/tmp/jail");
  o.call("chroot /tmp/jail", rc, errno, {EPERM});
  o.finish();
}

struct NsFlag {
  int flag;
  const char* name;
};
constexpr NsFlag kNsFlags[] = {
    {CLONE_NEWUSER, "CLONE_NEWUSER"},     {CLONE_NEWNS, "CLONE_NEWNS"},
    {CLONE_NEWPID, "CLONE_NEWPID"},       {CLONE_NEWNET, "CLONE_NEWNET"},
    {CLONE_NEWUTS, "CLONE_NEWUTS"},       {CLONE_NEWIPC, "CLONE_NEWIPC"},
    {CLONE_NEWCGROUP, "CLONE_NEWCGROUP"}, {CLONE_NEWUSER | CLONE_NEWNS, "CLONE_NEWUSER|CLONE_NEWNS"},
};

// unshare: each namespace type (a new user namespace needs no privilege in
// the kernel: only seccomp denies it). Runs in a child so a success cannot
// change the probe itself.
[[noreturn]] void unshareAttempt(const Args&) {
  Outcome o;
  for (const auto& ns : kNsFlags) {
    long value = 0;
    int sig = 0;
    bool exited = inChild(
        [&] {
          long rc = ::syscall(SYS_unshare, ns.flag);
          return rc == 0 ? 0L : -static_cast<long>(errno);
        },
        &value, &sig);
    if (!exited) {
      o.note(std::string("unshare ") + ns.name + " killed by signal " + std::to_string(sig));
    } else {
      o.call(std::string("unshare ") + ns.name, value == 0 ? 0 : -1, static_cast<int>(-value), {EPERM});
    }
  }
  o.finish();
}

// clone-ns: the raw clone system call with each namespace flag.
[[noreturn]] void cloneNs(const Args&) {
  Outcome o;
  for (const auto& ns : kNsFlags) {
    long pid = ::syscall(SYS_clone, static_cast<unsigned long>(ns.flag) | SIGCHLD, nullptr, nullptr, nullptr, nullptr);
    int err = errno;
    if (pid == 0) ::_exit(0);
    if (pid > 0) ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
    o.call(std::string("clone ") + ns.name, pid, err, {EPERM});
  }
  o.finish();
}

// clone3: its flags are out of seccomp's sight, so the profile refuses the
// whole call with ENOSYS (libc falls back to clone).
[[noreturn]] void clone3Attempt(const Args&) {
  Outcome o;
  for (uint64_t flags : {static_cast<uint64_t>(CLONE_NEWUSER), static_cast<uint64_t>(0)}) {
    clone_args args{};
    args.flags = flags;
    args.exit_signal = SIGCHLD;
    long pid = ::syscall(SYS_clone3, &args, sizeof args);
    int err = errno;
    if (pid == 0) ::_exit(0);
    if (pid > 0) ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
    o.call(std::string("clone3 flags=") + (flags ? "CLONE_NEWUSER" : "0"), pid, err, {ENOSYS});
  }
  o.finish();
}

// setns: pid 1's mount namespace, and (to exercise the call itself) our own
// namespaces, which the kernel would refuse with EINVAL.
[[noreturn]] void setnsAttempt(const Args&) {
  Outcome o;
  int fd = ::open("/proc/1/ns/mnt", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    o.deny("open /proc/1/ns/mnt", errno, {EACCES});
  } else {
    long rc = ::syscall(SYS_setns, fd, CLONE_NEWNS);
    o.call("setns /proc/1/ns/mnt", rc, errno, {EPERM});
    ::close(fd);
  }
  for (auto [path, type] : {std::pair{"/proc/self/ns/user", CLONE_NEWUSER}, std::pair{"/proc/self/ns/mnt", CLONE_NEWNS},
                            std::pair{"/proc/self/ns/net", CLONE_NEWNET}}) {
    fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      o.deny(std::string("open ") + path, errno, {EACCES});
      continue;
    }
    long rc = ::syscall(SYS_setns, fd, type);
    o.call(std::string("setns ") + path, rc, errno, {EPERM});
    // An fd for the owning (host) user namespace would be a handle on the
    // host: NS_GET_USERNS / NS_GET_PARENT must refuse to go above ours.
    int up = ::ioctl(fd, type == CLONE_NEWUSER ? NS_GET_PARENT : NS_GET_USERNS);
    int err = errno;
    if (up >= 0) {
      struct stat st;
      ::fstat(up, &st);
      ::close(up);
      o.escape(std::string(type == CLONE_NEWUSER ? "NS_GET_PARENT" : "NS_GET_USERNS") + " on " + path +
               " returned a namespace fd (inode " + std::to_string(st.st_ino) + ")");
    } else {
      o.deny(std::string(type == CLONE_NEWUSER ? "NS_GET_PARENT " : "NS_GET_USERNS ") + path, err, {EPERM});
    }
    ::close(fd);
  }
  o.finish();
}

// --- attempts: processes ------------------------------------------------------------

[[noreturn]] void ptraceInit(const Args&) {
  Outcome o;
  long rc = ::ptrace(PTRACE_ATTACH, 1, nullptr, nullptr);
  int err = errno;
  if (rc == 0) {
    // Attached (where nothing protects pid 1): let it go again, or it stays
    // stopped by the attach's SIGSTOP once the probe has exited.
    int status = 0;
    ::waitpid(1, &status, __WALL);
    ::ptrace(PTRACE_DETACH, 1, nullptr, nullptr);
    ::kill(1, SIGCONT);
  }
  o.call("PTRACE_ATTACH 1", rc, err, {EPERM, EACCES});
  rc = ::ptrace(PTRACE_SEIZE, 1, nullptr, nullptr);
  err = errno;
  if (rc == 0) ::ptrace(PTRACE_DETACH, 1, nullptr, nullptr);
  o.call("PTRACE_SEIZE 1", rc, err, {EPERM, EACCES});
  o.finish();
}

// init-fds: pid 1 (moat-init, the host binary) is not dumpable: its control
// socket, executable (CVE-2019-5736), memory and environment are out of reach.
[[noreturn]] void initFds(const Args&) {
  Outcome o;
  auto tryOpen = [&](const char* path, int flags) {
    int fd = ::open(path, flags | O_CLOEXEC);
    if (fd < 0) {
      o.deny(std::string("open ") + path, errno, {EACCES});
    } else {
      o.escape(std::string("opened ") + path + (isDevNull(fd) ? " (/dev/null)" : ""));
      ::close(fd);
    }
  };
  tryOpen("/proc/1/fd/3", O_RDWR);
  tryOpen("/proc/1/fd/3", O_PATH);
  tryOpen("/proc/1/exe", O_WRONLY);
  tryOpen("/proc/1/exe", O_RDONLY);
  tryOpen("/proc/1/exe", O_PATH);
  tryOpen("/proc/1/mem", O_RDWR);
  // Files that check ptrace access when opened or, for some, when read.
  for (const char* file : {"/proc/1/environ", "/proc/1/maps", "/proc/1/smaps", "/proc/1/auxv", "/proc/1/stack",
                           "/proc/1/syscall", "/proc/1/pagemap", "/proc/1/personality", "/proc/1/io"}) {
    std::string content;
    int err = 0;
    if (!readFile(file, content, err)) {
      o.deny(std::string("read ") + file, err, {EACCES, EPERM});  // syscall, personality: EPERM
    } else if (!content.empty()) {
      o.escape(std::string("read ") + std::to_string(content.size()) + " bytes of " + file);
    } else {
      o.note(std::string(file) + " empty");
    }
  }
  int vanished = 0;
  // listed: the entry came from a directory listing, and pid 1's descriptors
  // come and go while it serves (a pipe, a statfs answer's directory): one
  // closed between the listing and the readlink is ENOENT, which reveals
  // nothing. Every entry still there must answer EACCES.
  auto tryLink = [&](const std::string& link, bool listed = false) {
    char buf[4096];
    ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
    if (n < 0 && listed && errno == ENOENT) {
      ++vanished;
    } else if (n < 0) {
      o.deny("readlink " + link, errno, {EACCES});
    } else {
      o.escape("readlink " + link + " = " + std::string(buf, static_cast<size_t>(n)));
    }
  };
  for (const char* link : {"/proc/1/exe", "/proc/1/fd/3", "/proc/1/root", "/proc/1/cwd"}) tryLink(link);
  // The directories may list (their owner is root of the environment's user
  // namespace when pid 1 is not dumpable), but no entry may be followed.
  for (const std::string dir : {"/proc/1/fd", "/proc/1/map_files"}) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) {
      o.deny("opendir " + dir, errno, {EACCES});
      continue;
    }
    int count = 0;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      ++count;
      std::string entry = dir + "/" + name;
      tryLink(entry, true);
      int fd = ::open(entry.c_str(), O_PATH | O_CLOEXEC);
      if (fd >= 0) {
        ::close(fd);
        o.escape("opened " + entry);
      }
    }
    ::closedir(d);
    o.note(dir + " lists " + std::to_string(count) + " entries, none followed (" + std::to_string(vanished) +
           " closed before their readlink)");
    vanished = 0;
  }
  o.finish();
}

// pidfd-getfd: stealing pid 1's control socket (fd 3) through a pidfd, and
// reading its memory with process_vm_readv.
[[noreturn]] void pidfdGetfd(const Args&) {
  Outcome o;
  long pidfd = ::syscall(SYS_pidfd_open, 1, 0);
  if (pidfd < 0) {
    o.deny("pidfd_open 1", errno, {EPERM, EACCES});
  } else {
    for (int target : {0, 3}) {
      long fd = ::syscall(SYS_pidfd_getfd, pidfd, target, 0);
      int err = errno;
      if (fd >= 0) ::close(static_cast<int>(fd));
      o.call("pidfd_getfd(init, " + std::to_string(target) + ")", fd, err, {EPERM, EACCES});
    }
    ::close(static_cast<int>(pidfd));
  }
  char local[16];
  iovec liov{local, sizeof local};
  // Any address: the access check comes before the memory is looked at.
  iovec riov{reinterpret_cast<void*>(0x400000), sizeof local};
  long n = ::process_vm_readv(1, &liov, 1, &riov, 1, 0);
  o.call("process_vm_readv 1", n, errno, {EPERM, EACCES});
  o.finish();
}

// proc-pids HOST_PID: /proc shows only the environment's own processes: pid 1
// is moat-init, a handful of pids in all, and the test's host pid is absent
// (or, if that number exists inside, it is not the test).
[[noreturn]] void procPidsAttempt(const Args& a) {
  if (a.size() != 1) usage("proc-pids HOST_PID");
  long hostPid = number(a[0]);
  Outcome o;
  auto pids = procPids();
  std::string list;
  for (int pid : pids) {
    std::string comm, cmdline;
    int err = 0;
    readFile("/proc/" + std::to_string(pid) + "/comm", comm, err);
    readFile("/proc/" + std::to_string(pid) + "/cmdline", cmdline, err);
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    list += " " + std::to_string(pid) + "=" + comm;
    if (cmdline.find("security_tests") != std::string::npos) {
      o.escape("pid " + std::to_string(pid) + " is the host test process");
    }
    // moat-init: the exec'd binary, or the moat process itself (in-process init).
    if (pid == 1 && comm != "moat-init" && comm != "moat") o.escape("pid 1 is " + comm + ", not moat-init");
  }
  if (pids.size() > 8) o.escape(std::to_string(pids.size()) + " processes visible:" + list);
  std::string cmdline;
  int err = 0;
  std::string hostProc = "/proc/" + std::to_string(hostPid);
  if (readFile(hostProc + "/cmdline", cmdline, err)) {
    if (cmdline.find("security_tests") != std::string::npos) {
      o.escape(hostProc + " is the host test process");
    } else {
      o.note(hostProc + " exists but is an environment process");
    }
  } else {
    o.deny("read " + hostProc + "/cmdline", err, {ENOENT});
  }
  o.note(std::to_string(pids.size()) + " pids:" + list);
  o.finish();
}

// kill-init: SIGKILL to pid 1 from inside its pid namespace is ignored by the
// kernel; were it delivered, the whole environment (this probe included)
// would die and no verdict would be printed.
[[noreturn]] void killInit(const Args&) {
  // Field 22 of /proc/1/stat, the start time, identifies this pid 1.
  auto startTime = [] {
    std::string stat;
    int err = 0;
    if (!readFile("/proc/1/stat", stat, err)) return std::string();
    std::istringstream in(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 22 && (in >> field); ++i) {
    }
    return field;
  };
  std::string before = startTime();
  if (before.empty()) failed("cannot read /proc/1/stat");
  Outcome o;
  long rc = ::kill(1, SIGKILL);
  int err = errno;
  ::usleep(200 * 1000);
  if (rc == 0) {
    o.note("kill(1, SIGKILL) returned 0");
  } else {
    o.deny("kill(1, SIGKILL)", err, {EPERM});
  }
  // Stopping pid 1 would hang the environment; the default-action signals
  // would end it. All are ignored for a pid namespace's init.
  for (int sig : {SIGSTOP, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGSEGV}) {
    ::kill(1, sig);
  }
  ::usleep(100 * 1000);
  {
    std::string stat;
    int serr = 0;
    if (readFile("/proc/1/stat", stat, serr)) {
      char state = stat.size() > stat.rfind(')') + 2 ? stat[stat.rfind(')') + 2] : '?';
      if (state == 'T' || state == 't') o.escape("pid 1 is stopped after SIGSTOP");
    }
  }
  rc = ::kill(-1, SIGKILL);  // everything but ourselves (and pid 1)
  err = errno;
  ::usleep(100 * 1000);
  o.note(rc == 0 ? "kill(-1, SIGKILL) returned 0" : "kill(-1, SIGKILL) " + errName(err));
  std::string after = startTime();
  if (after != before) {
    o.escape("pid 1 is gone after SIGKILL (start time " + before + " -> " + after + ")");
  } else {
    o.note("pid 1 survived (start time " + before + ")");
  }
  o.finish();
}

// --- attempts: forbidden system calls ----------------------------------------------

[[noreturn]] void keyctlAttempt(const Args&) {
  Outcome o;
  long rc = ::syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0);
  o.call("keyctl GET_KEYRING_ID session", rc, errno, {EPERM});
  rc = ::syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0);
  o.call("keyctl GET_KEYRING_ID user", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void addKey(const Args&) {
  Outcome o;
  long rc = ::syscall(SYS_add_key, "user", "moat-probe", "x", 1, KEY_SPEC_PROCESS_KEYRING);
  o.call("add_key user", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void requestKey(const Args&) {
  Outcome o;
  // Passing seccomp it would fail with ENOKEY: only EPERM is a denial.
  long rc = ::syscall(SYS_request_key, "user", "moat-probe-absent", nullptr, 0);
  o.call("request_key user", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void bpfAttempt(const Args&) {
  Outcome o;
  bpf_insn prog[] = {
      {BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0},  // r0 = 0
      {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},           // exit
  };
  const char license[] = "GPL";
  bpf_attr attr{};
  attr.prog_type = BPF_PROG_TYPE_SOCKET_FILTER;
  attr.insn_cnt = 2;
  attr.insns = reinterpret_cast<uint64_t>(prog);
  attr.license = reinterpret_cast<uint64_t>(license);
  long fd = ::syscall(SYS_bpf, BPF_PROG_LOAD, &attr, sizeof attr);
  int err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("bpf PROG_LOAD socket filter", fd, err, {EPERM});
  // An unknown command: the kernel answers EINVAL, so EPERM shows the call
  // never reached it.
  long rc = ::syscall(SYS_bpf, 9999, &attr, sizeof attr);
  o.call("bpf unknown command", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void userfaultfdAttempt(const Args&) {
  Outcome o;
  // UFFD_USER_MODE_ONLY needs no privilege in the kernel.
  long fd = ::syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
  int err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("userfaultfd USER_MODE_ONLY", fd, err, {EPERM});
  fd = ::syscall(SYS_userfaultfd, O_CLOEXEC);
  err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("userfaultfd", fd, err, {EPERM});
  o.finish();
}

[[noreturn]] void perfEventOpen(const Args&) {
  Outcome o;
  // A user-space-only software counter on ourselves. Only the filter's EPERM
  // counts: with perf_event_paranoid above 2 the kernel itself answers
  // EACCES, which says nothing about the filter.
  perf_event_attr attr{};
  attr.size = sizeof attr;
  attr.type = PERF_TYPE_SOFTWARE;
  attr.config = PERF_COUNT_SW_TASK_CLOCK;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  attr.disabled = 1;
  long fd = ::syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
  int err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("perf_event_open task clock", fd, err, {EPERM});
  o.finish();
}

[[noreturn]] void ioUring(const Args&) {
  Outcome o;
  io_uring_params params{};
  long fd = ::syscall(SYS_io_uring_setup, 4, &params);
  int err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("io_uring_setup", fd, err, {EPERM});
  long rc = ::syscall(SYS_io_uring_enter, -1, 0, 0, 0, nullptr, 0);
  o.call("io_uring_enter", rc, errno, {EPERM});
  rc = ::syscall(SYS_io_uring_register, -1, 0, nullptr, 0);
  o.call("io_uring_register", rc, errno, {EPERM});
  o.finish();
}

// The module, kexec, reboot and swap calls below pass arguments the kernel
// rejects right after its permission check: EPERM is the only denial.
[[noreturn]] void initModule(const Args&) {
  Outcome o;
  long rc = ::syscall(SYS_init_module, nullptr, 0, "");
  o.call("init_module", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void finitModule(const Args&) {
  Outcome o;
  int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  long rc = ::syscall(SYS_finit_module, fd, "", 0);
  o.call("finit_module /dev/null", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void deleteModule(const Args&) {
  Outcome o;
  long rc = ::syscall(SYS_delete_module, "moat_probe_absent", O_NONBLOCK);
  o.call("delete_module", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void kexecLoad(const Args&) {
  Outcome o;
  // An invalid architecture in flags: EINVAL once past the permission check.
  long rc = ::syscall(SYS_kexec_load, 0, 0, nullptr, 0x7fff0000UL);
  o.call("kexec_load", rc, errno, {EPERM});
  rc = ::syscall(SYS_kexec_file_load, -1, -1, 0, nullptr, ~0UL);
  o.call("kexec_file_load", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void rebootAttempt(const Args&) {
  Outcome o;
  // A wrong magic number: EINVAL once past the permission check.
  long rc = ::syscall(SYS_reboot, 0x12345678, 0x12345678, LINUX_REBOOT_CMD_CAD_OFF, nullptr);
  o.call("reboot (bad magic)", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void swaponAttempt(const Args&) {
  Outcome o;
  long rc = ::syscall(SYS_swapon, "/tmp/moat-probe-no-such-swap", 0);
  o.call("swapon", rc, errno, {EPERM});
  rc = ::syscall(SYS_swapoff, "/tmp/moat-probe-no-such-swap");
  o.call("swapoff", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void syslogAttempt(const Args&) {
  Outcome o;
  std::vector<char> buf(1 << 16);
  long rc = ::syscall(SYS_syslog, 3 /* SYSLOG_ACTION_READ_ALL */, buf.data(), static_cast<int>(buf.size()));
  o.call("syslog READ_ALL", rc, errno, {EPERM});
  rc = ::syscall(SYS_syslog, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, nullptr, 0);
  o.call("syslog SIZE_BUFFER", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void settimeofdayAttempt(const Args&) {
  Outcome o;
  // Both pointers NULL: the permission check runs, then nothing changes.
  long rc = ::syscall(SYS_settimeofday, nullptr, nullptr);
  o.call("settimeofday(NULL, NULL)", rc, errno, {EPERM});
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  rc = ::syscall(SYS_clock_settime, CLOCK_REALTIME, &now);
  o.call("clock_settime(now)", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void sethostnameAttempt(const Args&) {
  Outcome o;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  // Setting the current name again: no change should it succeed.
  long rc = ::syscall(SYS_sethostname, name, std::strlen(name));
  o.call("sethostname", rc, errno, {EPERM});
  rc = ::syscall(SYS_setdomainname, "", 0);
  o.call("setdomainname", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void iopl(const Args&) {
  Outcome o;
  long rc = ::syscall(SYS_iopl, 3);
  o.call("iopl 3", rc, errno, {EPERM});
  rc = ::syscall(SYS_ioperm, 0x80, 1, 1);
  o.call("ioperm 0x80", rc, errno, {EPERM});
  o.finish();
}

[[noreturn]] void acctAttempt(const Args&) {
  Outcome o;
  long rc = ::syscall(SYS_acct, "/tmp/moat-probe-no-such-dir/acct");
  o.call("acct", rc, errno, {EPERM});
  o.finish();
}

// int80: the 32-bit system call entry from a 64-bit process. The profile's
// numbers are x86-64 ones; a filter that let i386 calls through would be
// bypassed by their different numbering. getpid (20) must not return a pid.
[[noreturn]] void int80(const Args&) {
  long value = 0;
  int sig = 0;
  bool exited = inChild(
      [] {
        long r;
        asm volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory", "cc", "r8", "r9", "r10", "r11");
        return r;
      },
      &value, &sig);
  if (!exited) {
    if (sig == SIGSYS) blocked("int $0x80 getpid: child killed by SIGSYS");
    blocked("int $0x80 getpid: child killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")");
  }
  if (value < 0) blocked("int $0x80 getpid failed: " + errName(static_cast<int>(-value)));
  escaped("int $0x80 getpid returned " + std::to_string(value));
}

// x32: the x32 ABI (syscall number | 0x40000000) shares the x86-64 audit
// arch, so a filter that compares only numbers would miss it.
[[noreturn]] void x32(const Args&) {
  // The filter kills every call of another ABI (x32 numbers have bit 30
  // set) before the kernel looks at it: only that death counts. ENOSYS is
  // what any kernel built without x32 answers, filter or not.
  Outcome o;
  for (auto [nr, name] : {std::pair{static_cast<long>(SYS_getpid), "getpid"},
                          std::pair{static_cast<long>(SYS_unshare), "unshare(CLONE_NEWUSER)"}}) {
    long value = 0;
    int sig = 0;
    bool exited = inChild(
        [nr = nr] {
          long rc = ::syscall(0x40000000L | nr, nr == SYS_unshare ? CLONE_NEWUSER : 0);
          return rc < 0 ? -static_cast<long>(errno) : rc;
        },
        &value, &sig);
    std::string what = std::string("x32 ") + name;
    if (!exited && sig == SIGSYS) {
      o.note(what + ": killed by SIGSYS");
    } else if (!exited) {
      o.escape(what + ": killed by signal " + std::to_string(sig) + ", not the filter's SIGSYS");
    } else {
      o.escape(what + (value >= 0 ? " returned " + std::to_string(value)
                                  : " reached the kernel: " + errName(static_cast<int>(-value))));
    }
  }
  o.finish();
}

// --- attempts: network ------------------------------------------------------------

[[noreturn]] void rawInet(const Args&) {
  Outcome o;
  int fd = ::socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP);
  int err = errno;
  if (fd >= 0) ::close(fd);
  o.call("socket(AF_INET, SOCK_RAW, ICMP)", fd, err, {EPERM, EACCES});
  fd = ::socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMPV6);
  err = errno;
  if (fd >= 0) ::close(fd);
  o.call("socket(AF_INET6, SOCK_RAW, ICMPV6)", fd, err, {EPERM, EACCES, EAFNOSUPPORT});
  o.finish();
}

[[noreturn]] void rawPacket(const Args&) {
  Outcome o;
  int fd = ::socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
  int err = errno;
  if (fd >= 0) ::close(fd);
  o.call("socket(AF_PACKET, SOCK_RAW)", fd, err, {EPERM, EACCES, EAFNOSUPPORT});
  fd = ::socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  err = errno;
  if (fd >= 0) ::close(fd);
  o.call("socket(AF_PACKET, SOCK_DGRAM)", fd, err, {EPERM, EACCES, EAFNOSUPPORT});
  o.finish();
}

// vsock: AF_VSOCK is not network-namespaced (a bound port is taken on the
// host and in every environment; on a VM host it reaches the hypervisor):
// the filter refuses the family with EPERM, also when the int argument's
// high half is set (the kernel reads the low 32 bits). Only EPERM counts:
// a kernel without vsock answers EAFNOSUPPORT whatever the filter does.
[[noreturn]] void vsock(const Args&) {
  Outcome o;
  for (long family : {40L, 0x100000000L | 40L}) {
    errno = 0;
    long fd = ::syscall(SYS_socket, family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int err = errno;
    if (fd >= 0) ::close(static_cast<int>(fd));
    char what[64];
    std::snprintf(what, sizeof what, "socket(0x%lx = AF_VSOCK)", family);
    o.call(what, fd, err, {EPERM});
  }
  o.finish();
}

// uevent: a kernel-uevent netlink socket would get the host's device events
// (the environment's network namespace belongs to the initial user
// namespace): refused by the filter (EPERM; the kernel gives the socket to
// anyone).
[[noreturn]] void uevent(const Args&) {
  Outcome o;
  long fd = ::syscall(SYS_socket, AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, 15 /* NETLINK_KOBJECT_UEVENT */);
  int err = errno;
  if (fd >= 0) ::close(static_cast<int>(fd));
  o.call("socket(AF_NETLINK, NETLINK_KOBJECT_UEVENT)", fd, err, {EPERM});
  o.finish();
}

// net-ifaces: the only interface is lo, and there is no route anywhere.
[[noreturn]] void netIfaces(const Args&) {
  Outcome o;
  std::string text;
  int err = 0;
  if (!readFile("/proc/net/dev", text, err)) failed("read /proc/net/dev: " + errName(err));
  std::string names;
  auto ls = lines(text);
  for (size_t i = 2; i < ls.size(); ++i) {
    auto colon = ls[i].find(':');
    std::string name = ls[i].substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    names += " " + name;
    if (name != "lo") o.escape("interface " + name + " is visible");
  }
  if (names.empty()) failed("/proc/net/dev lists no interface at all");
  o.note("interfaces:" + names);
  if (readFile("/proc/net/route", text, err)) {
    auto routes = lines(text);
    if (routes.size() > 1) o.escape(std::to_string(routes.size() - 1) + " IPv4 routes: " + routes[1]);
  }
  if (readFile("/proc/net/ipv6_route", text, err)) {
    for (const auto& line : lines(text)) {
      std::istringstream in(line);
      std::vector<std::string> f;
      std::string w;
      while (in >> w) f.push_back(w);
      if (!f.empty() && f.back() != "lo") o.escape("IPv6 route via " + f.back());
    }
  }
  o.finish();
}

// connect PORT: a TCP listener on the host's 127.0.0.1 is unreachable.
[[noreturn]] void connectHost(const Args& a) {
  if (a.size() != 1) usage("connect PORT");
  Outcome o;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) failed("socket: " + errName(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(number(a[0])));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int err = errno;
    ::close(fd);
    if (rc == 0) {
      o.escape("connected to 127.0.0.1:" + a[0]);
    } else {
      o.deny("connect 127.0.0.1:" + a[0], err, {ECONNREFUSED});
    }
  }
  o.finish();
}

// abstract-unix NAME: a host abstract unix socket (per network namespace, and
// Landlock-scoped) is unreachable.
[[noreturn]] void abstractUnix(const Args& a) {
  if (a.size() != 1 || a[0].empty() || a[0].size() > 100) usage("abstract-unix NAME");
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) failed("socket: " + errName(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, a[0].data(), a[0].size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + a[0].size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) {
    escaped("connected to abstract socket @" + a[0]);
  }
  blocked("connect @" + a[0] + ": " + errName(errno));
}

// sysv-ipc KEY: a host System V shared memory segment and message queue
// with this key are invisible.
[[noreturn]] void sysvIpc(const Args& a) {
  if (a.size() != 1) usage("sysv-ipc KEY");
  auto key = static_cast<key_t>(number(a[0]));
  Outcome o;
  int id = ::shmget(key, 0, 0);
  if (id >= 0) {
    o.escape("shmget found the host segment (id " + std::to_string(id) + ")");
  } else {
    o.deny("shmget", errno, {ENOENT});
  }
  id = ::msgget(key, 0);
  if (id >= 0) {
    o.escape("msgget found the host queue (id " + std::to_string(id) + ")");
  } else {
    o.deny("msgget", errno, {ENOENT});
  }
  o.finish();
}

// hostname HOST_NAME: the environment has its own UTS namespace.
[[noreturn]] void hostnameAttempt(const Args& a) {
  if (a.size() != 1) usage("hostname HOST_NAME");
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) failed("gethostname: " + errName(errno));
  if (a[0] == name) escaped("hostname is the host's: " + a[0]);
  blocked(std::string("hostname is ") + name);
}

// --- attempts: /proc, /sys, cgroups ---------------------------------------------------

// write-back PATH [DATA]: opening PATH for writing and writing DATA (default:
// what it holds now, so a success changes nothing) must fail. A /dev/null
// mask counts as blocked.
[[noreturn]] void writeBack(const Args& a) {
  if (a.empty() || a.size() > 2) usage("write-back PATH [DATA]");
  const std::string& path = a[0];
  std::string data;
  if (a.size() == 2) {
    data = a[1];
  } else {
    int err = 0;
    if (!readFile(path, data, err)) data.clear();
    if (data.empty()) data = "\n";
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) blocked("open " + path + " for writing: " + errName(errno));
  if (isDevNull(fd)) blocked(path + " is masked by /dev/null");
  ssize_t n = ::write(fd, data.data(), data.size());
  int err = errno;
  ::close(fd);
  if (n < 0) blocked("write " + path + ": " + errName(err));
  escaped("wrote " + std::to_string(n) + " bytes to " + path);
}

// sys-write: /sys is absent or read-only: nothing can be created or written.
[[noreturn]] void sysWrite(const Args&) {
  Outcome o;
  struct stat st;
  if (::stat("/sys", &st) != 0) {
    o.deny("stat /sys", errno, {ENOENT});
  } else {
    o.note("/sys exists");
  }
  for (const char* dir : {"/sys/kernel/moat-probe", "/sys/fs/cgroup/moat-probe", "/sys/fs/cgroup/memory/moat-probe"}) {
    if (::mkdir(dir, 0700) == 0) {
      ::rmdir(dir);
      o.escape(std::string("created ") + dir);
    } else {
      o.deny(std::string("mkdir ") + dir, errno, {ENOENT, EROFS});
    }
  }
  for (const char* file :
       {"/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/fs/cgroup/cgroup.procs"}) {
    int fd = ::open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      o.deny(std::string("open ") + file + " for writing", errno, {ENOENT, EROFS});
    } else {
      ::close(fd);
      o.escape(std::string("opened ") + file + " for writing");
    }
  }
  o.finish();
}

// cgroup: the process sees the root of its cgroup namespace, and no cgroup
// file system is there to write to.
[[noreturn]] void cgroupAttempt(const Args&) {
  Outcome o;
  std::string text;
  int err = 0;
  if (!readFile("/proc/self/cgroup", text, err)) failed("read /proc/self/cgroup: " + errName(err));
  int count = 0;
  for (const auto& line : lines(text)) {
    auto f = split(line, ':');
    if (f.size() < 3) continue;
    ++count;
    std::string path = line.substr(f[0].size() + f[1].size() + 2);
    if (path != "/") o.escape("cgroup line shows a host path: " + line);
  }
  if (count == 0) failed("/proc/self/cgroup is empty");
  o.note(std::to_string(count) + " hierarchies at /");
  for (const char* dir : {"/sys/fs/cgroup/moat-probe", "/sys/fs/cgroup/pids/moat-probe"}) {
    if (::mkdir(dir, 0700) == 0) {
      ::rmdir(dir);
      o.escape(std::string("created ") + dir);
    } else {
      o.deny(std::string("mkdir ") + dir, errno, {ENOENT});
    }
  }
  o.finish();
}

// read-nothing PATH...: each path is unreadable or reads as empty.
[[noreturn]] void readNothing(const Args& a) {
  if (a.empty()) usage("read-nothing PATH...");
  Outcome o;
  for (const auto& path : a) {
    // Non-blocking: an unmasked /proc/kmsg would otherwise wait forever.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      o.deny(path, errno, {ENOENT, EACCES});
      continue;
    }
    if (isDevNull(fd)) {
      o.note(path + " masked by /dev/null");
      ::close(fd);
      continue;
    }
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    int err = errno;
    ::close(fd);
    if (n == 0) {
      o.note(path + " empty");
    } else if (n > 0) {
      o.escape("read " + std::to_string(n) + " bytes from " + path + ": " +
               std::string(buf, static_cast<size_t>(std::min<ssize_t>(n, 48))));
    } else if (err == EAGAIN) {
      o.escape("opened " + path + " (nothing to read yet)");
    } else {
      o.deny("read " + path, err, {EACCES, EPERM});
    }
  }
  o.finish();
}

// --- attempts: devices --------------------------------------------------------------

[[noreturn]] void mknodAttempt(const Args& a) {
  if (a.size() != 1 || (a[0] != "block" && a[0] != "char")) usage("mknod block|char");
  bool block = a[0] == "block";
  mode_t type = block ? S_IFBLK : S_IFCHR;
  dev_t dev = block ? makedev(8, 0) : makedev(1, 1);  // sda; /dev/mem
  Outcome o;
  for (const char* dir : {"/tmp", "/dev", "/dev/shm", "/workspace"}) {
    std::string path = std::string(dir) + "/moat-probe-node";
    if (::mknod(path.c_str(), type | 0600, dev) == 0) {
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      int err = errno;
      ::unlink(path.c_str());
      if (fd >= 0) ::close(fd);
      o.escape("mknod " + path + " succeeded" + (fd >= 0 ? " and it opens" : " (open: " + errName(err) + ")"));
    } else {
      o.deny("mknod " + path, errno, {EPERM, EROFS});
    }
  }
  o.finish();
}

// dev-list: /dev holds only the minimal set.
[[noreturn]] void devList(const Args&) {
  static const std::set<std::string> allowed = {"null", "zero", "full", "random", "urandom", "tty",   "pts",
                                                "ptmx", "shm",  "fd",   "stdin",  "stdout",  "stderr"};
  Outcome o;
  DIR* d = ::opendir("/dev");
  if (!d) failed("opendir /dev: " + errName(errno));
  std::string names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    names += " " + name;
    if (!allowed.count(name)) o.escape("/dev/" + name + " exists");
  }
  ::closedir(d);
  // The devpts instance is the environment's own: no host terminals in it.
  d = ::opendir("/dev/pts");
  if (d) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != ".." && name != "ptmx") o.escape("/dev/pts/" + name + " exists");
    }
    ::closedir(d);
  }
  o.note("/dev:" + names);
  o.finish();
}

// dev-open PATH...: host devices cannot be opened.
[[noreturn]] void devOpen(const Args& a) {
  if (a.empty()) usage("dev-open PATH...");
  Outcome o;
  for (const auto& path : a) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
      o.deny(path, errno, {ENOENT});
    } else {
      ::close(fd);
      o.escape("opened " + path);
    }
  }
  o.finish();
}

// fds: the command holds nothing but its three standard streams, and those
// are pipes, sockets or /dev/null: an inherited host descriptor (a directory
// above all: fchdir + "..") would be a way out of the root.
[[noreturn]] void fdsAttempt(const Args&) {
  Outcome o;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) failed("opendir /proc/self/fd: " + errName(errno));
  int self = ::dirfd(d);
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    int fd = std::atoi(name.c_str());
    if (fd == self) continue;
    char buf[4096];
    ssize_t n = ::readlink(("/proc/self/fd/" + name).c_str(), buf, sizeof buf - 1);
    std::string target = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
    struct stat st {};
    ::fstat(fd, &st);
    bool harmless = S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || isDevNull(fd);
    if (fd > 2) {
      o.escape("inherited fd " + name + " -> " + target);
    } else if (!harmless) {
      o.escape("fd " + name + " is " + target);
    } else {
      o.note("fd " + name + " -> " + target);
    }
  }
  ::closedir(d);
  o.finish();
}

// tty: no controlling terminal, so no TIOCSTI into a host terminal.
[[noreturn]] void ttyAttempt(const Args&) {
  int fd = ::open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY);
  if (fd >= 0) escaped("/dev/tty opens: the process has a controlling terminal");
  blocked("open /dev/tty: " + errName(errno));
}

// --- attempts: identity and privileges ---------------------------------------------------

// uid-map: root inside is an unprivileged range on the host, and the map
// cannot be rewritten.
[[noreturn]] void uidMap(const Args&) {
  Outcome o;
  for (const char* file : {"/proc/self/uid_map", "/proc/self/gid_map"}) {
    std::string text;
    int err = 0;
    if (!readFile(file, text, err)) failed(std::string("read ") + file + ": " + errName(err));
    auto ls = lines(text);
    if (ls.size() != 1) o.escape(std::string(file) + " has " + std::to_string(ls.size()) + " lines");
    for (const auto& line : ls) {
      std::istringstream in(line);
      unsigned long inside = 0, outside = 0, count = 0;
      in >> inside >> outside >> count;
      if (outside == 0) o.escape(std::string(file) + " maps to host id 0: " + line);
      if (inside == 0 && outside <= 65535) o.escape(std::string(file) + " maps root to a low host id: " + line);
      if (count != 65536) o.escape(std::string(file) + " maps " + std::to_string(count) + " ids");
      o.note(std::string(file) + " 0->" + std::to_string(outside) + " x" + std::to_string(count));
    }
  }
  int fd = ::open("/proc/self/uid_map", O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    o.deny("open uid_map for writing", errno, {EPERM, EACCES});
  } else {
    const char line[] = "0 0 1\n";
    ssize_t n = ::write(fd, line, sizeof line - 1);
    int err = errno;
    ::close(fd);
    if (n >= 0) {
      o.escape("rewrote uid_map");
    } else {
      o.deny("write uid_map", err, {EPERM});
    }
  }
  o.finish();
}

// caps: no dangerous capability in any set.
[[noreturn]] void capsAttempt(const Args&) {
  static const std::pair<int, const char*> forbidden[] = {
      {2, "DAC_READ_SEARCH"}, {12, "NET_ADMIN"}, {13, "NET_RAW"},  {16, "SYS_MODULE"}, {17, "SYS_RAWIO"},
      {19, "SYS_PTRACE"},     {21, "SYS_ADMIN"}, {22, "SYS_BOOT"}, {25, "SYS_TIME"},   {27, "MKNOD"},
      {33, "MAC_ADMIN"},      {34, "SYSLOG"},    {38, "PERFMON"},  {39, "BPF"},        {40, "CHECKPOINT_RESTORE"},
  };
  auto status = procStatus();
  Outcome o;
  for (const char* set : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) {
    if (!status.count(set)) failed(std::string("no ") + set + " in /proc/self/status");
    uint64_t mask = std::strtoull(status[set].c_str(), nullptr, 16);
    for (auto [bit, name] : forbidden) {
      if (mask & (1ULL << bit)) o.escape(std::string(set) + " has CAP_" + name);
    }
    o.note(std::string(set) + "=" + status[set]);
  }
  if (std::strtoull(status["CapAmb"].c_str(), nullptr, 16) != 0) o.escape("ambient capabilities set");
  o.finish();
}

[[noreturn]] void nnpSeccomp(const Args&) {
  auto status = procStatus();
  Outcome o;
  if (status["NoNewPrivs"] != "1") o.escape("NoNewPrivs is " + status["NoNewPrivs"]);
  if (status["Seccomp"] != "2") o.escape("Seccomp is " + status["Seccomp"]);
  o.note("NoNewPrivs=" + status["NoNewPrivs"] + " Seccomp=" + status["Seccomp"] +
         " filters=" + status["Seccomp_filters"]);
  // And it cannot be undone.
  long rc = ::syscall(SYS_prctl, 38 /* PR_SET_NO_NEW_PRIVS */, 0, 0, 0, 0);
  if (rc == 0 && procStatus()["NoNewPrivs"] != "1") o.escape("cleared no_new_privs");
  o.finish();
}

// nosuid: every mount is nosuid (so setuid binaries, /usr/bin/su and friends
// included, gain nothing), and /usr is there, read-only.
[[noreturn]] void nosuid(const Args&) {
  Outcome o;
  bool sawUsr = false;
  int count = 0;
  for (const auto& m : mountInfo()) {
    ++count;
    if (!hasOption(m.mountOptions, "nosuid")) o.escape(m.mountPoint + " is mounted without nosuid");
    if (m.mountPoint == "/usr") {
      sawUsr = true;
      if (!hasOption(m.mountOptions, "ro")) o.escape("/usr is mounted read-write");
    }
  }
  if (!sawUsr) failed("/usr is not a mount point");
  o.note(std::to_string(count) + " mounts, all nosuid; /usr ro");
  o.finish();
}

// --- attempts: read-only content --------------------------------------------------------

// create-in DIR...: creating, chmod-ing or renaming in DIR fails (read-only
// template or read-only volume).
[[noreturn]] void createIn(const Args& a) {
  if (a.empty()) usage("create-in DIR...");
  Outcome o;
  for (const auto& dir : a) {
    std::string path = dir + "/moat-probe-file";
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(path.c_str());
      o.escape("created " + path);
    } else {
      o.deny("create " + path, errno, {EROFS});
    }
    if (::mkdir((dir + "/moat-probe-dir").c_str(), 0755) == 0) {
      ::rmdir((dir + "/moat-probe-dir").c_str());
      o.escape("created directory in " + dir);
    } else {
      o.deny("mkdir in " + dir, errno, {EROFS});
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0) {
      if (::chmod(dir.c_str(), st.st_mode & 07777) == 0) {
        o.escape("chmod " + dir);
      } else {
        o.deny("chmod " + dir, errno, {EROFS});
      }
    }
  }
  o.finish();
}

// existing-file-write PATH: an existing file under a read-only mount cannot
// be opened for writing (e.g. /usr/bin/env: replacing a host binary).
[[noreturn]] void existingFileWrite(const Args& a) {
  if (a.empty()) usage("existing-file-write PATH...");
  Outcome o;
  for (const auto& path : a) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      ::close(fd);
      o.escape("opened " + path + " for writing");
    } else {
      // A read-only mount (EROFS), or, where root inside is not the owner
      // (the host's /usr, bound without an id mapping), the permission
      // check, which comes first for an existing file (EACCES).
      o.deny("open " + path + " for writing", errno, {EROFS, EACCES});
    }
    if (::truncate(path.c_str(), 0) == 0) {
      o.escape("truncated " + path);
    } else {
      o.deny("truncate " + path, errno, {EROFS, EACCES});
    }
  }
  o.finish();
}

// --- attempts: environment and sanity ----------------------------------------------------

// env: prints the environment; any variable outside the base set is a leak.
[[noreturn]] void envAttempt(const Args&) {
  static const std::set<std::string> allowed = {"PATH", "HOME", "USER",     "LOGNAME", "SHELL",
                                                "LANG", "TERM", "HOSTNAME", "PWD"};
  Outcome o;
  std::string all;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    all += (all.empty() ? "" : " | ") + entry;
    if (!allowed.count(key)) o.escape("host variable " + entry);
  }
  // pid 1 may be a fork of the host's moat process (in-process init): its
  // environment is the host's.
  std::string initEnv;
  int err = 0;
  if (!readFile("/proc/1/environ", initEnv, err)) {
    o.deny("read /proc/1/environ", err, {EACCES});
  } else if (!initEnv.empty()) {
    for (char& c : initEnv) {
      if (c == '\0') c = ' ';
    }
    o.escape("/proc/1/environ: " + initEnv);
  }
  o.note("environment: " + all);
  o.finish();
}

// workspace: /workspace and /tmp are writable (expected to succeed).
[[noreturn]] void workspace(const Args&) {
  std::string done;
  for (const char* dir : {"/workspace", "/tmp", "/root", "/dev/shm"}) {
    std::string path = std::string(dir) + "/moat-probe-sanity";
    const std::string data = "sanity\n";
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) failed("create " + path + ": " + errName(errno));
    if (::write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
      failed("write " + path + ": " + errName(errno));
    }
    ::close(fd);
    std::string back;
    int err = 0;
    if (!readFile(path, back, err) || back != data) failed("read back " + path);
    if (::unlink(path.c_str()) != 0) failed("unlink " + path + ": " + errName(errno));
    done += std::string(" ") + dir;
  }
  char cwd[4096];
  if (!::getcwd(cwd, sizeof cwd) || std::string(cwd) != "/workspace") {
    failed("working directory is not /workspace");
  }
  if (::getuid() != 0) failed("not root inside (uid " + std::to_string(::getuid()) + ")");
  okay("wrote and read back in" + done + "; cwd /workspace; uid 0");
}

// write-file PATH TEXT: appends TEXT to PATH (expected to succeed); the test
// then checks the host copy did not change.
[[noreturn]] void writeFile(const Args& a) {
  if (a.size() != 2) usage("write-file PATH TEXT");
  int fd = ::open(a[0].c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) failed("open " + a[0] + ": " + errName(errno));
  ssize_t n = ::write(fd, a[1].data(), a[1].size());
  ::close(fd);
  if (n != static_cast<ssize_t>(a[1].size())) failed("write " + a[0] + ": " + errName(errno));
  okay("appended to " + a[0]);
}

// plant-symlinks TARGET: leaves symlinks to TARGET and to / all over the
// writable layer (expected to succeed); the test checks that destroying the
// environment did not follow them on the host.
[[noreturn]] void plantSymlinks(const Args& a) {
  if (a.size() != 1) usage("plant-symlinks TARGET");
  int made = 0;
  for (const char* dir : {"/workspace", "/tmp", "/root", "/var/tmp", "/etc", "/"}) {
    for (const auto& [name, target] : {std::pair{std::string("moat-link-target"), a[0]},
                                       std::pair{std::string("moat-link-root"), std::string("/")}}) {
      std::string link = std::string(dir) + (std::strcmp(dir, "/") == 0 ? "" : "/") + name;
      if (::symlink(target.c_str(), link.c_str()) != 0) failed("symlink " + link + ": " + errName(errno));
      ++made;
    }
  }
  // Replace a directory that moat itself created with a symlink.
  if (::rename("/workspace", "/workspace.orig") == 0 && ::symlink(a[0].c_str(), "/workspace") == 0) {
    ++made;
  }
  okay("planted " + std::to_string(made) + " symlinks");
}

struct Attempt {
  const char* name;
  void (*fn)(const Args&);
};

const Attempt kAttempts[] = {
    {"host-file", hostFile},
    {"open-by-handle", openByHandle},
    {"shadow", shadow},
    {"mountinfo-paths", mountinfoPaths},
    {"mount-tmpfs", mountTmpfs},
    {"new-mount-api", newMountApi},
    {"umount-mask", umountMask},
    {"pivot-root", pivotRoot},
    {"chroot", chrootAttempt},
    {"unshare", unshareAttempt},
    {"clone-ns", cloneNs},
    {"clone3", clone3Attempt},
    {"setns", setnsAttempt},
    {"ptrace-init", ptraceInit},
    {"init-fds", initFds},
    {"pidfd-getfd", pidfdGetfd},
    {"proc-pids", procPidsAttempt},
    {"kill-init", killInit},
    {"keyctl", keyctlAttempt},
    {"add-key", addKey},
    {"request-key", requestKey},
    {"bpf", bpfAttempt},
    {"userfaultfd", userfaultfdAttempt},
    {"perf-event-open", perfEventOpen},
    {"io-uring", ioUring},
    {"init-module", initModule},
    {"finit-module", finitModule},
    {"delete-module", deleteModule},
    {"kexec-load", kexecLoad},
    {"reboot", rebootAttempt},
    {"swapon", swaponAttempt},
    {"syslog", syslogAttempt},
    {"settimeofday", settimeofdayAttempt},
    {"sethostname", sethostnameAttempt},
    {"iopl", iopl},
    {"acct", acctAttempt},
    {"int80", int80},
    {"x32", x32},
    {"raw-inet", rawInet},
    {"raw-packet", rawPacket},
    {"vsock", vsock},
    {"uevent", uevent},
    {"net-ifaces", netIfaces},
    {"connect", connectHost},
    {"abstract-unix", abstractUnix},
    {"sysv-ipc", sysvIpc},
    {"hostname", hostnameAttempt},
    {"write-back", writeBack},
    {"sys-write", sysWrite},
    {"cgroup", cgroupAttempt},
    {"read-nothing", readNothing},
    {"mknod", mknodAttempt},
    {"dev-list", devList},
    {"dev-open", devOpen},
    {"tty", ttyAttempt},
    {"fds", fdsAttempt},
    {"uid-map", uidMap},
    {"caps", capsAttempt},
    {"nnp-seccomp", nnpSeccomp},
    {"nosuid", nosuid},
    {"create-in", createIn},
    {"existing-file-write", existingFileWrite},
    {"env", envAttempt},
    {"workspace", workspace},
    {"write-file", writeFile},
    {"plant-symlinks", plantSymlinks},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage("moat-probe ATTEMPT [ARGS...] | --list");
  std::string name = argv[1];
  if (name == "--list") {
    for (const auto& attempt : kAttempts) std::printf("%s\n", attempt.name);
    return 0;
  }
  Args args(argv + 2, argv + argc);
  for (const auto& attempt : kAttempts) {
    if (name == attempt.name) {
      attempt.fn(args);
      failed("attempt returned without a verdict");
    }
  }
  std::string names;
  for (const auto& attempt : kAttempts) names += std::string(" ") + attempt.name;
  usage("unknown attempt " + name + "; attempts:" + names);
}
