#include "isolation/proc/lxcfs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "os/file.h"
#include "os/mount.h"
#include "os/process.h"

namespace moat::isolation::proc {
namespace {

constexpr long kFuseSuperMagic = 0x65735546;
constexpr auto kRetryAfterFailure = std::chrono::seconds(10);

enum class MountState { kAbsent, kLive, kDead };

// What is mounted at dir: an lxcfs that answers, one whose process died
// (FUSE then fails every call with ENOTCONN), or none.
MountState mountState(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) return errno == ENOTCONN ? MountState::kDead : MountState::kAbsent;
  if (fs.f_type != kFuseSuperMagic) return MountState::kAbsent;
  struct stat st;
  if (::stat((dir + "/proc/meminfo").c_str(), &st) == 0) return MountState::kLive;
  return errno == ENOTCONN ? MountState::kDead : MountState::kAbsent;
}

std::string lastLine(const std::string& path) {
  auto text = os::readFile(path, 64 << 10);
  if (!text.ok()) return "";
  std::string t = text.value();
  while (!t.empty() && t.back() == '\n') t.pop_back();
  size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// Runs lxcfs detached: lxcfs stays in the foreground (it is made for a
// service manager), so a child starts a session and forks it, and exits.
// Nothing of the caller's reaches it: no descriptor beyond stdio (its log),
// no environment variable, default signal dispositions, an empty mask. Returns once it serves dir,
// or with why not.
Status startLxcfs(const std::string& binary, const std::string& dir) {
  const std::string pidFile = dir + ".pid", logFile = dir + ".log";
  std::vector<std::string> argv = {binary, "--enable-loadavg", "--enable-cfs", "--enable-pidfd", "-p", pidFile, dir};
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  // lxcfs refuses to start while another process holds a lock on its pid
  // file: an old one there (of a process that this one replaces) goes first.
  if (::unlink(pidFile.c_str()) != 0 && errno != ENOENT) return Error::fromErrno("remove " + pidFile);
  MOAT_ASSIGN(UniqueFd devNull, os::open("/dev/null", O_RDONLY | O_CLOEXEC));
  MOAT_ASSIGN(UniqueFd log, os::open(logFile, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  int report[2];  // the grandchild's pid, from the child
  if (::pipe2(report, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  UniqueFd reportRead(report[0]), reportWrite(report[1]);
  pid_t child = ::fork();
  if (child < 0) return Error::fromErrno("fork for " + binary);
  if (child == 0) {
    // Only async-signal-safe calls from here to the exec.
    ::setsid();
    pid_t daemon = ::fork();
    if (daemon != 0) {
      ssize_t ignored = ::write(reportWrite.get(), &daemon, sizeof daemon);
      (void)ignored;
      ::_exit(daemon < 0 ? 1 : 0);
    }
    os::resetSignals();
    if (::dup2(devNull.get(), 0) < 0 || ::dup2(log.get(), 1) < 0 || ::dup2(log.get(), 2) < 0) ::_exit(126);
    (void)os::markCloseOnExecFrom(3);
    char* noEnvironment[] = {nullptr};
    ::execve(args[0], args.data(), noEnvironment);
    ::_exit(127);
  }
  reportWrite.reset();
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return Error::fromErrno("wait for " + binary);
  }
  pid_t daemon = -1;
  if (::read(reportRead.get(), &daemon, sizeof daemon) != static_cast<ssize_t>(sizeof daemon) || daemon <= 0) {
    return Error::make(Code::kToolFailed, "could not start " + binary + " (" + os::describeWaitStatus(status) + ")");
  }
  auto pidfd = os::pidfdOpen(daemon);
  // Up when its mount answers; given 10 s (it starts in ~50 ms here).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    if (mountState(dir) == MountState::kLive) {
      // Its library is set up before it mounts: the log says by now
      // whether it serves the readers' limits.
      auto log = os::readFileTail(logFile, 1 << 20);
      if (!log.ok() || lxcfsLogSaysVirtualizing(log.value())) return {};
      if (pidfd.ok()) (void)os::pidfdSendSignal(pidfd->get(), SIGKILL);
      (void)os::unmount(dir, MNT_DETACH);
      return Error::make(Code::kToolFailed, binary +
                                                " serves the host's own values, not the readers' limits: the set-up "
                                                "of its cgroup views failed (see " +
                                                logFile + ")");
    }
    bool gone = !pidfd.ok() || os::pidfdExited(pidfd->get());
    if (gone || std::chrono::steady_clock::now() > deadline) {
      std::string why = lastLine(logFile);
      if (!gone) (void)os::pidfdSendSignal(pidfd->get(), SIGKILL);
      return Error::make(Code::kToolFailed, binary + (gone ? " exited" : " did not mount " + dir + " within 10 s") +
                                                (why.empty() ? "" : ": " + why) + " (see " + logFile + ")");
    }
    ::usleep(2000);
  }
}

// The lxcfs process serving dir, by its pid file, checked against its
// command line (a pid can be reused once its process is gone).
struct Served {
  pid_t pid = -1;
  UniqueFd pidfd;
};
Result<Served> lxcfsProcess(const std::string& dir) {
  MOAT_ASSIGN(std::string text, os::readFile(dir + ".pid", 64));
  pid_t pid = static_cast<pid_t>(std::strtol(text.c_str(), nullptr, 10));
  if (pid <= 1) return Error::make(Code::kInternal, "no pid in " + dir + ".pid");
  MOAT_ASSIGN(UniqueFd pidfd, os::pidfdOpen(pid));
  MOAT_ASSIGN(std::string cmdline, os::readFile("/proc/" + std::to_string(pid) + "/cmdline", 64 << 10));
  // Arguments are separated by NULs; the mount point is the last one.
  std::string last = cmdline;
  while (!last.empty() && last.back() == '\0') last.pop_back();
  size_t nul = last.rfind('\0');
  if (nul != std::string::npos) last = last.substr(nul + 1);
  if (last != dir) return Error::make(Code::kInternal, "pid " + std::to_string(pid) + " does not serve " + dir);
  return Served{pid, std::move(pidfd)};
}

struct Cache {
  std::mutex mutex;
  std::string dir;
  UniqueFd pidfd;                                       // the lxcfs the files below belong to
  std::vector<std::pair<std::string, UniqueFd>> files;  // target, O_PATH
  std::optional<std::chrono::steady_clock::time_point> failedAt;
  std::optional<Error> failure;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: environments may be made until exit
  return *c;
}

// ensureLxcfs, and the process it found or started.
Result<Served> ensureServed(const LxcfsConfig& config) {
  if (!config.enabled) return Error::make(Code::kUnsupported, "LXCFS is off (MOAT_LXCFS=off)");
  std::string parent = config.dir.substr(0, config.dir.rfind('/'));
  if (!parent.empty()) MOAT_TRY(os::makeDirs(parent, 0700));
  MOAT_ASSIGN(UniqueFd lock, os::open(config.dir + ".lock", O_RDWR | O_CREAT | O_NOFOLLOW, 0600));
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return Error::fromErrno("lock " + config.dir + ".lock");
  }
  MountState state = mountState(config.dir);
  if (state == MountState::kLive) {
    // Used when its pid file names it and it serves the readers' limits.
    // Not of use otherwise (another pid namespace's lxcfs, a lost pid file,
    // one serving the host's values): detached below, not killed, so that
    // the environments that bound its files keep reading them (host values
    // beat ENOTCONN); it ends once the last of them goes.
    auto process = lxcfsProcess(config.dir);
    auto log = os::readFileTail(config.dir + ".log", 1 << 20);
    if (process.ok() && (!log.ok() || lxcfsLogSaysVirtualizing(log.value()))) return process;
    state = MountState::kDead;
  }
  if (state == MountState::kDead) {
    // Dead, or of no use: a new one takes the mount point. Environments
    // that bound a dead one's files keep failing reads until made again.
    MOAT_TRY(os::unmount(config.dir, MNT_DETACH));
  }
  // Made only now: a dead mount point fails even stat (ENOTCONN) until it
  // is detached above.
  MOAT_TRY(os::makeDir(config.dir, 0755));
  MOAT_ASSIGN(std::string binary, lxcfsBinary(config));
  MOAT_TRY(startLxcfs(binary, config.dir));
  return lxcfsProcess(config.dir);
}

}  // namespace

LxcfsConfig lxcfsConfigFromEnvironment() {
  LxcfsConfig config;
  config.dir = "/run/moat/lxcfs";
  if (const char* v = std::getenv("MOAT_LXCFS")) {
    std::string value = v;
    if (value == "off")
      config.enabled = false;
    else
      config.binary = value;
  }
  if (const char* d = std::getenv("MOAT_LXCFS_DIR"); d && *d == '/') config.dir = d;
  while (config.dir.size() > 1 && config.dir.back() == '/') config.dir.pop_back();
  return config;
}

bool lxcfsLogSaysVirtualizing(const std::string& log) {
  const size_t start = log.rfind("Running constructor");
  if (log.find("Failed to run constructor", start == std::string::npos ? 0 : start) != std::string::npos) return false;
  const size_t off = log.rfind("Switched into non-virtualization mode");
  if (off == std::string::npos) return true;
  const size_t on = log.rfind("Switched into virtualization mode");
  return on != std::string::npos && on > off;
}

const std::vector<std::string>& lxcfsProcFiles() {
  // slabinfo is root's only on the host and says nothing of limits.
  static const std::vector<std::string> files = {"cpuinfo", "diskstats", "loadavg", "meminfo",
                                                 "stat",    "swaps",     "uptime"};
  return files;
}

Result<pid_t> ensureLxcfs(const LxcfsConfig& config) {
  MOAT_ASSIGN(Served served, ensureServed(config));
  return served.pid;
}

Result<std::vector<ProcFileTree>> lxcfsProcTrees(const LxcfsConfig& config) {
  if (!config.enabled) return std::vector<ProcFileTree>{};
  Cache& c = cache();
  std::lock_guard<std::mutex> guard(c.mutex);
  if (!c.pidfd || c.dir != config.dir || os::pidfdExited(c.pidfd.get())) {
    c.pidfd.reset();
    c.files.clear();
    auto now = std::chrono::steady_clock::now();
    if (c.failure && c.dir == config.dir && c.failedAt && now - *c.failedAt < kRetryAfterFailure) return *c.failure;
    c.dir = config.dir;
    auto opened = [&]() -> Status {
      MOAT_ASSIGN(Served process, ensureServed(config));
      std::vector<std::pair<std::string, UniqueFd>> files;
      for (const auto& name : lxcfsProcFiles()) {
        MOAT_ASSIGN(UniqueFd fd, os::open(config.dir + "/proc/" + name, O_PATH | O_NOFOLLOW));
        files.emplace_back("/proc/" + name, std::move(fd));
      }
      c.pidfd = std::move(process.pidfd);
      c.files = std::move(files);
      return {};
    }();
    if (!opened.ok()) {
      c.failure = opened.error();
      c.failedAt = now;
      return opened.error();
    }
    c.failure.reset();
  }
  std::vector<ProcFileTree> trees;
  os::MountAttrs attrs;
  attrs.readOnly = true;
  attrs.noExec = true;
  for (const auto& [target, fd] : c.files) {
    MOAT_ASSIGN(UniqueFd tree, os::cloneTree(fd.get(), false));
    MOAT_TRY(os::setMountAttrs(tree.get(), attrs, false));
    trees.push_back({std::move(tree), target});
  }
  return trees;
}

Result<std::string> lxcfsBinary(const LxcfsConfig& config) {
  if (!config.binary.empty()) {
    if (::access(config.binary.c_str(), X_OK) != 0) return Error::fromErrno("lxcfs binary " + config.binary);
    return config.binary;
  }
  std::string path = os::executableIn("lxcfs", {"/usr/bin", "/bin", "/usr/sbin", "/sbin"});
  if (path.empty()) {
    return Error::make(Code::kMissingDependency, "lxcfs not found (install the lxcfs package, or set MOAT_LXCFS=off)");
  }
  return path;
}

}  // namespace moat::isolation::proc
