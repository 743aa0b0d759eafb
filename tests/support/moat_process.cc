#include "moat_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "os/file.h"

namespace moat::test {

std::string binDir() { return MOAT_BIN_DIR; }

bool isRoot() { return ::geteuid() == 0; }

const std::string& testStateDir() {
  static const std::string dir = [] {
    std::string d = "/tmp/moat-test-state-" + std::to_string(::getpid());
    (void)os::makeDirs(d, 0700);
    return d;
  }();
  return dir;
}

ProcessResult runProcess(const std::vector<std::string>& argv, const std::string& input,
                         const std::map<std::string, std::string>& env) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) std::abort();
  std::vector<std::string> envStrings = {"PATH=/usr/local/bin:/usr/bin:/bin"};
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : envStrings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  ::signal(SIGPIPE, SIG_IGN);
  size_t written = 0;
  if (input.empty()) {
    ::close(in[1]);
    in[1] = -1;
  } else {
    ::fcntl(in[1], F_SETFL, O_NONBLOCK);
  }
  ProcessResult result;
  bool outOpen = true, errOpen = true;
  while (outOpen || errOpen) {
    pollfd fds[3] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {in[1], POLLOUT, 0}};
    if (::poll(fds, in[1] >= 0 ? 3 : 2, -1) < 0) continue;
    char buf[65536];
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        (i == 0 ? outOpen : errOpen) = false;
        fds[i].fd = -1;
      } else {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      }
    }
    if (!outOpen) out[0] = -1;
    if (!errOpen) err[0] = -1;
    if (in[1] >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n = ::write(in[1], input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 || written == input.size()) {
        ::close(in[1]);
        in[1] = -1;
      }
    }
  }
  if (in[1] >= 0) ::close(in[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

ProcessResult runMoat(const std::vector<std::string>& args, const std::string& input,
                      const std::map<std::string, std::string>& env) {
  std::vector<std::string> argv = {binDir() + "/moat"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto fullEnv = env;
  fullEnv.emplace("MOAT_STATE", testStateDir());
  fullEnv.emplace("MOAT_STORAGE_GB", "8");
  return runProcess(argv, input, fullEnv);
}

namespace {

// Unmounts the test state directory's storage pool and removes it, so a test
// run leaves no mount, loop device or file behind.
class StateDirCleanup {
 public:
  ~StateDirCleanup() {
    std::string dir = "/tmp/moat-test-state-" + std::to_string(::getpid());
    if (!os::exists(dir)) return;
    ::umount2((dir + "/storage").c_str(), MNT_DETACH);
    (void)os::removeTree(dir);
  }
};
StateDirCleanup cleanup;

}  // namespace

}  // namespace moat::test
