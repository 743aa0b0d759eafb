#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"
#include "manager/init_connection.h"
#include "manager/output_log.h"

namespace moat::manager {

enum class ProcessState { kStarting, kRunning, kExited, kFailed, kLost };
const char* processStateName(ProcessState state);

// A process as the API shows it.
struct ProcessInfo {
  uint64_t id = 0;   // moatd's id, unique within the environment
  uint32_t pid = 0;  // as seen inside the environment (0 until started)
  std::vector<std::string> argv;
  std::string kind;  // "process", "exec" or "shell"
  bool pty = false;
  bool stdinOpen = false;
  bool lossless = false;  // its output waits for its followers instead of being dropped
  ProcessState state = ProcessState::kStarting;
  int exitCode = -1;
  int signal = 0;
  bool timedOut = false;
  int spawnErrno = 0;      // kFailed
  std::string spawnStage;  // kFailed
  std::string reason;      // kLost: why the process is no longer followed
  int64_t startedAtMs = 0;
  int64_t endedAtMs = 0;
  uint64_t durationUs = 0;
  uint64_t stdoutBytes = 0;
  uint64_t stderrBytes = 0;
  bool stdoutTruncated = false;  // moat-init stopped forwarding at the output limit
  bool stderrTruncated = false;
  uint64_t stdoutDropped = 0;  // no longer retained (the log's cap)
  uint64_t stderrDropped = 0;
  uint64_t outputEnd = 0;  // the offset a reader is caught up at
  bool ended() const { return state != ProcessState::kStarting && state != ProcessState::kRunning; }
};

// One command running in an environment, fed by the environment's
// InitConnection. It keeps the process's state and a bounded log of its
// output; any number of readers may wait on it.
class Process : public ProcessSink, public std::enable_shared_from_this<Process> {
 public:
  Process(uint64_t id, std::vector<std::string> argv, std::string kind, bool pty, bool stdinOpen,
          size_t outputCapPerStream);

  // ProcessSink: called on the connection's reader thread.
  void onSpawned(uint32_t pid) override;
  void onSpawnFailed(int err, const std::string& stage) override;
  void onOutput(init::Stream stream, const std::string& data) override;
  void onExited(const init::Exited& exited) override;
  void onLost(const std::string& reason) override;
  void onStdinTaken(uint64_t total) override;

  // Sends the Spawn through `connection`, then waits until moat-init says
  // whether the command started.
  Status start(const std::shared_ptr<InitConnection>& connection, init::SpawnRequest spawn,
               const std::string& stdinData, bool closeStdin);
  // Called once, with the final info, when the process ends (exits, fails
  // to start, or is lost), before anyone waiting for the end sees it. Set it
  // before start(). It runs with the process's lock held: it must not call
  // back into this Process.
  void onEnded(std::function<void(const ProcessInfo&)> hook);
  // Ends a process that nobody will hear from again (the environment is
  // being destroyed): readers get `reason` at once.
  void abandon(const std::string& reason) { onLost(reason); }

  // A memory fork of the environment (docs/PAUSE.md, "Forks with memory"):
  // the copy of this process its moat-init's copy runs on, with the same
  // id, command, state and output so far, and nobody following it. It
  // reaches the copy's moat-init once adopted (on the copy's connection,
  // where moat-init knows it as initId()).
  std::shared_ptr<Process> forkedCopy();
  void adopt(const std::shared_ptr<InitConnection>& connection);
  uint32_t initId();

  // Before start(): output is never dropped. moat-init forwards at most
  // kLosslessWindow bytes beyond what the slowest follower has read (beyond
  // offset 0 until one comes) and the process waits in its writes meanwhile.
  void makeLossless();
  static constexpr uint64_t kLosslessWindow = 512u << 10;
  // What the log of a lossless process keeps per stream: a follower's
  // position is what moatd wrote, so besides the window up to a read piece
  // and the socket's buffers may be on their way when it leaves; one that
  // comes back from the offset it got finds them still there.
  static constexpr size_t kLosslessRetention = 2u << 20;
  // Followers of the output stream (GET .../output?follow=1): attach at the
  // offset they start from, advance as they deliver, detach when they go.
  uint64_t attachFollower(uint64_t since);
  void advanceFollower(uint64_t follower, uint64_t position);
  void detachFollower(uint64_t follower);
  // A lossless process nobody has followed for `waitMs` (none came, or the
  // last left and none came back) goes back to dropping: it is not held up
  // for good by a client that went away. False once there is nothing left
  // to watch (not lossless, or ended).
  bool releaseIfUnfollowed(std::chrono::steady_clock::time_point now, std::chrono::milliseconds wait);
  // A follower got everything up to the final event: this process's record
  // is the first to go when the environment keeps too many ended ones.
  void markDelivered();
  bool delivered();

  // Input for the process. At most kStdinWindow bytes sent earlier wait in
  // the environment (moat-init holds them, in memory the environment pays
  // for): a piece that does not fit waits up to `wait` for the process to
  // read, then fails (code "stdin_full") with none of it sent.
  Status writeStdin(const std::string& data, bool close, std::chrono::milliseconds wait = kStdinWait);
  static constexpr uint64_t kStdinWindow = 1u << 20;
  static constexpr std::chrono::milliseconds kStdinWait{30000};
  Status signal(int signo);
  Status resize(uint16_t rows, uint16_t cols);

  // Terminal viewers (WebSocket shells): counts after the change.
  int attachViewer();
  int detachViewer();

  ProcessInfo info();
  uint64_t id() const { return id_; }
  // Output from `since`. With `wait`, blocks until there is something new,
  // the process ended, `stop()` says so, or `deadline` passes.
  struct Read {
    std::vector<OutputItem> items;
    uint64_t next = 0;   // where the following read starts
    bool ended = false;  // the process ended and everything was read
    bool more = false;   // more was there than maxBytes allowed, or the process
                         // (lossless) is near its limit: it waits for its readers
  };
  Read read(uint64_t since, size_t maxBytes, bool wait, std::chrono::steady_clock::time_point deadline,
            const std::function<bool()>& stop = {});
  // Wakes readers so that they re-check their stop condition.
  void wake();
  bool waitEnded(std::chrono::steady_clock::time_point deadline);
  std::string collect(OutputStream stream);
  // Moves the retained output of one stream out (a blocking exec's result).
  std::string take(OutputStream stream);

 private:
  Status connectionGone() const;
  // The way to the running process: its connection and moat-init's id for
  // it, once `check` (run with the lock held) agrees.
  struct Channel {
    std::shared_ptr<InitConnection> connection;
    uint32_t initId;
  };
  Result<Channel> channel(const std::function<Status()>& check);
  Result<Channel> channelLocked(const std::function<Status()>& check);  // with mutex_ held
  // With mutex_ held (by `lock`): until at most kStdinWindow would be held
  // with `size` more, or `wait` passes ("stdin_full").
  Status waitForStdinRoom(std::unique_lock<std::mutex>& lock, size_t size, std::chrono::milliseconds wait);
  // After a change to an ended state, with mutex_ held: runs the end hook,
  // if any, before any waiter can see the end.
  void ended();
  ProcessInfo infoLocked() const;  // with mutex_ held
  // With mutex_ held: the output limit to send now (after unlocking), or 0.
  uint64_t creditLocked();
  void sendCredit(uint64_t upTo);

  const uint64_t id_;
  std::mutex mutex_;
  std::condition_variable cv_;
  ProcessInfo info_;
  OutputLog log_;
  std::weak_ptr<InitConnection> connection_;
  uint32_t initId_ = 0;
  int viewers_ = 0;
  std::function<void(const ProcessInfo&)> endHook_;
  std::chrono::steady_clock::time_point unfollowedSince_;  // lossless, without followers since
  bool delivered_ = false;                                 // a follower read to the final event
  std::map<uint64_t, uint64_t> followers_;                 // follower -> offset delivered up to
  uint64_t nextFollower_ = 1;
  uint64_t granted_ = 0;     // the limit moat-init has: the offset it may forward up to
  uint64_t stdinSent_ = 0;   // input sent to moat-init
  uint64_t stdinTaken_ = 0;  // of it, taken off by moat-init (StdinTaken)
};

}  // namespace moat::manager
