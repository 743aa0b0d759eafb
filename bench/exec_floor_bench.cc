// The exec gate's mechanism alone, without moat: a shell loop of N execs of
// /bin/true on the host, run with
//
//   none    no exec filter;
//   notify  the exec gate's seccomp filter (os::installExecListener), each
//           exec answered "go on" at once by this process, which polls the
//           listener as moat-init does;
//   trace   notify, and each exec traced until it has happened (PTRACE_SEIZE,
//           the stop after the exec, the detach): the second look's
//           mechanism, without reading anything.
//
// Prints the loop's own figure, µs per exec. bench/exec_gate.py runs it
// interleaved with the environments, as the floor of what the gate can
// cost on this machine. Needs root for `trace` (ptrace of a grandchild).
//
//   moat-exec-floor-bench none|notify|trace N

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "os/exec_notify.h"
#include "os/exec_trace.h"
#include "os/process.h"

namespace {

int fail(const char* what, const std::string& why) {
  std::fprintf(stderr, "moat-exec-floor-bench: %s: %s\n", what, why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: moat-exec-floor-bench none|notify|trace N\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int execs = std::atoi(argv[2]);
  if ((mode != "none" && mode != "notify" && mode != "trace") || execs <= 0) return fail("arguments", "bad mode or N");
  const std::string loop = "s=$(date +%s%N); i=0; while [ $i -lt " + std::to_string(execs) +
                           " ]; do /bin/true; i=$((i+1)); done; e=$(date +%s%N); echo $(((e-s)/1000))";

  moat::UniqueFd listener;
  if (mode != "none") {
    if (auto st = moat::os::setNoNewPrivs(); !st.ok()) return fail("no_new_privs", st.error().message());
    auto l = moat::os::installExecListener();
    if (!l.ok()) return fail("exec listener", l.error().message());
    listener = std::move(l.value());
  }
  // Stops of traced processes arrive as SIGCHLD, read with the listener in
  // one poll (as moat-init does), not waited for.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  moat::UniqueFd children(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!children) return fail("signalfd", std::strerror(errno));
  int out[2];
  if (::pipe(out) != 0) return fail("pipe", std::strerror(errno));
  pid_t child = ::fork();
  if (child < 0) return fail("fork", std::strerror(errno));
  if (child == 0) {
    ::dup2(out[1], 1);
    ::execl("/bin/sh", "sh", "-c", loop.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);

  std::string printed;
  bool reaped = false;
  int childStatus = 0;
  for (bool open = true; open;) {
    struct pollfd fds[3] = {
        {out[0], POLLIN, 0}, {listener ? listener.get() : -1, POLLIN, 0}, {children.get(), POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      return fail("poll", std::strerror(errno));
    }
    if (fds[1].revents & POLLIN) {
      auto n = moat::os::receiveExecNotification(listener.get());
      if (!n.ok()) continue;
      if (mode == "trace") (void)moat::os::traceExec(n->pid);
      (void)moat::os::answerExecNotification(listener.get(), n->id, true);
    }
    if (fds[2].revents & POLLIN) {
      struct signalfd_siginfo info;
      while (::read(children.get(), &info, sizeof info) > 0) {
      }
      int status = 0;
      for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG | __WALL)) > 0;) {
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
          if (pid == child) reaped = true, childStatus = status;
          continue;
        }
        if (moat::os::classifyStop(status) == moat::os::TraceStop::kExec) {
          (void)moat::os::untrace(pid);
        } else {
          (void)moat::os::resumeStopped(pid, status);
        }
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP)) {
      char buf[256];
      ssize_t got = ::read(out[0], buf, sizeof buf);
      if (got > 0) printed.append(buf, static_cast<size_t>(got));
      if (got <= 0) open = false;
    }
  }
  if (!reaped) ::waitpid(child, &childStatus, 0);
  if (!WIFEXITED(childStatus) || WEXITSTATUS(childStatus) != 0) return fail("loop", "the shell loop failed");
  std::printf("%.1f\n", std::atof(printed.c_str()) / execs);
  return 0;
}
