#include "moat_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "os/file.h"

namespace moat::test {

std::string binDir() { return MOAT_BIN_DIR; }

bool isRoot() { return ::geteuid() == 0; }

std::string cgroup2Mount() {
  auto mountinfo = os::readFile("/proc/self/mountinfo", 1 << 22);
  if (!mountinfo.ok()) return "";
  std::istringstream in(mountinfo.value());
  for (std::string line; std::getline(in, line);) {
    if (line.find(" - cgroup2 ") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string f[5];
    for (auto& x : f) fields >> x;
    return f[4];
  }
  return "";
}

std::string statusOf(pid_t pid, const std::string& key) {
  auto text = os::readFile("/proc/" + std::to_string(pid) + "/status");
  if (!text.ok()) return "";
  std::istringstream lines(text.value());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(key + ":", 0) == 0) {
      const size_t value = line.find_first_not_of(" \t", key.size() + 1);
      return value == std::string::npos ? "" : line.substr(value);
    }
  }
  return "";
}

const std::string& testStateDir() {
  static const std::string dir = [] {
    std::string d = "/tmp/moat-test-state-" + std::to_string(::getpid());
    (void)os::makeDirs(d, 0700);
    return d;
  }();
  return dir;
}

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, int in, int out,
            int err) {
  std::vector<std::string> envStrings = {"PATH=/usr/local/bin:/usr/bin:/bin"};
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : envStrings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    // As a user's shell would start it: the test's own SIGPIPE ignore (and
    // any blocked signal) must not be inherited.
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

ProcessResult runProcess(const std::vector<std::string>& argv, const std::string& input,
                         const std::map<std::string, std::string>& env) {
  RunningProcess process(argv, env);
  process.feed(input);
  return process.collect();
}

RunningProcess::RunningProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) std::abort();
  ::signal(SIGPIPE, SIG_IGN);
  pid_ = spawn(argv, env, in[0], out[1], err[1]);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  in_ = in[1];
  out_ = out[0];
  err_ = err[0];
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
}

RunningProcess::~RunningProcess() {
  if (status_ < 0 && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
  for (int fd : {in_, out_, err_, pidfd_}) {
    if (fd >= 0) ::close(fd);
  }
}

bool RunningProcess::write(const std::string& data) {
  size_t done = 0;
  while (in_ >= 0 && done < data.size()) {
    ssize_t n = ::write(in_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return in_ >= 0;
}

void RunningProcess::closeInput() {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
  input_.clear();
  inputWritten_ = 0;
}

void RunningProcess::feed(std::string data) {
  if (data.empty()) return closeInput();
  ::fcntl(in_, F_SETFL, O_NONBLOCK);
  input_ = std::move(data);
}

void RunningProcess::pump(int timeoutMs) {
  pollfd fds[3] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}, {input_.empty() ? -1 : in_, POLLOUT, 0}};
  if (::poll(fds, 3, timeoutMs) <= 0) return;
  if (fds[2].revents & (POLLOUT | POLLERR | POLLHUP)) {
    ssize_t n = ::write(in_, input_.data() + inputWritten_, input_.size() - inputWritten_);
    if (n > 0) inputWritten_ += static_cast<size_t>(n);
    if (n < 0 || inputWritten_ == input_.size()) closeInput();  // all of it, or a reader that is gone
  }
  char buf[65536];
  for (int i = 0; i < 2; ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    int& fd = i == 0 ? out_ : err_;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fd = -1;
    } else {
      (i == 0 ? outBuffer_ : errBuffer_).append(buf, static_cast<size_t>(n));
    }
  }
}

std::string RunningProcess::readLine(int timeoutMs) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    auto nl = outBuffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = outBuffer_.substr(0, nl + 1);
      outBuffer_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (out_ < 0 || left.count() <= 0) return std::exchange(outBuffer_, "");
    pump(static_cast<int>(left.count()));
  }
}

bool RunningProcess::exitsWithin(int timeoutMs) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (status_ < 0) {
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) return true;
    status_ = -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    // Until it exits (its pidfd turns readable) its output keeps flowing: a
    // full pipe would hold it up.
    pollfd fds[3] = {{pidfd_, POLLIN, 0}, {out_, POLLIN, 0}, {err_, POLLIN, 0}};
    if (::poll(fds, 3, static_cast<int>(left.count())) <= 0) continue;
    if (fds[1].revents || fds[2].revents) pump(0);
  }
  return true;
}

ProcessResult RunningProcess::wait() {
  closeInput();
  // Bounded: a process that does not end fails its test instead of hanging
  // the suite (it is killed; its exit code then says 137).
  if (!exitsWithin(120000)) ::kill(pid_, SIGKILL);
  return collect();
}

ProcessResult RunningProcess::collect() {
  while (out_ >= 0 || err_ >= 0) pump(-1);
  closeInput();
  if (status_ < 0) ::waitpid(pid_, &status_, 0);
  ProcessResult result;
  result.out = std::exchange(outBuffer_, "");
  result.err = std::exchange(errBuffer_, "");
  result.exitCode = WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
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
