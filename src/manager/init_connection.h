#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/result.h"
#include "common/unique_fd.h"
#include "init/protocol.h"

namespace moat::manager {

// Receives what moat-init reports about one spawned command. Called on the
// connection's reader thread, never with the connection's lock held; after
// onSpawnFailed, onExited or onLost nothing more arrives.
class ProcessSink {
 public:
  virtual ~ProcessSink() = default;
  virtual void onSpawned(uint32_t pid) = 0;
  virtual void onSpawnFailed(int err, const std::string& stage) = 0;
  virtual void onOutput(init::Stream stream, const std::string& data) = 0;
  virtual void onExited(const init::Exited& exited) = 0;
  // The connection closed before the command's end was reported.
  virtual void onLost(const std::string& reason) = 0;
  // moat-init has taken `total` bytes of the process's input so far.
  virtual void onStdinTaken(uint64_t total) { (void)total; }
};

// moatd's end of one environment's guest protocol connection: a reader
// thread dispatches moat-init's frames to the processes and file requests
// waiting for them, so that many can be in flight at once.
class InitConnection : public std::enable_shared_from_this<InitConnection> {
 public:
  // onClosed runs (on the reader thread) when moat-init goes away.
  // What an ExecCheck and an ExecReport go to (onExecCheck, onExecReport),
  // set before the first frame is read: moat-init sends what it kept while
  // no client was connected right after its Hello.
  struct ExecHooks {
    std::function<void(const init::ExecCheck&, std::function<void(bool allow)>)> check;
    std::function<void(const init::ExecReport&)> report;
  };
  // `suspendedWhy` not empty: made suspended (suspend()), its transport to
  // come from resumeOn() (an environment a restart found on disk).
  // `adopted`: processes moat-init runs already, by its ids (a memory
  // fork's, whose moat-init is a copy of its source's), heard from the
  // first frame on; new ids come after theirs.
  InitConnection(UniqueFd control, std::function<void()> onClosed, ExecHooks hooks = {},
                 const std::string& suspendedWhy = "", std::map<uint32_t, std::shared_ptr<ProcessSink>> adopted = {});
  ~InitConnection();
  InitConnection(const InitConnection&) = delete;
  InitConnection& operator=(const InitConnection&) = delete;

  // Assigns spawn.id, registers `sink` and sends the Spawn (and stdinData,
  // and CloseStdin when closeStdin). A `outputLimit` other than 0 starts
  // flow control of its output (init::OutputCredit) in the same write as the
  // Spawn, so none of the output escapes it. Returns the id moat-init knows
  // it by.
  Result<uint32_t> spawn(init::SpawnRequest spawn, std::shared_ptr<ProcessSink> sink, const std::string& stdinData,
                         bool closeStdin, uint64_t outputLimit = 0);
  Status writeStdin(uint32_t id, const std::string& data);
  Status closeStdin(uint32_t id);
  Status signal(uint32_t id, int signo, bool wholeGroup);
  Status resize(uint32_t id, uint16_t rows, uint16_t cols);
  // Flow control of process `id`'s output: moat-init may forward it up to
  // offset `upTo` (init::OutputCredit).
  Status grantOutput(uint32_t id, uint64_t upTo);

  Result<init::FileResult> file(init::FileRequest request);

  // The exec gate (protocol version 3). `check` is called on the reader
  // thread for each ExecCheck: it must not block (a decision that waits for
  // a person is answered later, from any thread, through `answer`).
  using ExecAnswer = std::function<void(bool allow)>;
  void onExecCheck(std::function<void(const init::ExecCheck&, ExecAnswer)> check);
  // What moat-init decided by itself (init::ExecReport), on the reader thread.
  void onExecReport(std::function<void(const init::ExecReport&)> report);
  // How moat-init judges programs (init::ExecPolicy).
  Status setExecPolicy(const init::ExecPolicy& policy);
  // The protocol version moat-init announced in its Hello (it comes first
  // on every connection; waited for up to 5 s). 0: none came (moat-init is
  // gone or silent).
  uint32_t peerVersion();
  bool closed();
  // Drops the connection: processes and requests waiting on it end with `reason`.
  void close(const std::string& reason);
  // Its transport goes and comes back (a microVM checkpointed to disk,
  // docs/PAUSE.md): from suspend() on, sends fail with `why` (kConflict),
  // and the transport's end ends nothing: processes and their sinks wait
  // for the guest's return. resumeOn() hands over the new transport, on
  // which moat-init's Hello comes first (peerVersion() waits for it);
  // endSuspension() gives up waiting (the old transport, if it still
  // works, goes on; if it ended, so does the connection).
  // `barrier` (a file request) is the last frame sent before; its answer is
  // waited for (an error: the suspension holds all the same, to be ended).
  Status suspend(const std::string& why, init::FileRequest barrier);
  Status resumeOn(UniqueFd control);
  void endSuspension();
  bool suspended();
  // kConflict saying why while suspended; else fine.
  Status usable();

 private:
  struct PendingFile {
    init::FileResult result;
    bool done = false;
  };
  void readLoop();
  // After the transport ended: true once resumeOn() gave a new one, false
  // when the connection ends (not suspended, or closed meanwhile).
  bool awaitTransport();
  // The answer to file request `tag` once it came or the connection ended
  // (waited for up to kFileTimeout when `wait`; `timedOut`: neither came);
  // its slot in files_ removed. mutex_ held.
  PendingFile takeAnswer(std::unique_lock<std::mutex>& lock, uint32_t tag, bool wait, bool* timedOut = nullptr);
  // close() with writeMutex_ held.
  void closeWriting(const std::string& reason);
  // An exec verdict (held while suspended).
  void sendVerdict(uint64_t id, bool allow);
  // What was held while suspended, as frames (mutex_ held); emptied.
  std::string heldFramesLocked();
  void dispatch(const init::Frame& frame);
  std::shared_ptr<ProcessSink> sinkOf(uint32_t id, bool last);
  Status send(init::MsgType type, const std::string& payload);
  Status sendFrames(const std::string& frames);

  UniqueFd control_;
  std::function<void()> onClosed_;
  std::function<void(const init::ExecCheck&, ExecAnswer)> execCheck_;  // set before frames can come
  std::function<void(const init::ExecReport&)> execReport_;
  std::mutex writeMutex_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<uint32_t, std::shared_ptr<ProcessSink>> sinks_;
  std::map<uint32_t, PendingFile> files_;
  // Process ids and file tags share one space. It starts at a random point:
  // after a moatd restart, commands of the previous moatd may still run
  // under their ids.
  uint32_t nextKey_;
  bool closed_ = false;
  bool closeAsked_ = false;                   // close() or the destructor: a waiting reader gives up
  bool suspended_ = false;                    // suspend() .. resumeOn() or endSuspension()
  std::string suspendReason_;                 // what sends answer meanwhile
  bool readerParked_ = false;                 // its reader saw the transport end and waits
  bool swapped_ = false;                      // resumeOn() gave it a new transport
  std::map<uint32_t, uint64_t> heldCredits_;  // output credits granted while suspended
  std::string heldFrames_;                    // exec verdicts given while suspended
  uint32_t peerVersion_ = 0;
  std::string closeReason_;
  std::thread reader_;
};

}  // namespace moat::manager
