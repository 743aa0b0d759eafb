#include "init/launch.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "init/pty.h"
#include "os/process.h"

namespace moat::init {
namespace {

// A new terminal's size until the client sends Resize: the VT100's.
constexpr uint16_t kInitialRows = 24;
constexpr uint16_t kInitialCols = 80;

// In the vforked child, which shares the launch's memory: report and exit.
[[noreturn]] void childFail(Launch& l, const char* stage, int err) {
  l.stage = stage;
  l.err = err ? err : EIO;
  ::_exit(127);
}

std::string lookupEnv(const std::vector<std::string>& env, const std::string& key) {
  for (const auto& entry : env) {
    if (entry.size() > key.size() && entry.compare(0, key.size(), key) == 0 && entry[key.size()] == '=') {
      return entry.substr(key.size() + 1);
    }
  }
  return "";
}

void planExec(Launch& l) {
  const SpawnRequest& req = l.request;
  for (const auto& a : req.argv) l.argv.push_back(const_cast<char*>(a.c_str()));
  l.argv.push_back(nullptr);
  for (const auto& e : req.env) l.envp.push_back(const_cast<char*>(e.c_str()));
  l.envp.push_back(nullptr);
  // moat-init's own ids never change.
  static const uid_t selfUid = ::getuid();
  static const gid_t selfGid = ::getgid();
  l.switchIds = req.uid != selfUid || req.gid != selfGid;
  const std::string& name = req.argv[0];
  if (name.find('/') != std::string::npos) {
    l.candidates.push_back(name);
    return;
  }
  std::string path = lookupEnv(req.env, "PATH");
  if (path.empty()) path = "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    l.candidates.push_back((dir.empty() ? "." : dir) + "/" + name);
    start = end + 1;
  }
}

// Runs in the vforked child: system calls only, never returns.
[[noreturn]] void execChild(Launch& l) {
  // moat-init reset every disposition when it started (Supervisor::run);
  // only what it set itself is undone here: SIGPIPE, and the blocked SIGCHLD.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);
  if (::setsid() < 0) childFail(l, "setsid", errno);
  // The new session's leader takes the terminal; its process group becomes
  // the terminal's foreground group (Ctrl-C, SIGWINCH).
  if (l.controllingTty && ::ioctl(l.childIn.get(), TIOCSCTTY, 0) != 0) childFail(l, "controlling tty", errno);
  const int in = l.childIn ? l.childIn.get() : l.nullIn;
  const int stdio[3] = {in, l.controllingTty ? l.childIn.get() : l.childOut.get(),
                        l.controllingTty ? l.childIn.get() : l.childErr.get()};
  for (int target = 0; target < 3; ++target) {
    if (::dup2(stdio[target], target) < 0) childFail(l, "dup2", errno);
  }
  // Everything else closes at exec.
  (void)os::markCloseOnExecFrom(3);
  // moat-init's alone (isolation/caps initCapabilities): no command may
  // read or follow another process, nor (in a microVM, where moat-init
  // keeps them to power off and to set the clock after a restore) end the
  // guest or set its clock.
  if (int err = os::dropCapabilityInChild(CAP_SYS_PTRACE)) childFail(l, "capabilities", err);
  if (int err = os::dropCapabilityInChild(CAP_SYS_BOOT)) childFail(l, "capabilities", err);
  if (int err = os::dropCapabilityInChild(CAP_SYS_TIME)) childFail(l, "capabilities", err);
  if (l.switchIds) {
    if (int err = os::switchIdsInChild(l.request.uid, l.request.gid)) childFail(l, "setuid", err);
  }
  if (::chdir(l.request.cwd.c_str()) != 0) childFail(l, "chdir", errno);
  l.childPid.store(static_cast<pid_t>(::syscall(SYS_getpid)));
  int err = ENOENT;
  for (const auto& candidate : l.candidates) {
    ::execve(candidate.c_str(), l.argv.data(), l.envp.data());
    if (errno == EACCES) {
      err = EACCES;
    } else if (errno != ENOENT && errno != ENOTDIR) {
      err = errno;
      break;
    }
  }
  childFail(l, "exec", err);
}

}  // namespace

Result<std::unique_ptr<Launch>> prepareLaunch(SpawnRequest request, int devNull, LaunchEnds& ends) {
  auto l = std::make_unique<Launch>();
  l->request = std::move(request);
  planExec(*l);
  l->claimed.assign(l->candidates.size(), false);
  int fds[2];
  if (l->request.pty) {
    auto pty = openPty(kInitialRows, kInitialCols);
    if (!pty.ok()) return Error::fromErrno("pty", pty.error().sysErrno);
    // As grantpt would: the terminal belongs to the command's user. Best
    // effort: an id the environment cannot map fails at setuid anyway.
    if (l->switchIds) {
      int ignored = ::fchown(pty->slave.get(), l->request.uid, static_cast<gid_t>(-1));
      (void)ignored;
    }
    ends.stdoutFd = std::move(pty->master);
    ends.stdinFd.reset(::fcntl(ends.stdoutFd.get(), F_DUPFD_CLOEXEC, 0));
    if (!ends.stdinFd) return Error::fromErrno("pty");
    l->childIn = std::move(pty->slave);
    l->controllingTty = true;
  } else {
    if (l->request.stdinPipe) {
      if (::pipe2(fds, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
      l->childIn.reset(fds[0]);
      ends.stdinFd.reset(fds[1]);
    } else {
      l->nullIn = devNull;
    }
    if (::pipe2(fds, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
    ends.stdoutFd.reset(fds[0]);
    l->childOut.reset(fds[1]);
    if (::pipe2(fds, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
    ends.stderrFd.reset(fds[0]);
    l->childErr.reset(fds[1]);
  }
  return l;
}

namespace {

int execChildOf(void* launch) { execChild(*static_cast<Launch*>(launch)); }

}  // namespace

void runLaunch(Launch& l) {
  // vfork: no copy of the page tables, and this thread resumes once the
  // child has exec'd or exited; a child that failed has set l.err by then.
  // Into a cgroup of its own: the same by clone3, which starts it there.
  pid_t pid = -1;
  if (l.cgroupFd >= 0) {
    auto child = os::cloneVfork({0, l.cgroupFd}, execChildOf, &l);
    if (!child.ok()) {
      l.err = child.error().sysErrno;
      l.stage = "fork";
      return;
    }
    pid = child->pid;
  } else {
    pid = ::vfork();
    if (pid < 0) {
      l.err = errno;
      l.stage = "fork";
      return;
    }
    if (pid == 0) execChild(l);
  }
  l.childIn.reset();
  l.childOut.reset();
  l.childErr.reset();
  if (l.err != 0) {
    // moat-init's loop may reap it first (waitpid(-1)); either way it is gone.
    int status;
    ::waitpid(pid, &status, 0);
    return;
  }
  l.pid = pid;
}

}  // namespace moat::init
