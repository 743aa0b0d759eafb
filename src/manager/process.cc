#include "manager/process.h"

#include <signal.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "common/clock.h"
#include "common/enum_names.h"

namespace moat::manager {
namespace {

// moat-init answers a Spawn within a fork and an exec; this only bounds a
// wedged environment.
constexpr auto kStartTimeout = std::chrono::seconds(30);

}  // namespace

const char* processStateName(ProcessState state) {
  static constexpr EnumName<ProcessState> kNames[] = {
      {ProcessState::kStarting, "starting"}, {ProcessState::kRunning, "running"}, {ProcessState::kExited, "exited"},
      {ProcessState::kFailed, "failed"},     {ProcessState::kLost, "lost"},
  };
  static_assert(std::size(kNames) == static_cast<size_t>(ProcessState::kLost) + 1);
  return nameIn(kNames, state, "unknown");
}

Process::Process(uint64_t id, std::vector<std::string> argv, std::string kind, bool pty, bool stdinOpen,
                 size_t outputCapPerStream)
    : id_(id), log_(outputCapPerStream) {
  info_.id = id;
  info_.argv = std::move(argv);
  info_.kind = std::move(kind);
  info_.pty = pty;
  info_.stdinOpen = stdinOpen;
  info_.startedAtMs = nowMs();
}

void Process::onSpawned(uint32_t pid) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (info_.state != ProcessState::kStarting) return;
  info_.pid = pid;
  info_.state = ProcessState::kRunning;
  cv_.notify_all();
}

void Process::onSpawnFailed(int err, const std::string& stage) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (info_.ended()) return;
  info_.state = ProcessState::kFailed;
  info_.spawnErrno = err;
  info_.spawnStage = stage;
  info_.stdinOpen = false;
  info_.endedAtMs = nowMs();
  ended();
  cv_.notify_all();
}

void Process::onOutput(init::Stream stream, const std::string& data) {
  std::lock_guard<std::mutex> lock(mutex_);
  log_.append(stream == init::Stream::kStdout ? OutputStream::kStdout : OutputStream::kStderr, data);
  cv_.notify_all();
}

void Process::onExited(const init::Exited& exited) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (info_.ended()) return;
  info_.state = ProcessState::kExited;
  info_.exitCode = exited.exitCode;
  info_.signal = exited.signal;
  info_.timedOut = exited.timedOut;
  info_.durationUs = exited.durationUs;
  info_.stdoutTruncated = exited.stdoutTruncated;
  info_.stderrTruncated = exited.stderrTruncated;
  info_.stdinOpen = false;
  info_.endedAtMs = nowMs();
  ended();
  cv_.notify_all();
}

void Process::onLost(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (info_.ended()) return;
  info_.state = ProcessState::kLost;
  info_.reason = reason;
  info_.stdinOpen = false;
  info_.endedAtMs = nowMs();
  ended();
  cv_.notify_all();
}

void Process::onEnded(std::function<void(const ProcessInfo&)> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  endHook_ = std::move(hook);
}

void Process::ended() {
  // Under the lock: whoever waits for the end (an exec's answer, a stream's
  // last item) sees it only after the hook has recorded it.
  if (auto hook = std::exchange(endHook_, nullptr)) hook(infoLocked());
}

Status Process::start(const std::shared_ptr<InitConnection>& connection, init::SpawnRequest spawn,
                      const std::string& stdinData, bool closeStdin) {
  bool lossless;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    connection_ = connection;
    lossless = info_.lossless;
    stdinSent_ = stdinData.size();
  }
  MOAT_ASSIGN(uint32_t initId, connection->spawn(std::move(spawn), shared_from_this(), stdinData, closeStdin,
                                                 lossless ? kLosslessWindow : 0));
  std::unique_lock<std::mutex> lock(mutex_);
  initId_ = initId;
  if (closeStdin) info_.stdinOpen = false;
  if (!cv_.wait_for(lock, kStartTimeout, [&] { return info_.state != ProcessState::kStarting; })) {
    lock.unlock();
    (void)connection->signal(initId, SIGKILL, true);
    onLost("moat-init did not start the command within 30 s");
    return Error::make(Code::kTimeout, "the environment did not start the command in time");
  }
  return {};
}

std::shared_ptr<Process> Process::forkedCopy() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto copy = std::make_shared<Process>(id_, info_.argv, info_.kind, info_.pty, info_.stdinOpen, 0);
  copy->info_ = info_;
  copy->log_ = log_;
  copy->initId_ = initId_;
  copy->granted_ = granted_;
  copy->stdinSent_ = stdinSent_;
  copy->stdinTaken_ = stdinTaken_;
  copy->unfollowedSince_ = std::chrono::steady_clock::now();
  return copy;
}

void Process::adopt(const std::shared_ptr<InitConnection>& connection) {
  uint64_t credit = 0;
  uint32_t initId = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    connection_ = connection;
    // A credit the source's moatd granted may have been held back while its
    // connection was suspended: told again (it is a limit, not a sum).
    if (info_.lossless && !info_.ended()) credit = granted_;
    initId = initId_;
  }
  if (credit) (void)connection->grantOutput(initId, credit);
}

uint32_t Process::initId() {
  std::lock_guard<std::mutex> lock(mutex_);
  return initId_;
}

void Process::makeLossless() {
  std::lock_guard<std::mutex> lock(mutex_);
  info_.lossless = true;
  granted_ = kLosslessWindow;
  unfollowedSince_ = std::chrono::steady_clock::now();
  log_.keepAtLeast(kLosslessRetention);
}

uint64_t Process::attachFollower(uint64_t since) {
  uint64_t credit, follower;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    follower = nextFollower_++;
    followers_[follower] = std::min(since, log_.end());  // a reader ahead waits for the end
    credit = creditLocked();
  }
  if (credit) sendCredit(credit);
  return follower;
}

void Process::advanceFollower(uint64_t follower, uint64_t position) {
  uint64_t credit;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    followers_[follower] = position;
    credit = creditLocked();
  }
  if (credit) sendCredit(credit);
}

void Process::detachFollower(uint64_t follower) {
  uint64_t credit;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    followers_.erase(follower);
    if (followers_.empty()) unfollowedSince_ = std::chrono::steady_clock::now();  // see releaseIfUnfollowed
    credit = creditLocked();  // the slowest may have been the one that left
  }
  if (credit) sendCredit(credit);
}

bool Process::releaseIfUnfollowed(std::chrono::steady_clock::time_point now, std::chrono::milliseconds wait) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!info_.lossless || info_.ended()) return false;
    if (!followers_.empty() || now - unfollowedSince_ < wait) return true;
    info_.lossless = false;  // nobody reads it: back to dropping what nobody reads
  }
  sendCredit(init::OutputCredit::kUnlimited);
  return false;
}

void Process::markDelivered() {
  std::lock_guard<std::mutex> lock(mutex_);
  delivered_ = true;
}

bool Process::delivered() {
  std::lock_guard<std::mutex> lock(mutex_);
  return delivered_;
}

uint64_t Process::creditLocked() {
  if (!info_.lossless || info_.ended() || followers_.empty()) return 0;
  uint64_t slowest = ~0ULL;
  for (const auto& [key, at] : followers_) slowest = std::min(slowest, at);
  uint64_t target = slowest + kLosslessWindow;  // offsets are below 2^62
  // A quarter of the window at a time: a credit per chunk would cost a
  // message to moat-init per chunk.
  if (target < granted_ + kLosslessWindow / 4) return 0;
  granted_ = target;
  return target;
}

void Process::sendCredit(uint64_t upTo) {
  std::shared_ptr<InitConnection> connection;
  uint32_t initId;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    connection = connection_.lock();
    initId = initId_;
  }
  if (connection) (void)connection->grantOutput(initId, upTo);
}

Status Process::connectionGone() const {
  return Error::make(Code::kConflict, "process " + std::to_string(id_) + " has ended");
}

Result<Process::Channel> Process::channel(const std::function<Status()>& check) {
  std::lock_guard<std::mutex> lock(mutex_);
  return channelLocked(check);
}

Result<Process::Channel> Process::channelLocked(const std::function<Status()>& check) {
  if (info_.ended()) return connectionGone().error();
  if (check) MOAT_TRY(check());
  auto connection = connection_.lock();
  if (!connection) return connectionGone().error();
  return Channel{std::move(connection), initId_};
}

Status Process::writeStdin(const std::string& data, bool close, std::chrono::milliseconds wait) {
  auto check = [&]() -> Status {
    if (!info_.stdinOpen) {
      return Error::make(Code::kConflict, "stdin of process " + std::to_string(id_) + " is closed");
    }
    return {};
  };
  MOAT_ASSIGN(Channel c, channel(check));
  // Refused before it is counted as sent (its window would never get it back).
  MOAT_TRY(c.connection->usable());
  // A moat-init from before flow control (an environment older than an
  // upgrade) does not say what it took: it is sent as before.
  bool bounded = !data.empty() && c.connection->peerVersion() >= init::kFlowControlSince;
  {
    // The room found and taken under one hold: concurrent writers (two
    // requests, two terminal viewers) do not both fit into the same room.
    std::unique_lock<std::mutex> lock(mutex_);
    if (bounded) MOAT_TRY(waitForStdinRoom(lock, data.size(), wait));
    MOAT_ASSIGN(c, channelLocked([&]() -> Status {
                  MOAT_TRY(check());
                  if (close) {
                    info_.stdinOpen = false;
                    cv_.notify_all();  // writers waiting for room: their answer is "closed" now
                  }
                  stdinSent_ += data.size();
                  return {};
                }));
  }
  if (!data.empty()) {
    if (Status sent = c.connection->writeStdin(c.initId, data); !sent.ok()) {
      // Refused (suspended meanwhile): not sent, so not counted as sent.
      if (sent.error().code == Code::kConflict) {
        std::lock_guard<std::mutex> lock(mutex_);
        stdinSent_ -= std::min<uint64_t>(stdinSent_, data.size());
        cv_.notify_all();
      }
      return sent;
    }
  }
  if (close) MOAT_TRY(c.connection->closeStdin(c.initId));
  return {};
}

Status Process::waitForStdinRoom(std::unique_lock<std::mutex>& lock, size_t size, std::chrono::milliseconds wait) {
  auto held = [&] { return stdinSent_ - stdinTaken_; };
  auto room = [&] { return info_.ended() || !info_.stdinOpen || held() == 0 || held() + size <= kStdinWindow; };
  if (cv_.wait_for(lock, wait, room)) return {};
  return Error::make(Code::kStdinFull,
                     "process " + std::to_string(id_) + " is not reading its input: " + std::to_string(held()) +
                         " bytes sent earlier still wait in the environment (" + std::to_string(kStdinWindow >> 10) +
                         " KiB may); none of this piece was sent, "
                         "send it again later");
}

void Process::onStdinTaken(uint64_t total) {
  std::lock_guard<std::mutex> lock(mutex_);
  stdinTaken_ = std::max(stdinTaken_, std::min(total, stdinSent_));
  cv_.notify_all();
}

Status Process::signal(int signo) {
  MOAT_ASSIGN(Channel c, channel({}));
  return c.connection->signal(c.initId, signo, true);
}

Status Process::resize(uint16_t rows, uint16_t cols) {
  MOAT_ASSIGN(Channel c, channel([&]() -> Status {
                if (info_.pty) return {};
                return Error::make(Code::kConflict, "process " + std::to_string(id_) + " has no terminal to resize");
              }));
  return c.connection->resize(c.initId, rows, cols);
}

int Process::attachViewer() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ++viewers_;
}

int Process::detachViewer() {
  std::lock_guard<std::mutex> lock(mutex_);
  return --viewers_;
}

ProcessInfo Process::info() {
  std::lock_guard<std::mutex> lock(mutex_);
  return infoLocked();
}

ProcessInfo Process::infoLocked() const {
  ProcessInfo info = info_;
  info.stdoutBytes = log_.bytes(OutputStream::kStdout);
  info.stderrBytes = log_.bytes(OutputStream::kStderr);
  info.stdoutDropped = log_.droppedBytes(OutputStream::kStdout);
  info.stderrDropped = log_.droppedBytes(OutputStream::kStderr);
  info.outputEnd = log_.end();
  return info;
}

Process::Read Process::read(uint64_t since, size_t maxBytes, bool wait, std::chrono::steady_clock::time_point deadline,
                            const std::function<bool()>& stop) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (wait) {
    cv_.wait_until(lock, deadline, [&] { return log_.end() > since || info_.ended() || (stop && stop()); });
  }
  Read r;
  r.items = log_.read(since, maxBytes);
  r.next = std::min(since, log_.end());
  if (!r.items.empty()) {
    const auto& last = r.items.back();
    r.next = last.offset + (last.dropped ? last.length : last.data.size());
  }
  r.ended = info_.ended() && r.next >= log_.end();
  r.more = r.next < log_.end() || (info_.lossless && log_.end() + kLosslessWindow / 2 >= granted_);
  return r;
}

void Process::wake() {
  std::lock_guard<std::mutex> lock(mutex_);
  cv_.notify_all();
}

bool Process::waitEnded(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_until(lock, deadline, [&] { return info_.ended(); });
}

std::string Process::collect(OutputStream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_.collect(stream);
}

std::string Process::take(OutputStream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_.take(stream);
}

}  // namespace moat::manager
