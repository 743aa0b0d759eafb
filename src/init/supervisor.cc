#include "init/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/glob.h"
#include "common/trace.h"
#include "init/changes_wire.h"
#include "init/disk_view.h"
#include "init/file_ops.h"
#include "init/pty.h"
#include "os/exec_notify.h"
#include "os/exec_trace.h"
#include "os/file.h"
#include "os/machine.h"
#include "os/process.h"
#include "os/socket.h"
#include "os/statfs_notify.h"

namespace moat::init {
namespace {

// Launch threads: vforks waiting for their children's exec. More than the
// two cores here would not exec faster; a few keep a slow exec (a large
// binary on a cold cache) from holding up the others.
constexpr size_t kLaunchThreads = 4;

uint64_t nowUs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

// For a descriptor this loop just made: it has no other status flag to keep.
void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, O_NONBLOCK); }

// Gathered frames are written once this much waits.
constexpr size_t kOutboxFlush = 1u << 20;
constexpr size_t kReportBatch = 64;
constexpr uint64_t kReportDelayUs = 20000;
constexpr size_t kReportsWhileAlone = 4096;  // kept while no client is connected
constexpr size_t kImageBytes = 9u << 20;     // of a new program's argv: more than any exec takes
constexpr size_t kShownBytes = 16u << 10;    // of an argv in a report
constexpr size_t kAskBytes = 64u << 10;      // of an argv a person is asked about
constexpr uint64_t kPortPollMs = 100;        // a guest's port without a host: looked at this often

}  // namespace

Supervisor::Supervisor(int controlFd, bool isPidOne, int rendezvousFd, bool gateExec)
    : control_(controlFd),
      pidOne_(isPidOne),
      rendezvous_(rendezvousFd),
      launcher_(kLaunchThreads),
      gateExec_(gateExec) {}

void Supervisor::answerExec(uint64_t id, bool allow) {
  pendingExecs_.erase(id);
  (void)os::answerExecNotification(execListener_.get(), id, allow);  // gone meanwhile: nothing to answer
}

namespace {

// An argv as the log shows it: at most kShownBytes of it (an exec's may be
// megabytes), the cut marked.
std::vector<std::string> shown(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  size_t used = 0;
  for (const auto& a : argv) {
    if (used + a.size() > kShownBytes) {
      out.push_back(a.substr(0, kShownBytes - used) + "...(" + std::to_string(argv.size() - out.size()) +
                    " arguments cut, " + std::to_string(a.size()) + " bytes in this one)");
      break;
    }
    used += a.size();
    out.push_back(a);
  }
  return out;
}

size_t bytesOf(const std::vector<std::string>& argv) {
  size_t n = 0;
  for (const auto& a : argv) n += a.size() + 1;
  return n;
}

}  // namespace

void Supervisor::handleExecNotification() {
  auto n = os::receiveExecNotification(execListener_.get());
  if (!n.ok()) return;
  // df's calls (the listener is the same): answered on the disk view's thread.
  if (os::isStatfsCall(n->nr)) {
    if (diskView_) return diskView_->hand(execListener_.get(), n.value());
    return (void)os::answerExecNotification(execListener_.get(), n->id, true);
  }
  if (execPolicy_.mode == ExecPolicy::kAllowAll) {
    // Still traced after an earlier judged exec that failed: whatever runs now.
    if (auto it = traced_.find(n->pid); it != traced_.end()) {
      it->second = JudgedExec{};
      it->second->any = true;
    }
    return answerExec(n->id, true);
  }
  auto attempt = os::readExecAttempt(n.value());
  // Unreadable (it went meanwhile, or longer than any exec): refused, as
  // anything not judged is.
  if (!attempt.ok()) return answerExec(n->id, false);
  // The first exec of a command this loop launched: the client judged it.
  if (launcher_.claimLaunchExec(n->pid, attempt->filename)) return answerExec(n->id, true);
  if (!os::execNotificationValid(execListener_.get(), n->id)) return;  // its pid may be another's now
  uint8_t decision =
      execPolicy_.mode == ExecPolicy::kLocal ? execPolicy_.judge(judgedArgv(attempt->filename, attempt->argv)) : 1;
  // A person cannot read megabytes of arguments: what is that long is not asked about.
  if (decision == 1 && bytesOf(attempt->argv) > kAskBytes) decision = 2;
  ExecReport report;
  report.pid = static_cast<uint32_t>(n->pid);
  report.decision = decision;
  report.filename = attempt->filename;
  report.argv = shown(attempt->argv.empty() ? std::vector<std::string>{attempt->filename} : attempt->argv);
  if (decision == 1 && !hasClient()) return answerExec(n->id, false);  // nobody to ask: refused
  if (decision == 1) {
    ExecCheck check;
    check.id = n->id;
    check.pid = static_cast<uint32_t>(n->pid);
    check.filename = attempt->filename;
    check.argv = attempt->argv;  // at most kAskBytes
    check.parents = os::parentChain(n->pid);
    send(MsgType::kExecCheck, check.encode());
  }
  JudgedExec judged{std::move(attempt->execFn),
                    std::move(attempt->argv),
                    std::move(attempt->procPath),
                    attempt->viaDescriptor ? attempt->filename : std::string(),
                    {},
                    false};
  if (decision == 0) return (void)allowJudged(n->id, n->pid, std::move(judged), &report);
  if (decision == 2) return refuseExec(n->id, n->pid, std::move(report));
  pendingExecs_[n->id] = {n->pid, std::move(judged)};
}

void Supervisor::refusePendingExecs() {
  while (!pendingExecs_.empty()) answerExec(pendingExecs_.begin()->first, false);
}

void Supervisor::refuseExec(uint64_t id, pid_t pid, ExecReport report) {
  report.decision = 2;
  report.parents = os::parentChain(pid);  // while the process still waits
  answerExec(id, false);
  queueReport(report);
  releaseReports();  // at once, after what was allowed before it
}

bool Supervisor::allowJudged(uint64_t id, pid_t pid, JudgedExec judged, const ExecReport* report) {
  // An answer that came late (a verdict): the exec must still be the one
  // asked about, and the pid still its process.
  if (!os::execNotificationValid(execListener_.get(), id)) {
    pendingExecs_.erase(id);
    return false;
  }
  // Nothing runs unrecorded: with no client and its reports' room full, refused.
  if (report && !hasClient() && reportCount_ >= kReportsWhileAlone) {
    answerExec(id, false);
    return false;
  }
  auto file = os::identifyExecFile(pid, judged.procPath);
  // A descriptor's file judged by its name: it must be the file judged (the
  // descriptor may have been pointed at another since).
  if (file.ok() && !judged.viaDescriptor.empty() && file->path != judged.viaDescriptor) {
    refuseExec(id, pid, {static_cast<uint32_t>(pid), 2, file->path, shown(judged.argv), {}});
    return false;
  }
  if (file.ok()) {
    judged.file = file.value();
    judged.identified = true;
    if (judged.file.script && execPolicy_.mode == ExecPolicy::kLocal) {
      // The interpreter runs too, as a program of its own: the rules must
      // allow it (an ask for it is a refusal: nobody was asked).
      auto interpreterArgv = os::scriptArgv(judged.file, judged.execFn, judged.argv);
      if (execPolicy_.judge(judgedArgv(judged.file.interpreter, interpreterArgv)) != 0) {
        refuseExec(id, pid, {static_cast<uint32_t>(pid), 2, judged.file.interpreter, shown(interpreterArgv), {}});
        return false;
      }
    }
  }
  // Traced until the exec has run. EPERM: another process traces it, or
  // this loop already does (an earlier exec that failed).
  if (!os::traceExec(pid).ok() && os::tracerOf(pid) != ::getpid()) {
    refuseExec(id, pid, {static_cast<uint32_t>(pid), 2, judged.execFn, shown(judged.argv), {}});
    return false;
  }
  traced_[pid] = std::move(judged);
  if (report) queueReport(*report);
  answerExec(id, true);
  return true;
}

void Supervisor::onTraceStop(pid_t pid, int status) {
  if (os::classifyStop(status) != os::TraceStop::kExec) {
    (void)os::resumeStopped(pid, status);
    return;
  }
  // A thread other than the leader that execs takes the leader's id.
  pid_t before = os::idBeforeExec(pid);
  std::optional<JudgedExec> judged;
  // The exec judged is the exec'ing thread's; the leader's own entry (also
  // traced) is stale now.
  for (pid_t key : {before, pid}) {
    auto it = traced_.find(key);
    if (it == traced_.end()) continue;
    if (it->second && !judged) judged = std::move(it->second);
    traced_.erase(it);
  }
  if (judged && judged->any) {
    (void)os::untrace(pid);
    return;
  }
  auto image = os::readExecImage(pid, kImageBytes);
  auto running = os::runningFile(pid);
  if (judged && judged->identified && image.ok() && running.ok() &&
      os::sameExec(judged->execFn, judged->argv, judged->file, running.value(), image.value())) {
    (void)os::untrace(pid);
    return;
  }
  // It runs something other than what was judged (its request, or the file
  // it names, changed after the check), or what it runs cannot be read: it
  // ends before its first instruction, and the log says what it was.
  ::kill(pid, SIGKILL);
  ExecReport report;
  report.pid = static_cast<uint32_t>(pid);
  report.decision = 2;
  if (image.ok()) {
    report.filename = image->execFn;
    report.argv = shown(image->argv);
  }
  report.parents = os::parentChain(pid);
  (void)os::untrace(pid);
  queueReport(report);
  releaseReports();
}

void Supervisor::send(MsgType type, const std::string& payload) {
  if (!running_ || !hasClient()) return;   // no client: output is dropped
  if (payload.size() > kMaxFrame) return;  // never built: frames stay far below
  if (quiet_ && type != MsgType::kFileResult) {
    // Quiet (a checkpoint's, a memory fork's): what this loop says of its
    // own accord (a command's end, a launch, input taken) waits for the
    // quiet's end, so that a guest saved now has said exactly what its host
    // heard, and a copy says the rest to its own host.
    held_ += encodeFrame(type, payload);
    return;
  }
  releaseReports();
  outbox_ += encodeFrame(type, payload);
  if (outbox_.size() >= kOutboxFlush) flush();
}

bool Supervisor::queueReport(const ExecReport& report) {
  if (!running_) return false;
  if (!hasClient() && reportCount_ >= kReportsWhileAlone) return false;
  if (reports_.empty()) reportsSinceUs_ = nowUs();
  reports_ += encodeFrame(MsgType::kExecReport, report.encode());
  if (++reportCount_ >= kReportBatch && hasClient()) releaseReports();
  return true;
}

void Supervisor::endQuiet() {
  quiet_ = false;
  releaseReports();
  outbox_ += held_;
  held_.clear();
}

void Supervisor::releaseReports() {
  if (!hasClient() || quiet_) return;  // kept for the next client, or the quiet's end
  outbox_ += reports_;
  reports_.clear();
  reportCount_ = 0;
}

void Supervisor::flush() {
  size_t off = 0;
  while (off < outbox_.size() && hasClient()) {
    ssize_t n = ::write(control_, outbox_.data() + off, outbox_.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      // A guest's port (non-blocking): full while the host reads slowly,
      // hung up when the host is gone, which must not freeze this loop.
      pollfd p{control_, POLLOUT, 0};
      if (::poll(&p, 1, 1000) >= 0 && !(p.revents & (POLLHUP | POLLERR | POLLNVAL))) continue;
    }
    if (n <= 0) {
      outbox_.clear();
      return disconnect(true);
    }
    off += static_cast<size_t>(n);
  }
  outbox_.clear();
}

void Supervisor::disconnect(bool hostWent) {
  // A guest's port outlives a host that went (moatd restarts), not a
  // protocol error: that ends the guest, as it ends any environment.
  if ((rendezvous_ < 0 && !portMode_) || (portMode_ && !hostWent)) {
    running_ = false;  // the client is gone: nothing may outlive it
    return;
  }
  // A client restart: keep everything running until the next connection.
  // The next client knows nothing of flow control: output waiting for a
  // credit would wait for good.
  for (auto& [id, p] : processes_) {
    p.limit = OutputCredit::kUnlimited;
    p.limited = true;
  }
  if (portMode_ && control_ >= 0) {
    port_ = control_;  // kept open: a port opens once
  } else if (control_ >= 0) {
    ::close(control_);
  }
  control_ = -1;
  reattaching_ = false;
  reader_ = FrameReader();
  outbox_.clear();
  // Questions the client will never answer: refused, as anything not judged is.
  refusePendingExecs();
}

void Supervisor::awaitHostAgain() {
  // A port without a host polls as hung up (no wake-up on its return):
  // looked at on each turn of the loop, at least every kPortPollMs.
  pollfd p{port_, POLLIN, 0};
  if (::poll(&p, 1, 0) < 0 || (p.revents & (POLLHUP | POLLERR | POLLNVAL))) return;
  control_ = port_;
  port_ = -1;
  // The host speaks first (kReattach): nothing is sent until then, so that
  // what the guest says after the nonce (Hello, then the reports of
  // programs that ran meanwhile) is all the host reads.
  reattaching_ = true;
}

std::string Supervisor::helloPayload() { return Hello{kProtocolVersion, static_cast<uint32_t>(::getpid())}.encode(); }

std::string Supervisor::helloFrame() { return encodeFrame(MsgType::kHello, helloPayload()); }

void Supervisor::adoptConnection() {
  UniqueFd fd;
  auto message = os::receiveWithFd(rendezvous_, &fd);
  if (!message.ok()) {
    running_ = false;  // the environment's owner is gone
    return;
  }
  if (!fd) return;
  if (control_ >= 0) {
    // A client that went without this loop seeing it go: its questions
    // will not be answered (the next client never saw them).
    refusePendingExecs();
    ::close(control_);
  }
  control_ = fd.release();
  reader_ = FrameReader();
  outbox_.clear();  // frames for the connection that went away
  // Hello first on every connection (send would put the reports of programs
  // that ran while nobody was connected before it); they follow.
  outbox_ += helloFrame();
}

void Supervisor::readClient(bool drain) {
  constexpr int kDrainReads = 64;  // 4 MiB at most: a client that keeps writing does not hold execs for good
  for (int i = 0; i < (drain ? kDrainReads : 1) && control_ >= 0; ++i) {
    char buf[65536];
    ssize_t n = drain ? ::recv(control_, buf, sizeof buf, MSG_DONTWAIT) : ::read(control_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (drain && n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOTSOCK)) return;
    if (n <= 0) return disconnect(true);
    reader_.feed(buf, static_cast<size_t>(n));
    Frame frame;
    for (;;) {
      auto next = reader_.next(frame);
      if (!next.ok()) {
        protocolError(next.error().message());
        return disconnect(false);
      }
      if (!next.value()) break;
      handleFrame(frame);
      if (control_ < 0) return;  // the frame ended the connection
    }
  }
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

  // The thread that answers statfs calls is the one thread without the
  // filter below (it never execs). Failing, `df` shows the pool.
  if (diskCounters_) {
    auto view = DiskView::start(std::move(*diskCounters_));
    if (view.ok()) diskView_ = std::move(view.value());
    diskCounters_.reset();
  }
  traceStage("moat-init: statfs thread");
  // Before any other thread: the filter is the process's, and threads inherit it.
  if (gateExec_) {
    auto listener = os::installExecListener(diskView_ != nullptr);
    if (!listener.ok()) return 1;
    execListener_ = std::move(listener.value());
    traceStage("moat-init: exec gate");
    if (diskView_) diskView_->share(execListener_.get());
    launcher_.allowInline(false);         // this loop answers the launches' execs
    execPolicy_.mode = ExecPolicy::kAsk;  // until the client says how to judge
  } else if (diskView_) {
    auto listener = os::installStatfsListener();
    if (listener.ok()) {
      diskView_->serve(std::move(listener.value()));
    } else {
      diskView_.reset();
    }
  }

  send(MsgType::kHello, helloPayload());

  while (running_) {
    if (port_ >= 0) awaitHostAgain();
    if (!reports_.empty() && nowUs() - reportsSinceUs_ >= kReportDelayUs) releaseReports();
    flush();
    if (!running_) break;
    std::vector<pollfd> fds;
    std::vector<std::pair<uint32_t, int>> owners;  // process id, stream (0,1 out; 2 stdin)
    fds.push_back({control_, POLLIN, 0});          // -1 while disconnected: poll skips it
    fds.push_back({signalFd_.get(), POLLIN, 0});
    fds.push_back({rendezvous_, POLLIN, 0});
    fds.push_back({launcher_.readyFd(), POLLIN, 0});
    // Not while the client's message is half read (a large ExecPolicy
    // comes in pieces): an exec waits for the rules sent before it.
    bool midMessage = control_ >= 0 && reader_.partial();
    fds.push_back({execListener_ && !midMessage ? execListener_.get() : -1, POLLIN, 0});
    constexpr size_t kFirstStream = 5;
    for (auto& [id, p] : processes_) {
      // Output waits in the pipe until the launch is reported (Spawned
      // first), and while the client gives no credit for more.
      bool forward = !quiet_ && p.pid >= 0 && p.available() > 0;
      if (p.stdoutFd && forward) {
        fds.push_back({p.stdoutFd.get(), POLLIN, 0});
        owners.emplace_back(id, 0);
      }
      if (p.stderrFd && forward) {
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
        readClient(false);
      }
      if (fds[4].revents & POLLIN) {
        // What the client wrote before this exec began is read first (rules
        // it sent judge it); an exec waits while a message is half read.
        if (control_ >= 0) readClient(true);
        if (!(control_ >= 0 && reader_.partial())) handleExecNotification();
      }
      // Before the streams: a process's Spawned goes out before its output.
      if (fds[3].revents & POLLIN) {
        for (auto& launch : launcher_.takeFinished()) launched(std::move(launch));
        if (launcher_.pending() == 0) unclaimed_.clear();  // orphans
      }
      for (size_t i = kFirstStream; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        auto [id, stream] = owners[i - kFirstStream];
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
    finishDrained();
    enforceDeadlines();
    // An idle launch thread may end only while no command lives: a command's
    // parent is the thread that launched it (a parent-death signal it asked
    // for would come when that thread ends).
    launcher_.allowIdleExit(processes_.empty());
  }
  flush();
  killEverything();
  return 0;
}

void Supervisor::handleFrame(const Frame& frame) {
  // A host that came back says who it is first; nothing else counts before.
  if (reattaching_ && frame.type != MsgType::kReattach) return;
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
      if (it == processes_.end()) return;  // gone: its Exited tells the client
      Process& p = it->second;
      p.stdinReceived += req->data.size();
      if (!p.stdinFd) return reportStdin(p);  // closed: dropped
      p.stdinBuffer += req->data;
      if (!req->data.empty()) {
        char last = req->data.back();
        p.stdinAtLineStart = last == '\n' || last == '\r';
      }
      return flushStdin(p);
    }
    case MsgType::kOutputCredit: {
      auto req = OutputCredit::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      auto it = processes_.find(req->id);
      if (it == processes_.end()) return;  // ended meanwhile
      Process& p = it->second;
      if (!p.limited || req->upTo == OutputCredit::kUnlimited) {
        p.limit = req->upTo;  // the first starts flow control; kUnlimited ends it
      } else if (p.limit != OutputCredit::kUnlimited) {
        p.limit = std::max(p.limit, req->upTo);
      }
      p.limited = true;
      return;
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
      return signalProcess(it->second, req->signo, req->wholeGroup);
    }
    case MsgType::kShutdown:
      running_ = false;
      return;
    case MsgType::kReattach: {
      // Before anything else this connection gets: frames made for the
      // host that went are dropped; reports of programs that ran meanwhile
      // follow the Hello.
      reattaching_ = false;
      outbox_.clear();
      outbox_ += encodeFrame(MsgType::kReattached, frame.payload.substr(0, 64));
      outbox_ += helloFrame();
      endQuiet();  // what was held while quiet follows the Hello
      return;
    }
    case MsgType::kExecPolicy: {
      auto req = ExecPolicy::decode(frame.payload);
      if (!req.ok()) {
        // Rules it cannot read: it asks about every program rather than
        // go on with the ones it had.
        execPolicy_ = ExecPolicy{};
        execPolicy_.mode = ExecPolicy::kAsk;
        return protocolError(req.error().message());
      }
      execPolicy_ = std::move(req.value());
      return;
    }
    case MsgType::kExecVerdict: {
      auto req = ExecVerdict::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      auto pending = pendingExecs_.find(req->id);
      if (pending == pendingExecs_.end()) return;
      if (!req->allow) return answerExec(req->id, false);
      PendingExec exec = std::move(pending->second);
      // moatd records the start of what a person approved.
      return (void)allowJudged(req->id, exec.pid, std::move(exec.judged), nullptr);
      return;
    }
    case MsgType::kFile: {
      auto req = FileRequest::decode(frame.payload);
      if (!req.ok()) return protocolError(req.error().message());
      if (commands_ && (req->op == FileOp::kPause || req->op == FileOp::kResume || req->op == FileOp::kTasks ||
                        req->op == FileOp::kClock || req->op == FileOp::kQuiesce)) {
        return send(MsgType::kFileResult, guestCgroupRequest(req.value()).encode());
      }
      if (req->op == FileOp::kChanges && upperLayer_) {
        return send(MsgType::kFileResult, changesRequest(req.value()).encode());
      }
      return send(MsgType::kFileResult, runFileRequest(req.value()).encode());
    }
    default:
      return protocolError("unknown message type " + std::to_string(static_cast<int>(frame.type)));
  }
}

FileResult Supervisor::changesRequest(const FileRequest& request) {
  FileResult result;
  result.tag = request.tag;
  auto limits = decodeChangeLimits(request.data);
  if (!limits.ok()) {
    result.err = EINVAL;
    result.message = limits.error().message();
    return result;
  }
  // This loop answers nothing else while it walks: the walk is bounded in
  // time, and what it sends fits a frame.
  constexpr std::chrono::milliseconds kMostTime{3000};
  limits->deadline = std::min(limits->deadline, kMostTime);
  limits->maxChanges = std::min<size_t>(limits->maxChanges, 100000);
  limits->maxListBytes = std::min<size_t>(limits->maxListBytes, 8u << 20);
  limits->maxDiffBytes = std::min<size_t>(limits->maxDiffBytes, 4u << 20);
  // The template's files (its root image) through the disk's layer, against
  // the image alone.
  auto changes =
      isolation::fs::compareLayers({-1, lowerLayer_.get()}, {upperLayer_.get(), lowerLayer_.get()}, limits.value());
  if (!changes.ok()) {
    result.err = changes.error().sysErrno ? changes.error().sysErrno : EIO;
    result.message = changes.error().message();
    return result;
  }
  result.data = encodeChanges(changes.value());
  return result;
}

FileResult Supervisor::guestCgroupRequest(const FileRequest& request) {
  FileResult result;
  result.tag = request.tag;
  Status done;
  if (request.op == FileOp::kQuiesce && request.offset == kQuietEnd) {
    endQuiet();  // its commands' output is forwarded again
  } else if (request.op == FileOp::kQuiesce) {
    releaseReports();  // before the answer: nothing of it is left to send
    quiet_ = true;
  } else if (request.op == FileOp::kClock) {
    // Restored from a checkpoint: its clock says when it was saved. A
    // memory fork's copy is renamed too (target, version 8); each is
    // reseeded.
    done = os::setRealtime(request.offset);
    if (done.ok() && (!request.data.empty() || !request.target.empty())) {
      done = identity_.renew(request.target, request.data);
    }
    // A memory fork's copy (renamed): the programs it held waiting for the
    // source's host to judge are not this host's to know; refused, as when
    // a host goes.
    if (!request.target.empty()) refusePendingExecs();
  } else if (request.op == FileOp::kTasks) {
    // The commands' cgroup's, and moat-init's own (its threads, and the
    // keeper of the guest's identity), as a namespace environment's
    // count has its pid 1.
    auto tasks = commands_->tasks();
    auto own = os::listDir("/proc/self/task");
    if (tasks.ok()) {
      const uint64_t mine = (own.ok() ? own->size() : 1) + (identity_.started() ? 1 : 0);
      result.data = std::to_string(tasks.value() + mine);
    } else {
      done = tasks.error();
    }
  } else {
    // Every command (what runs in the guest but this loop): they stop
    // where they are; this loop goes on answering.
    done = request.op == FileOp::kPause ? commands_->freeze() : commands_->thaw();
    if (request.op == FileOp::kResume) endQuiet();
  }
  if (!done.ok()) {
    result.err =
        done.error().code == Code::kTimeout ? ETIMEDOUT : (done.error().sysErrno ? done.error().sysErrno : EIO);
    result.message = done.error().message();
  }
  return result;
}

void Supervisor::spawn(const SpawnRequest& req) {
  if (processes_.count(req.id)) return send(MsgType::kSpawnFailed, SpawnFailed{req.id, EEXIST, "id in use"}.encode());
  if (!devNull_) devNull_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  LaunchEnds ends;
  auto launch = prepareLaunch(req, devNull_.get(), ends);
  if (!launch.ok()) {
    return send(MsgType::kSpawnFailed, SpawnFailed{req.id, launch.error().sysErrno, launch.error().context}.encode());
  }
  if (commands_) launch.value()->cgroupFd = commands_->directory();
  // The process exists from now on: stdin, signals and its deadline apply
  // while it launches.
  Process& p = processes_[req.id];
  p.id = req.id;
  p.pty = req.pty;
  p.startUs = nowUs();
  p.deadlineUs = req.timeoutMs ? p.startUs + req.timeoutMs * 1000 : 0;
  p.outputLimit = req.outputLimit;
  for (UniqueFd* fd : {&ends.stdinFd, &ends.stdoutFd, &ends.stderrFd}) {
    if (*fd) setNonBlocking(fd->get());
  }
  p.stdinFd = std::move(ends.stdinFd);
  p.stdoutFd = std::move(ends.stdoutFd);
  p.stderrFd = std::move(ends.stderrFd);
  // Nothing else runs or launches: the vfork holds up no one, and the
  // command starts without a hand-over to a launch thread and back (one
  // client's execs one after another: ~4 % more of them a second).
  if (processes_.size() == 1 && launcher_.pending() == 0 && !execListener_) {
    runLaunch(*launch.value());
    return launched(std::move(launch.value()));
  }
  launcher_.submit(std::move(launch.value()));
}

void Supervisor::launched(std::unique_ptr<Launch> launch) {
  const uint32_t id = launch->request.id;
  auto it = processes_.find(id);
  if (it == processes_.end()) return;  // cannot happen: only launched() and reaping end one
  Process& p = it->second;
  if (launch->pid < 0) {
    processes_.erase(it);
    send(MsgType::kSpawnFailed, SpawnFailed{id, launch->err, launch->stage}.encode());
  } else {
    p.pid = launch->pid;
    send(MsgType::kSpawned, Spawned{id, static_cast<uint32_t>(p.pid)}.encode());
    // Reaped before its launch was reported: signals reach its group only.
    if (auto reaped = unclaimed_.find(p.pid); reaped != unclaimed_.end()) {
      p.exitStatus = reaped->second;  // reported by finishDrained
      unclaimed_.erase(reaped);
    }
    for (auto [signo, wholeGroup] : p.pendingSignals) signalProcess(p, signo, wholeGroup);
    p.pendingSignals.clear();
    if (p.timedOut) signalProcess(p, SIGKILL, true);
  }
}

void Supervisor::signalProcess(Process& p, int signo, bool wholeGroup) {
  if (p.pid < 0) {
    p.pendingSignals.emplace_back(signo, wholeGroup);
    return;
  }
  // Reaped (its Exited waits for its output): the pid may be another's, but
  // the group id is not reused while the group has members, and those are
  // what still holds its pipes.
  if (p.exitStatus >= 0 && !wholeGroup) return;
  ::kill(wholeGroup ? -p.pid : p.pid, signo);
}

Supervisor::PumpResult Supervisor::pump(Process& p, int streamIndex) {
  int fd = streamIndex == 0 ? p.stdoutFd.get() : p.stderrFd.get();
  char buf[kOutputChunk];
  if (p.available() == 0) return PumpResult::kAgain;  // the other stream used it up
  ssize_t n = ::read(fd, buf, std::min<uint64_t>(sizeof buf, p.available()));
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
  // Credit counts what is forwarded: the client's offsets count the same.
  p.forwarded += forward;
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
      if (errno == EAGAIN) break;
      if (errno == EINTR) continue;
      p.stdinBuffer.clear();  // EPIPE: the reader is gone
      p.stdinFd.reset();
      break;
    }
    p.stdinBuffer.erase(0, static_cast<size_t>(n));
  }
  if (p.closeStdinWhenDrained && p.stdinBuffer.empty()) p.stdinFd.reset();
  reportStdin(p);
}

void Supervisor::reportStdin(Process& p) {
  p.stdinOwnBytes = std::min(p.stdinOwnBytes, p.stdinBuffer.size());
  uint64_t held = std::min<uint64_t>(p.stdinBuffer.size() - p.stdinOwnBytes, p.stdinReceived);
  uint64_t taken = p.stdinReceived - held;
  if (taken == p.stdinReported) return;
  p.stdinReported = taken;
  send(MsgType::kStdinTaken, StdinTaken{p.id, taken}.encode());
}

void Supervisor::endPtyInput(Process& p) {
  // A terminal is not closed to end input: the line discipline turns its
  // EOF character into end-of-file for the reader, but only at the start of
  // a line. After a partial line, the first one just submits that line.
  if (!p.stdinFd) return;
  char eof = eofCharacter(p.stdinFd.get());
  size_t count = p.stdinAtLineStart ? 1 : 2;
  p.stdinBuffer.append(count, eof);
  p.stdinOwnBytes += count;
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
    pid_t pid = ::waitpid(-1, &status, WNOHANG | __WALL);
    if (pid <= 0) return;
    if (WIFSTOPPED(status)) {
      onTraceStop(pid, status);  // only tracees report stops here
      continue;
    }
    traced_.erase(pid);
    bool known = false;
    for (auto it = processes_.begin(); it != processes_.end(); ++it) {
      if (it->second.pid != pid || it->second.exitStatus >= 0) continue;
      known = true;
      it->second.exitStatus = status;
      break;
    }
    // A command whose launch is not reported yet, or an orphan.
    if (!known && launcher_.pending() > 0) unclaimed_[pid] = status;
  }
}

namespace {

// Nothing left to read and no writer: the end, seen without reading (there
// may be no credit for a read).
bool drained(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)) && !(p.revents & POLLIN);
}

}  // namespace

void Supervisor::finishDrained() {
  for (auto it = processes_.begin(); it != processes_.end();) {
    Process& p = it->second;
    if (p.exitStatus < 0) {
      ++it;
      continue;
    }
    // Forward what is still buffered in the pipes or the terminal; background
    // children that keep them open do not hold the exit report back. Output
    // under flow control may have to wait for credit first.
    for (int stream = 0; stream < 2; ++stream) {
      UniqueFd& fd = stream == 0 ? p.stdoutFd : p.stderrFd;
      PumpResult r = PumpResult::kData;
      while (fd && p.available() > 0 && r == PumpResult::kData) r = pump(p, stream);
      if (r == PumpResult::kEnd || (fd && p.available() == 0 && drained(fd.get()))) fd.reset();
    }
    if (p.available() == 0 && (p.stdoutFd || p.stderrFd)) {
      ++it;
      continue;
    }
    finish(p, p.exitStatus);
    it = processes_.erase(it);
  }
}

void Supervisor::finish(Process& p, int status) {
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
    // Not for one reaped already: it ended in time (its Exited waits for its output).
    if (p.deadlineUs && !p.timedOut && p.exitStatus < 0 && now >= p.deadlineUs) {
      p.timedOut = true;
      if (p.pid < 0) continue;  // killed once launched
      ::kill(-p.pid, SIGKILL);
      ::kill(p.pid, SIGKILL);
    }
  }
}

int Supervisor::pollTimeoutMs() const {
  uint64_t next = reports_.empty() || !hasClient() ? 0 : reportsSinceUs_ + kReportDelayUs;
  for (const auto& [id, p] : processes_) {
    if (p.deadlineUs && !p.timedOut && p.exitStatus < 0 && (next == 0 || p.deadlineUs < next)) next = p.deadlineUs;
  }
  if (port_ >= 0) {
    const uint64_t watch = nowUs() + kPortPollMs * 1000;
    if (next == 0 || watch < next) next = watch;
  }
  if (next == 0) return -1;
  uint64_t now = nowUs();
  return next <= now ? 0 : static_cast<int>((next - now + 999) / 1000);
}

void Supervisor::killEverything() {
  // Nobody answers execs from here on: closing the listener fails those
  // waiting (a launch's child among them, which its launch waits for).
  diskView_.reset();  // its thread answers what it was handed, then ends
  execListener_.reset();
  // Launches under way finish; their processes are killed with the rest.
  for (auto& launch : launcher_.stop()) {
    auto it = processes_.find(launch->request.id);
    if (it != processes_.end()) it->second.pid = launch->pid;
  }
  std::erase_if(processes_, [](const auto& entry) { return entry.second.pid < 0 || entry.second.exitStatus >= 0; });
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
