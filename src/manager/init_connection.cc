#include "manager/init_connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <signal.h>

#include <chrono>

namespace moat::manager {

InitConnection::InitConnection(UniqueFd control, std::function<void()> onClosed)
    : control_(std::move(control)), onClosed_(std::move(onClosed)) {
  reader_ = std::thread([this] { readLoop(); });
}

InitConnection::~InitConnection() {
  ::shutdown(control_.get(), SHUT_RDWR);  // wakes the reader
  if (reader_.joinable()) reader_.join();
}

void InitConnection::close() { ::shutdown(control_.get(), SHUT_RDWR); }

bool InitConnection::closed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

void InitConnection::readLoop() {
  init::FrameReader reader;
  for (;;) {
    auto frame = init::readFrame(control_.get(), reader);
    if (!frame.ok()) break;
    dispatch(frame.value());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  cv_.notify_all();
  if (onClosed_) onClosed_();
}

void InitConnection::dispatch(const init::Frame& frame) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto find = [&](uint32_t key) -> Pending* {
    auto it = pending_.find(key);
    return it == pending_.end() ? nullptr : &it->second;
  };
  switch (frame.type) {
    case init::MsgType::kOutput: {
      auto m = init::Output::decode(frame.payload);
      if (!m.ok()) return;
      if (Pending* p = find(m->id)) {
        (m->stream == init::Stream::kStdout ? p->result.out : p->result.err) += m->data;
      }
      return;
    }
    case init::MsgType::kSpawned: {
      auto m = init::Spawned::decode(frame.payload);
      if (m.ok()) {
        if (Pending* p = find(m->id)) p->result.started = true;
      }
      return;
    }
    case init::MsgType::kSpawnFailed: {
      auto m = init::SpawnFailed::decode(frame.payload);
      if (!m.ok()) return;
      if (Pending* p = find(m->id)) {
        p->result.spawnErrno = m->err;
        p->result.spawnStage = m->stage;
        p->done = true;
      }
      break;
    }
    case init::MsgType::kExited: {
      auto m = init::Exited::decode(frame.payload);
      if (!m.ok()) return;
      if (Pending* p = find(m->id)) {
        p->result.started = true;
        p->result.exitCode = m->exitCode;
        p->result.signal = m->signal;
        p->result.timedOut = m->timedOut;
        p->result.outTruncated = m->stdoutTruncated;
        p->result.errTruncated = m->stderrTruncated;
        p->result.durationUs = m->durationUs;
        p->done = true;
      }
      break;
    }
    case init::MsgType::kFileResult: {
      auto m = init::FileResult::decode(frame.payload);
      if (!m.ok()) return;
      if (Pending* p = find(m->tag)) {
        p->fileResult = std::move(m.value());
        p->done = true;
      }
      break;
    }
    default:
      return;  // Hello, protocol errors: nothing waits on them
  }
  cv_.notify_all();
}

Status InitConnection::send(init::MsgType type, const std::string& payload) {
  std::lock_guard<std::mutex> lock(writeMutex_);
  return init::writeFrame(control_.get(), type, payload);
}

Result<InitConnection::Pending> InitConnection::wait(uint32_t key, uint64_t timeoutMs) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  bool finished = cv_.wait_until(lock, deadline, [&] { return pending_[key].done || closed_; });
  Pending p = std::move(pending_[key]);
  pending_.erase(key);
  if (p.done) return p;
  if (!finished) return Error::make("timeout", "moat-init did not answer in time");
  return Error::make("gone", "the environment ended");
}

Result<ExecResult> InitConnection::exec(const ExecRequest& request) {
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return Error::make("gone", "the environment ended");
    id = nextKey_++;
    pending_[id];
  }
  init::SpawnRequest spawn;
  spawn.id = id;
  spawn.argv = request.argv;
  spawn.env = request.env;
  spawn.cwd = request.cwd;
  spawn.stdinPipe = request.withStdin;
  spawn.timeoutMs = request.timeoutMs;
  spawn.outputLimit = request.outputLimit;
  Status s = send(init::MsgType::kSpawn, spawn.encode());
  if (s.ok() && request.withStdin) {
    if (!request.stdinData.empty()) {
      s = send(init::MsgType::kStdin, init::StdinData{id, request.stdinData}.encode());
    }
    if (s.ok()) s = send(init::MsgType::kCloseStdin, init::ProcessRef{id}.encode());
  }
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(id);
    return Error::make("gone", "the environment ended");
  }
  // moat-init enforces the timeout; the grace covers the kill and the report.
  uint64_t limit = request.timeoutMs ? request.timeoutMs + 10000 : 24ULL * 3600 * 1000;
  auto p = wait(id, limit);
  if (!p.ok()) {
    // Nobody waits for it any more: it must not run on unseen.
    if (p.error().code == "timeout") {
      (void)send(init::MsgType::kSignal, init::SignalRequest{id, SIGKILL, true}.encode());
    }
    return p.error();
  }
  return std::move(p.value().result);
}

Result<init::FileResult> InitConnection::file(init::FileRequest request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return Error::make("gone", "the environment ended");
    request.tag = nextKey_++;
    pending_[request.tag];
  }
  if (!send(init::MsgType::kFile, request.encode()).ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(request.tag);
    return Error::make("gone", "the environment ended");
  }
  MOAT_ASSIGN(Pending p, wait(request.tag, 60000));
  return std::move(p.fileResult);
}

}  // namespace moat::manager
