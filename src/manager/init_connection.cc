#include "manager/init_connection.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "common/trace.h"

namespace moat::manager {
namespace {

constexpr auto kFileTimeout = std::chrono::seconds(60);

uint32_t randomStart() {
  uint32_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint32_t>(::getpid()) << 16;
  return (v & 0x7fffffff) | 1;  // far from wrapping, never 0
}

Error gone(const std::string& reason) { return Error::make(Code::kGone, reason); }

// A send's failure as its caller says it: refused while the connection is
// suspended (kConflict, saying why), else the environment's end.
Status lostUnlessSuspended(const Status& sent) {
  if (sent.ok() || sent.error().code == Code::kConflict) return sent;
  return gone("the environment ended");
}

}  // namespace

InitConnection::InitConnection(UniqueFd control, std::function<void()> onClosed, ExecHooks hooks,
                               const std::string& suspendedWhy,
                               std::map<uint32_t, std::shared_ptr<ProcessSink>> adopted)
    : control_(std::move(control)),
      onClosed_(std::move(onClosed)),
      sinks_(std::move(adopted)),
      nextKey_(randomStart()) {
  if (!sinks_.empty()) nextKey_ = std::max(nextKey_, sinks_.rbegin()->first + 1);
  execCheck_ = std::move(hooks.check);
  execReport_ = std::move(hooks.report);
  suspended_ = !suspendedWhy.empty();
  suspendReason_ = suspendedWhy;
  reader_ = std::thread([this] { readLoop(); });
}

InitConnection::~InitConnection() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closeAsked_ = true;
  }
  cv_.notify_all();
  ::shutdown(control_.get(), SHUT_RDWR);  // wakes the reader
  if (reader_.joinable()) reader_.join();
}

void InitConnection::close(const std::string& reason) {
  std::lock_guard<std::mutex> write(writeMutex_);  // control_ is not swapped meanwhile
  closeWriting(reason);
}

void InitConnection::closeWriting(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closeReason_.empty()) closeReason_ = reason;
    closeAsked_ = true;
  }
  cv_.notify_all();
  ::shutdown(control_.get(), SHUT_RDWR);
}

Status InitConnection::suspend(const std::string& why, init::FileRequest barrier) {
  uint32_t tag = 0;
  {
    std::lock_guard<std::mutex> write(writeMutex_);  // after any send under way
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return gone(closeReason_.empty() ? "the environment ended" : closeReason_);
      suspended_ = true;
      swapped_ = false;
      suspendReason_ = why;
      tag = barrier.tag = nextKey_++;
      files_[tag];
    }
    // The last frame sent before the suspension: its answer says moat-init
    // has read everything before it (and, for kQuiesce, that nothing of
    // its own follows).
    Status sent = init::writeFrames(control_.get(), init::encodeFrame(init::MsgType::kFile, barrier.encode()));
    if (!sent.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      files_.erase(tag);
      return sent;
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  PendingFile p = takeAnswer(lock, tag, true);
  if (!p.done) return Error::make(Code::kTimeout, "moat-init did not answer before the suspension");
  if (p.result.err != 0) return Error::fromErrno("moat-init before the suspension: " + p.result.message, p.result.err);
  return {};
}

void InitConnection::sendVerdict(uint64_t id, bool allow) {
  const std::string frame = init::encodeFrame(init::MsgType::kExecVerdict, init::ExecVerdict{id, allow}.encode());
  {
    // A person's answer that comes while suspended is kept for the guest's
    // return: moat-init waits for it.
    std::lock_guard<std::mutex> lock(mutex_);
    if (suspended_) {
      heldFrames_ += frame;
      return;
    }
  }
  (void)sendFrames(frame);
}

Status InitConnection::usable() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (suspended_) return Error::make(Code::kConflict, suspendReason_);
  return {};
}

bool InitConnection::suspended() {
  std::lock_guard<std::mutex> lock(mutex_);
  return suspended_;
}

Status InitConnection::resumeOn(UniqueFd control) {
  std::lock_guard<std::mutex> write(writeMutex_);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!suspended_) return Error::make(Code::kInvalidArgument, "the connection is not suspended");
  // The reader lets go of the old transport (ended, or ended here) first.
  ::shutdown(control_.get(), SHUT_RDWR);
  if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return readerParked_ || closed_ || closeAsked_; })) {
    return Error::make(Code::kTimeout, "the connection's reader did not let go of its old transport");
  }
  if (closed_ || closeAsked_) return gone(closeReason_.empty() ? "the environment ended" : closeReason_);
  control_ = std::move(control);
  peerVersion_ = 0;  // its Hello comes again
  suspended_ = false;
  swapped_ = true;
  std::string held = heldFramesLocked();
  cv_.notify_all();
  lock.unlock();
  // Still under writeMutex_: before anything else is sent on it.
  if (!held.empty()) (void)init::writeFrames(control_.get(), held);
  return {};
}

void InitConnection::endSuspension() {
  std::lock_guard<std::mutex> write(writeMutex_);
  std::string held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    suspended_ = false;
    held = heldFramesLocked();
  }
  cv_.notify_all();
  // The old transport, if it still works, gets what was held for it.
  if (!held.empty()) (void)init::writeFrames(control_.get(), held);
}

std::string InitConnection::heldFramesLocked() {
  std::string frames = std::move(heldFrames_);
  heldFrames_.clear();
  for (const auto& [id, upTo] : heldCredits_) {
    frames += init::encodeFrame(init::MsgType::kOutputCredit, init::OutputCredit{id, upTo}.encode());
  }
  heldCredits_.clear();
  return frames;
}

bool InitConnection::awaitTransport() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!suspended_ || closeAsked_) return false;
  readerParked_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] { return !suspended_ || closeAsked_; });
  readerParked_ = false;
  const bool swapped = swapped_ && !closeAsked_;
  swapped_ = false;
  return swapped;
}

uint32_t InitConnection::peerVersion() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Suspended, no Hello can come: what is known now (0 for one a restart
  // made suspended).
  cv_.wait_for(lock, std::chrono::seconds(5), [&] { return peerVersion_ != 0 || closed_ || suspended_; });
  return peerVersion_;
}

bool InitConnection::closed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

void InitConnection::readLoop() {
  init::FrameReader reader;
  for (;;) {
    auto frame = init::readFrame(control_.get(), reader);
    if (frame.ok()) {
      dispatch(frame.value());
      continue;
    }
    if (!awaitTransport()) break;
    reader = init::FrameReader();  // a new transport: its first frame is whole
  }
  std::map<uint32_t, std::shared_ptr<ProcessSink>> sinks;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    sinks.swap(sinks_);
    reason = closeReason_.empty() ? "the environment ended (moat-init exited)" : closeReason_;
  }
  cv_.notify_all();
  for (auto& [id, sink] : sinks) sink->onLost(reason);
  if (onClosed_) onClosed_();
}

std::shared_ptr<ProcessSink> InitConnection::sinkOf(uint32_t id, bool last) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sinks_.find(id);
  if (it == sinks_.end()) return nullptr;
  auto sink = it->second;
  if (last) sinks_.erase(it);
  return sink;
}

void InitConnection::dispatch(const init::Frame& frame) {
  switch (frame.type) {
    case init::MsgType::kOutput: {
      auto m = init::Output::decode(frame.payload);
      if (!m.ok()) return;
      if (auto sink = sinkOf(m->id, false)) sink->onOutput(m->stream, m->data);
      return;
    }
    case init::MsgType::kStdinTaken: {
      auto m = init::StdinTaken::decode(frame.payload);
      if (!m.ok()) return;
      if (auto sink = sinkOf(m->id, false)) sink->onStdinTaken(m->total);
      return;
    }
    case init::MsgType::kSpawned: {
      auto m = init::Spawned::decode(frame.payload);
      if (!m.ok()) return;
      if (auto sink = sinkOf(m->id, false)) sink->onSpawned(m->pid);
      return;
    }
    case init::MsgType::kSpawnFailed: {
      auto m = init::SpawnFailed::decode(frame.payload);
      if (!m.ok()) return;
      if (auto sink = sinkOf(m->id, true)) sink->onSpawnFailed(m->err, m->stage);
      return;
    }
    case init::MsgType::kExited: {
      auto m = init::Exited::decode(frame.payload);
      if (!m.ok()) return;
      if (auto sink = sinkOf(m->id, true)) sink->onExited(m.value());
      return;
    }
    case init::MsgType::kExecCheck: {
      auto m = init::ExecCheck::decode(frame.payload);
      if (!m.ok()) return;
      uint64_t id = m->id;
      // The answer keeps the connection alive only as long as it needs it.
      ExecAnswer answer = [self = weak_from_this(), id](bool allow) {
        if (auto connection = self.lock()) connection->sendVerdict(id, allow);
      };
      std::function<void(const init::ExecCheck&, ExecAnswer)> check;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        check = execCheck_;
      }
      if (check) {
        check(m.value(), std::move(answer));
      } else {
        answer(false);  // nobody judges programs here: refused
      }
      return;
    }
    case init::MsgType::kExecReport: {
      auto m = init::ExecReport::decode(frame.payload);
      if (!m.ok()) return;
      std::function<void(const init::ExecReport&)> report;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        report = execReport_;
      }
      if (report) report(m.value());
      return;
    }
    case init::MsgType::kFileResult: {
      uint32_t version;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        version = peerVersion_ == 0 ? init::kProtocolVersion : peerVersion_;  // Hello comes first
      }
      auto m = init::FileResult::decode(frame.payload, version);
      if (!m.ok()) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = files_.find(m->tag);
        if (it == files_.end()) return;
        it->second.result = std::move(m.value());
        it->second.done = true;
      }
      cv_.notify_all();
      return;
    }
    case init::MsgType::kHello: {
      auto m = init::Hello::decode(frame.payload);
      if (!m.ok() || m->version == 0) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        peerVersion_ = m->version;
      }
      cv_.notify_all();
      return;
    }
    default:
      return;  // protocol errors: nothing waits on them
  }
}

Status InitConnection::send(init::MsgType type, const std::string& payload) {
  if (payload.size() > init::kMaxFrame) return Error::make(Code::kProtocol, "frame too large");
  return sendFrames(init::encodeFrame(type, payload));
}

Status InitConnection::sendFrames(const std::string& frames) {
  std::lock_guard<std::mutex> lock(writeMutex_);
  {
    std::lock_guard<std::mutex> state(mutex_);
    if (suspended_) return Error::make(Code::kConflict, suspendReason_);
  }
  Status s = init::writeFrames(control_.get(), frames);
  // A connection with a send timeout (a microVM's: its moat-init is the
  // guest's to stop) that ran out may hold part of a frame: nothing after
  // it could be read right, so it ends here.
  if (!s.ok() && (s.error().sysErrno == EAGAIN || s.error().sysErrno == EWOULDBLOCK)) {
    closeWriting("moat-init stopped taking what moatd sends (a write waited out its timeout)");
  }
  return s;
}

Result<uint32_t> InitConnection::spawn(init::SpawnRequest spawn, std::shared_ptr<ProcessSink> sink,
                                       const std::string& stdinData, bool closeStdin, uint64_t outputLimit) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return gone(closeReason_.empty() ? "the environment ended" : closeReason_);
    spawn.id = nextKey_++;
    sinks_[spawn.id] = sink;
  }
  uint32_t id = spawn.id;
  Status s;
  if (outputLimit == 0) {
    s = send(init::MsgType::kSpawn, spawn.encode());
  } else {
    std::string frames = init::encodeFrame(init::MsgType::kSpawn, spawn.encode()) +
                         init::encodeFrame(init::MsgType::kOutputCredit, init::OutputCredit{id, outputLimit}.encode());
    s = sendFrames(frames);
  }
  if (s.ok() && !stdinData.empty()) s = writeStdin(id, stdinData);
  if (s.ok() && closeStdin) s = this->closeStdin(id);
  if (!s.ok()) {
    // The reader reports the close to every sink still registered.
    return gone("the environment ended");
  }
  return id;
}

Status InitConnection::writeStdin(uint32_t id, const std::string& data) {
  // Frames stay well below kMaxFrame.
  constexpr size_t kPiece = 1u << 20;
  for (size_t at = 0; at < data.size(); at += kPiece) {
    MOAT_TRY(lostUnlessSuspended(send(init::MsgType::kStdin, init::StdinData{id, data.substr(at, kPiece)}.encode())));
  }
  return {};
}

Status InitConnection::closeStdin(uint32_t id) {
  return lostUnlessSuspended(send(init::MsgType::kCloseStdin, init::ProcessRef{id}.encode()));
}

Status InitConnection::signal(uint32_t id, int signo, bool wholeGroup) {
  return lostUnlessSuspended(send(init::MsgType::kSignal, init::SignalRequest{id, signo, wholeGroup}.encode()));
}

Status InitConnection::grantOutput(uint32_t id, uint64_t upTo) {
  {
    // Kept while suspended and sent first on the new transport: a credit
    // lost would leave the process's output waiting for good.
    std::lock_guard<std::mutex> lock(mutex_);
    if (suspended_) {
      auto& held = heldCredits_[id];
      held = std::max(held, upTo);
      return {};
    }
  }
  return lostUnlessSuspended(send(init::MsgType::kOutputCredit, init::OutputCredit{id, upTo}.encode()));
}

Status InitConnection::resize(uint32_t id, uint16_t rows, uint16_t cols) {
  return lostUnlessSuspended(send(init::MsgType::kResize, init::Resize{id, rows, cols}.encode()));
}

InitConnection::PendingFile InitConnection::takeAnswer(std::unique_lock<std::mutex>& lock, uint32_t tag, bool wait,
                                                       bool* timedOut) {
  const bool came = wait && cv_.wait_for(lock, kFileTimeout, [&] { return files_[tag].done || closed_; });
  if (timedOut) *timedOut = wait && !came;
  PendingFile p = std::move(files_[tag]);
  files_.erase(tag);
  return p;
}

Result<init::FileResult> InitConnection::file(init::FileRequest request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (suspended_) return Error::make(Code::kConflict, suspendReason_);
  }
  // A moat-init before version 6 reads holes as zeros (and would refuse the
  // flag): the same bytes, from where they were asked for.
  const bool olderRead = request.op == init::FileOp::kRead && peerVersion() < init::kSparseReadSince;
  if (olderRead) request.flags &= static_cast<uint8_t>(~init::kFileSkipHoles);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return gone("the environment ended");
    request.tag = nextKey_++;
    files_[request.tag];
  }
  uint32_t tag = request.tag;
  Status sending = send(init::MsgType::kFile, request.encode());
  const bool sent = sending.ok();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!sent && sending.error().code == Code::kConflict) {  // suspended meanwhile
    files_.erase(tag);
    return sending.error();
  }
  bool timedOut = false;
  PendingFile p = takeAnswer(lock, tag, sent, &timedOut);
  if (p.done && olderRead) p.result.offset = request.offset;
  if (p.done && request.op == init::FileOp::kRead && p.result.err == 0) {
    // A guest's moat-init is not trusted: its answer starts at or after the
    // offset asked for (at it, unless holes were skipped) and is no longer
    // than asked.
    const init::FileResult& r = p.result;
    bool skipping = (request.flags & init::kFileSkipHoles) != 0;
    uint64_t asked = request.length == 0 ? init::kMaxFrame : request.length;
    if (r.offset < request.offset || (!skipping && r.offset != request.offset) ||
        r.offset > static_cast<uint64_t>(INT64_MAX) - r.data.size() || r.data.size() > asked) {
      return Error::make(Code::kProtocol, "moat-init answered a read with bytes from elsewhere");
    }
  }
  if (p.done) return std::move(p.result);
  if (sent && timedOut) return Error::make(Code::kTimeout, "moat-init did not answer in time");
  return gone("the environment ended");
}

void InitConnection::onExecCheck(std::function<void(const init::ExecCheck&, ExecAnswer)> check) {
  std::lock_guard<std::mutex> lock(mutex_);
  execCheck_ = std::move(check);
}

void InitConnection::onExecReport(std::function<void(const init::ExecReport&)> report) {
  std::lock_guard<std::mutex> lock(mutex_);
  execReport_ = std::move(report);
}

Status InitConnection::setExecPolicy(const init::ExecPolicy& policy) {
  uint32_t version = peerVersion();
  traceStage("moatd: hello");
  if (version < init::kExecGateSince) return {};  // an older moat-init: it gates nothing
  // Version 3 cannot judge by itself: it asks about every exec instead.
  return send(init::MsgType::kExecPolicy, version < init::kExecRulesSince ? policy.encodeV3() : policy.encode());
}

}  // namespace moat::manager
