#include "os/tool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>

#include "common/unique_fd.h"

namespace moat::os {

namespace {

constexpr size_t kTailKept = 2048;

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

[[noreturn]] void childFail(int errFd, const char* what) {
  // Async-signal-safe: what failed goes to the captured stream.
  (void)!::write(errFd, what, __builtin_strlen(what));
  ::_exit(127);
}

std::string name(const ToolRun& run) {
  const std::string& path = run.argv.front();
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string tailOf(const std::string& text, size_t maxBytes) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  if (t.size() <= maxBytes) return t;
  std::string cut = t.substr(t.size() - maxBytes);
  auto nl = cut.find('\n');
  if (nl != std::string::npos && nl + 1 < cut.size()) cut = cut.substr(nl + 1);
  return "..." + cut;
}

Status runTool(const ToolRun& run) {
  if (run.argv.empty()) return Error::make(Code::kInvalidArgument, "runTool: no program");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Error::fromErrno("pipe for " + name(run));
  UniqueFd readEnd(fds[0]);
  UniqueFd writeEnd(fds[1]);
  auto nullFd = UniqueFd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!nullFd) return Error::fromErrno("open /dev/null");
  // Everything the child needs, made before the fork (it may only make
  // async-signal-safe calls).
  std::vector<std::string> argv = run.argv;
  std::vector<std::string> env = run.env;
  std::vector<char*> argvp = pointers(argv);
  std::vector<char*> envp = pointers(env);
  const int stdinFd = run.stdinFd >= 0 ? run.stdinFd : nullFd.get();
  const int stdoutFd = run.stdoutFd >= 0 ? run.stdoutFd : writeEnd.get();
  const int errFd = writeEnd.get();
  const pid_t parent = ::getpid();
  struct rlimit fsize = {static_cast<rlim_t>(run.maxFileBytes), static_cast<rlim_t>(run.maxFileBytes)};
  const char* cwd = run.cwd.c_str();
  pid_t pid = ::fork();
  if (pid < 0) return Error::fromErrno("fork for " + name(run));
  if (pid == 0) {
    ::setpgid(0, 0);
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) childFail(errFd, "prctl PDEATHSIG failed\n");
    if (::getppid() != parent) ::_exit(127);  // the starter went before the prctl
    // A blocked or ignored signal would outlive the exec.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s = 1; s < NSIG; ++s) ::signal(s, SIG_DFL);
    if (run.maxFileBytes && ::setrlimit(RLIMIT_FSIZE, &fsize) != 0) childFail(errFd, "setrlimit failed\n");
    if (::dup2(stdinFd, 0) < 0 || ::dup2(stdoutFd, 1) < 0 || ::dup2(errFd, 2) < 0) {
      childFail(errFd, "dup2 failed\n");
    }
    if (run.landlockRuleset >= 0) {
      if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) childFail(2, "prctl NO_NEW_PRIVS failed\n");
      if (::syscall(SYS_landlock_restrict_self, run.landlockRuleset, 0) != 0) childFail(2, "landlock failed\n");
    }
    // dup2 onto itself keeps close-on-exec: cleared here for that case.
    if (run.passFd >= 0 && (run.passFd == 3 ? ::fcntl(3, F_SETFD, 0) : ::dup2(run.passFd, 3)) < 0) {
      childFail(2, "dup2 failed\n");
    }
    ::syscall(SYS_close_range, run.passFd >= 0 ? 4 : 3, ~0U, 0);
    if (::chdir(cwd) != 0) childFail(2, "chdir failed\n");
    ::execve(argvp[0], argvp.data(), envp.data());
    childFail(2, "exec failed: is the program installed?\n");
  }
  writeEnd.reset();
  std::string captured;
  std::optional<Error> stopped;
  bool eof = false;
  int status = 0;
  bool reaped = false;
  const auto killIt = [&] {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
  };
  for (;;) {
    if (!eof) {
      struct pollfd p = {readEnd.get(), POLLIN, 0};
      int n = ::poll(&p, 1, 200);
      if (n > 0) {
        char buf[4096];
        ssize_t got = ::read(readEnd.get(), buf, sizeof buf);
        if (got > 0) {
          captured.append(buf, static_cast<size_t>(got));
          if (captured.size() > 4 * kTailKept) captured.erase(0, captured.size() - 2 * kTailKept);
        } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
          eof = true;
        }
      }
    } else {
      ::usleep(20000);
    }
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      reaped = true;
      // What it wrote last, still in the pipe.
      char buf[4096];
      ssize_t got;
      while ((got = ::read(readEnd.get(), buf, sizeof buf)) > 0) captured.append(buf, static_cast<size_t>(got));
      ::kill(-pid, SIGKILL);  // anything it left in its group
      break;
    }
    if (std::chrono::steady_clock::now() >= run.deadline) {
      stopped = Error::make(Code::kTimeout, name(run) + " did not finish in time (killed)");
      break;
    }
    if (run.check) {
      Status s = run.check();
      if (!s.ok()) {
        stopped = s.error();
        break;
      }
    }
  }
  if (!reaped) {
    killIt();
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  const std::string tail = tailOf(captured, kTailKept);
  const std::string said = tail.empty() ? "" : ": " + tail;
  if (stopped) {
    stopped->context += said;
    return *stopped;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  if (WIFSIGNALED(status)) {
    std::string why = WTERMSIG(status) == SIGXFSZ ? " (a file it wrote reached the size limit)" : "";
    return Error::make(Code::kExec,
                       name(run) + " was killed by signal " + std::to_string(WTERMSIG(status)) + why + said);
  }
  return Error::make(Code::kExec, name(run) + " exited with status " + std::to_string(WEXITSTATUS(status)) + said);
}

}  // namespace moat::os
