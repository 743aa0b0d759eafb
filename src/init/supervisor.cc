#include "init/supervisor.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "init/file_ops.h"
#include "init/pty.h"
#include "os/socket.h"
#include "os/process.h"

namespace moat::init {
namespace {

// A new terminal's size until the client sends Resize: the VT100's.
constexpr uint16_t kInitialRows = 24;
constexpr uint16_t kInitialCols = 80;

uint64_t nowUs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

struct ChildFailure {
  int32_t err;
  char stage[28];
};

[[noreturn]] void childFail(int errFd, const char* stage, int err) {
  ChildFailure failure;
  std::memset(&failure, 0, sizeof failure);
  failure.err = err;
  std::strncpy(failure.stage, stage, sizeof failure.stage - 1);
  ssize_t ignored = ::write(errFd, &failure, sizeof failure);
  (void)ignored;
  ::_exit(127);
}

std::string lookupEnv(const std::vector<std::string>& env, const std::string& key) {
  for (const auto& entry : env) {
    if (entry.size() > key.size() && entry.compare(0, key.size(), key) == 0 &&
        entry[key.size()] == '=') {
      return entry.substr(key.size() + 1);
    }
  }
  return "";
}

// Everything the child needs, built before vfork: the child shares our
// memory and may only make system calls.
struct ExecPlan {
  std::vector<std::string> candidates;  // paths to try, in PATH order
  std::vector<char*> argv;
  std::vector<char*> envp;
  const char* cwd;
  uid_t uid;
  gid_t gid;
  bool switchIds;
  int stdio[3] = {-1, -1, -1};  // become the child's 0, 1 and 2
  bool controllingTty = false;  // stdio[0] is a pty slave: make it the session's terminal
};

ExecPlan planExec(const SpawnRequest& req) {
  ExecPlan plan;
  for (const auto& a : req.argv) plan.argv.push_back(const_cast<char*>(a.c_str()));
  plan.argv.push_back(nullptr);
  for (const auto& e : req.env) plan.envp.push_back(const_cast<char*>(e.c_str()));
  plan.envp.push_back(nullptr);
  plan.cwd = req.cwd.c_str();
  plan.uid = req.uid;
  plan.gid = req.gid;
  plan.switchIds = req.uid != ::getuid() || req.gid != ::getgid();
  const std::string& name = req.argv[0];
  if (name.find('/') != std::string::npos) {
    plan.candidates.push_back(name);
    return plan;
  }
  std::string path = lookupEnv(req.env, "PATH");
  if (path.empty()) path = "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    plan.candidates.push_back((dir.empty() ? "." : dir) + "/" + name);
    start = end + 1;
  }
  return plan;
}

// Runs in the vforked child: system calls only, never returns.
[[noreturn]] void execChild(const ExecPlan& plan, int failFd) {
  // moat-init reset every disposition when it started (see run()); only what
  // it set itself is undone here: SIGPIPE, and the blocked SIGCHLD.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);
  if (::setsid() < 0) childFail(failFd, "setsid", errno);
  // The new session's leader takes the terminal; its process group becomes
  // the terminal's foreground group (Ctrl-C, SIGWINCH).
  if (plan.controllingTty && ::ioctl(plan.stdio[0], TIOCSCTTY, 0) != 0) {
    childFail(failFd, "controlling tty", errno);
  }
  for (int target = 0; target < 3; ++target) {
    if (::dup2(plan.stdio[target], target) < 0) childFail(failFd, "dup2", errno);
  }
  // Everything else closes at exec, including failFd: EOF there means success.
  ::syscall(SYS_close_range, 3, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */);
  if (plan.switchIds && (::setgroups(0, nullptr) != 0 || ::setresgid(plan.gid, plan.gid, plan.gid) != 0 ||
                         ::setresuid(plan.uid, plan.uid, plan.uid) != 0)) {
    childFail(failFd, "setuid", errno);
  }
  if (::chdir(plan.cwd) != 0) childFail(failFd, "chdir", errno);
  int err = ENOENT;
  for (const auto& candidate : plan.candidates) {
    ::execve(candidate.c_str(), plan.argv.data(), plan.envp.data());
    if (errno == EACCES) {
      err = EACCES;
    } else if (errno != ENOENT && errno != ENOTDIR) {
      err = errno;
      break;
    }
  }
  childFail(failFd, "exec", err);
}

// One spawn's standard streams: the child's ends, closed here once it has
// exec'd, and ours. With a pty, childIn is the terminal's slave and serves
// as all three; childOut and childErr stay empty.
struct Streams {
  UniqueFd childIn, childOut, childErr;
  UniqueFd stdinWrite, stdoutRead, stderrRead;
};

// Errors carry the stage reported in SpawnFailed as their context.
Result<Streams> openPipes(bool stdinPipe) {
  Streams s;
  int fds[2];
  if (stdinPipe) {
    if (::pipe2(fds, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
    s.childIn.reset(fds[0]);
    s.stdinWrite.reset(fds[1]);
  } else {
    s.childIn.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!s.childIn) return Error::fromErrno("open /dev/null");
  }
  if (::pipe2(fds, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  s.stdoutRead.reset(fds[0]);
  s.childOut.reset(fds[1]);
  if (::pipe2(fds, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  s.stderrRead.reset(fds[0]);
  s.childErr.reset(fds[1]);
  return s;
}

// The master is the process's only stream: output is read from it and input
// written to a second descriptor of it, so that either end can finish alone.
Result<Streams> openTerminal(const ExecPlan& plan) {
  auto pty = openPty(kInitialRows, kInitialCols);
  if (!pty.ok()) return Error::fromErrno("pty", pty.error().sysErrno);
  // As grantpt would: the terminal belongs to the command's user. Best
  // effort: an id the environment cannot map fails at setuid anyway.
  if (plan.switchIds) {
    int ignored = ::fchown(pty->slave.get(), plan.uid, static_cast<gid_t>(-1));
    (void)ignored;
  }
  Streams s;
  s.stdoutRead = std::move(pty->master);
  s.stdinWrite.reset(::fcntl(s.stdoutRead.get(), F_DUPFD_CLOEXEC, 0));
  if (!s.stdinWrite) return Error::fromErrno("pty");
  s.childIn = std::move(pty->slave);
  return s;
}

}  // namespace

Supervisor::Supervisor(int controlFd, bool isPidOne, int rendezvousFd)
    : control_(controlFd), pidOne_(isPidOne), rendezvous_(rendezvousFd) {}

void Supervisor::send(MsgType type, const std::string& payload) {
  if (!running_ || control_ < 0) return;  // no client: output is dropped
  if (!writeFrame(control_, type, payload).ok()) disconnect();
}

void Supervisor::disconnect() {
  if (rendezvous_ < 0) {
    running_ = false;  // the client is gone: nothing may outlive it
    return;
  }
  // A client restart: keep everything running until the next connection.
  if (control_ >= 0) ::close(control_);
  control_ = -1;
  reader_ = FrameReader();
}

void Supervisor::adoptConnection() {
  UniqueFd fd;
  auto message = os::receiveWithFd(rendezvous_, &fd);
  if (!message.ok()) {
    running_ = false;  // the environment's owner is gone
    return;
  }
  if (!fd) return;
  if (control_ >= 0) ::close(control_);
  control_ = fd.release();
  reader_ = FrameReader();
  send(MsgType::kHello, Hello{kProtocolVersion, static_cast<uint32_t>(::getpid())}.encode());
}

void Supervisor::protocolError(const std::string& message) {
  send(MsgType::kProtocolError, Encoder().bytes(message).take());
}

int Supervisor::run() {
  // Ignored signals stay ignored across exec: whatever moat-init inherited
  // (the spawner ignores SIGTERM and friends) would reach every command.
  os::resetSignals();
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  signalFd_.reset(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  ::signal(SIGPIPE, SIG_IGN);
  if (!signalFd_) return 1;

  send(MsgType::kHello, Hello{kProtocolVersion, static_cast<uint32_t>(::getpid())}.encode());

  while (running_) {
    std::vector<pollfd> fds;
    std::vector<std::pair<uint32_t, int>> owners;  // process id, stream (0,1 out; 2 stdin)
    fds.push_back({control_, POLLIN, 0});  // -1 while disconnected: poll skips it
    fds.push_back({signalFd_.get(), POLLIN, 0});
    fds.push_back({rendezvous_, POLLIN, 0});
    for (auto& [id, p] : processes_) {
      if (p.stdoutFd) {
        fds.push_back({p.stdoutFd.get(), POLLIN, 0});
        owners.emplace_back(id, 0);
      }
      if (p.stderrFd) {
        fds.push_back({p.stderrFd.get(), POLLIN, 0});
        owners.emplace_back(id, 1);
      }
      if (p.stdinFd && !p.stdinBuffer.empty()) {
        fds.push_back({p.stdinFd.get(), POLLOUT, 0});
        owners.emplace_back(id, 2);
      }
    }
    int ready = ::poll(fds.data(), fds.size(), pollTimeoutMs());
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0) {
      if (fds[2].revents & (POLLIN | POLLHUP | POLLERR)) adoptConnection();
      if (control_ >= 0 && fds[0].fd == control_ && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
        char buf[65536];
        ssize_t n = ::read(control_, buf, sizeof buf);
        if (n <= 0 && !(n < 0 && errno == EINTR)) disconnect();
        if (n > 0) {
          reader_.feed(buf, static_cast<size_t>(n));
          Frame frame;
          for (;;) {
            auto next = reader_.next(frame);
            if (!next.ok()) {
              protocolError(next.error().message());
              disconnect();
              break;
            }
            if (!next.value()) break;
            handleFrame(frame);
          }
        }
      }
      for (size_t i = 3; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        auto [id, stream] = owners[i - 3];
        auto it = processes_.find(id);
        if (it == processes_.end()) continue;
        if (stream == 2) {
          flushStdin(it->second);
        } else if (pump(it->second, stream) == PumpResult::kEnd) {
          (stream == 0 ? it->second.stdoutFd : it->second.stderrFd).reset();
        }
      }
      if (fds[1].revents & POLLIN) {
        struct signalfd_siginfo info;
        while (::read(signalFd_.get(), &info, sizeof info) == sizeof info) {
        }
        reapChildren();
      }
    }
    enforceDeadlines();
  }
  killEverything();
  return 0;
}

void Supervisor::handleFrame(const Frame& frame) {
  switch (frame.type) {
    case MsgType::kSpawn: {
      auto req = SpawnRequest::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      return spawn(req.value());
    }
    case MsgType::kStdin: {
      auto req = StdinData::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      auto it = processes_.find(req->id);
      if (it == processes_.end() || !it->second.stdinFd) return;  // gone or closed: drop
      Process& p = it->second;
      p.stdinBuffer += req->data;
      if (!req->data.empty()) {
        char last = req->data.back();
        p.stdinAtLineStart = last == '\n' || last == '\r';
      }
      return flushStdin(p);
    }
    case MsgType::kCloseStdin: {
      auto req = ProcessRef::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      auto it = processes_.find(req->id);
      if (it == processes_.end()) return;
      if (it->second.pty) return endPtyInput(it->second);
      it->second.closeStdinWhenDrained = true;
      return flushStdin(it->second);
    }
    case MsgType::kResize: {
      auto req = Resize::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      return resize(req.value());
    }
    case MsgType::kSignal: {
      auto req = SignalRequest::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      auto it = processes_.find(req->id);
      if (it == processes_.end()) return;
      ::kill(req->wholeGroup ? -it->second.pid : it->second.pid, req->signo);
      return;
    }
    case MsgType::kShutdown:
      running_ = false;
      return;
    case MsgType::kFile: {
      auto req = FileRequest::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      return send(MsgType::kFileResult, runFileRequest(req.value()).encode());
    }
    default:
      return protocolError("unknown message type " + std::to_string(static_cast<int>(frame.type)));
  }
}

void Supervisor::spawn(const SpawnRequest& req) {
  auto fail = [&](int err, const std::string& stage) {
    send(MsgType::kSpawnFailed, SpawnFailed{req.id, err, stage}.encode());
  };
  if (processes_.count(req.id)) return fail(EEXIST, "id in use");

  ExecPlan plan = planExec(req);
  auto opened = req.pty ? openTerminal(plan) : openPipes(req.stdinPipe);
  if (!opened.ok()) return fail(opened.error().sysErrno, opened.error().context);
  Streams& streams = opened.value();
  int failPipe[2];
  if (::pipe2(failPipe, O_CLOEXEC) != 0) return fail(errno, "pipe");
  UniqueFd failRead(failPipe[0]), failWrite(failPipe[1]);
  if (req.pty) {
    plan.stdio[0] = plan.stdio[1] = plan.stdio[2] = streams.childIn.get();
    plan.controllingTty = true;
  } else {
    plan.stdio[0] = streams.childIn.get();
    plan.stdio[1] = streams.childOut.get();
    plan.stdio[2] = streams.childErr.get();
  }

  uint64_t start = nowUs();
  // vfork: no copy of our page tables, and we resume once the child has
  // exec'd (or failed), which is when we would read the fail pipe anyway.
  pid_t pid = ::vfork();
  if (pid < 0) return fail(errno, "fork");
  if (pid == 0) execChild(plan, failWrite.get());

  failWrite.reset();
  // Only the child may hold its ends: a pty's master reads EIO, and a pipe
  // EOF, once the last of them is closed.
  streams.childIn.reset();
  streams.childOut.reset();
  streams.childErr.reset();
  ChildFailure failure;
  ssize_t n;
  do {
    n = ::read(failRead.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof failure)) {
    int status;
    ::waitpid(pid, &status, 0);
    failure.stage[sizeof failure.stage - 1] = '\0';
    return fail(failure.err, failure.stage);
  }

  Process& p = processes_[req.id];
  p.id = req.id;
  p.pid = pid;
  p.pty = req.pty;
  p.startUs = start;
  p.deadlineUs = req.timeoutMs ? start + req.timeoutMs * 1000 : 0;
  p.outputLimit = req.outputLimit;
  for (UniqueFd* fd : {&streams.stdinWrite, &streams.stdoutRead, &streams.stderrRead}) {
    if (*fd) setNonBlocking(fd->get());
  }
  p.stdinFd = std::move(streams.stdinWrite);
  p.stdoutFd = std::move(streams.stdoutRead);
  p.stderrFd = std::move(streams.stderrRead);
  send(MsgType::kSpawned, Spawned{req.id, static_cast<uint32_t>(pid)}.encode());
}

Supervisor::PumpResult Supervisor::pump(Process& p, int streamIndex) {
  int fd = streamIndex == 0 ? p.stdoutFd.get() : p.stderrFd.get();
  char buf[kOutputChunk];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return PumpResult::kAgain;
  // A pipe reads 0 once its writers are gone; a pty's master fails with EIO
  // once nothing holds the terminal, after what it buffered has been read.
  if (n <= 0) return PumpResult::kEnd;
  uint64_t before = p.bytes[streamIndex];
  p.bytes[streamIndex] += static_cast<uint64_t>(n);
  size_t forward = static_cast<size_t>(n);
  if (p.outputLimit && p.bytes[streamIndex] > p.outputLimit) {
    p.truncated[streamIndex] = true;
    forward = before >= p.outputLimit ? 0 : static_cast<size_t>(p.outputLimit - before);
  }
  if (forward > 0) {
    Output out{p.id, streamIndex == 0 ? Stream::kStdout : Stream::kStderr, std::string(buf, forward)};
    send(MsgType::kOutput, out.encode());
  }
  return PumpResult::kData;
}

void Supervisor::flushStdin(Process& p) {
  while (p.stdinFd && !p.stdinBuffer.empty()) {
    ssize_t n = ::write(p.stdinFd.get(), p.stdinBuffer.data(), p.stdinBuffer.size());
    if (n < 0) {
      if (errno == EAGAIN) return;
      if (errno == EINTR) continue;
      p.stdinBuffer.clear();  // EPIPE: the reader is gone
      p.stdinFd.reset();
      return;
    }
    p.stdinBuffer.erase(0, static_cast<size_t>(n));
  }
  if (p.closeStdinWhenDrained && p.stdinBuffer.empty()) p.stdinFd.reset();
}

void Supervisor::endPtyInput(Process& p) {
  // A terminal is not closed to end input: the line discipline turns its
  // EOF character into end-of-file for the reader, but only at the start of
  // a line. After a partial line, the first one just submits that line.
  if (!p.stdinFd) return;
  char eof = eofCharacter(p.stdinFd.get());
  p.stdinBuffer.append(p.stdinAtLineStart ? 1 : 2, eof);
  p.stdinAtLineStart = true;
  flushStdin(p);
}

void Supervisor::resize(const Resize& req) {
  auto it = processes_.find(req.id);
  // The master's output end stays open while anything holds the terminal.
  if (it == processes_.end() || !it->second.pty || !it->second.stdoutFd) return;
  (void)setWindowSize(it->second.stdoutFd.get(), req.rows, req.cols);
}

void Supervisor::reapChildren() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto it = processes_.begin(); it != processes_.end(); ++it) {
      if (it->second.pid != pid) continue;
      finish(it->second, status);
      processes_.erase(it);
      break;
    }
  }
}

void Supervisor::finish(Process& p, int status) {
  // Forward what is still buffered in the pipes or the terminal; background
  // children that keep them open do not hold the exit report back.
  for (int stream = 0; stream < 2; ++stream) {
    UniqueFd& fd = stream == 0 ? p.stdoutFd : p.stderrFd;
    PumpResult r = PumpResult::kData;
    while (fd && r == PumpResult::kData) r = pump(p, stream);
  }
  Exited e;
  e.id = p.id;
  if (WIFEXITED(status)) {
    e.exitCode = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
  }
  e.timedOut = p.timedOut;
  e.stdoutBytes = p.bytes[0];
  e.stderrBytes = p.bytes[1];
  e.stdoutTruncated = p.truncated[0];
  e.stderrTruncated = p.truncated[1];
  e.durationUs = nowUs() - p.startUs;
  send(MsgType::kExited, e.encode());
}

void Supervisor::enforceDeadlines() {
  uint64_t now = nowUs();
  for (auto& [id, p] : processes_) {
    if (p.deadlineUs && !p.timedOut && now >= p.deadlineUs) {
      p.timedOut = true;
      ::kill(-p.pid, SIGKILL);
      ::kill(p.pid, SIGKILL);
    }
  }
}

int Supervisor::pollTimeoutMs() const {
  uint64_t next = 0;
  for (const auto& [id, p] : processes_) {
    if (p.deadlineUs && !p.timedOut && (next == 0 || p.deadlineUs < next)) next = p.deadlineUs;
  }
  if (next == 0) return -1;
  uint64_t now = nowUs();
  return next <= now ? 0 : static_cast<int>((next - now + 999) / 1000);
}

void Supervisor::killEverything() {
  if (pidOne_) {
    ::kill(-1, SIGKILL);
  } else {
    for (auto& [id, p] : processes_) {
      ::kill(-p.pid, SIGKILL);
      ::kill(p.pid, SIGKILL);
    }
  }
  for (auto& [id, p] : processes_) ::waitpid(p.pid, nullptr, 0);
}

}  // namespace moat::init
