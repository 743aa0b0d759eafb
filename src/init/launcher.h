#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "common/unique_fd.h"
#include "init/launch.h"

namespace moat::init {

// Runs launches (vfork + exec) on a few threads of their own. A vfork
// suspends the thread that calls it until the child has exec'd: on moat-init's
// loop that was half of its time under concurrent execs, with every other
// command's output, exit and new spawn waiting behind it. Threads start on
// demand, up to maxThreads, and end after idleExit without a launch once
// their owner says no command of theirs lives (allowIdleExit): an
// environment that ran something once and then sits idle holds no thread
// for it (each is a task of the host's pid_max, docs/BENCHMARKS.md "1,000
// idle environments"). Not before: a command's parent is the thread that
// launched it, and one that asked for a parent-death signal (bwrap
// --die-with-parent, tini -p, setpriv --pdeathsig) gets it when that thread
// ends. They count against the environment's pids limit: when none can
// start, a launch runs on the submitting thread.
class Launcher {
 public:
  explicit Launcher(size_t maxThreads, std::chrono::milliseconds idleExit = std::chrono::seconds(60));
  // Launches already running finish; queued ones are dropped (their
  // descriptors close). Finished ones not taken are dropped.
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  void submit(std::unique_ptr<Launch> launch);
  // Threads running (idle or launching).
  size_t threads() const;
  // Whether idle threads may end: only while no process they launched is
  // alive (see above). Off at first. Lock-free: moat-init's loop says it at
  // every turn.
  void allowIdleExit(bool allowed) { idleExitAllowed_.store(allowed, std::memory_order_relaxed); }
  // Readable while finished launches wait to be taken.
  int readyFd() const { return ready_.get(); }
  // The finished launches, in the order they finished; clears readyFd.
  std::vector<std::unique_ptr<Launch>> takeFinished();
  // Submitted and not yet taken.
  size_t pending() const;
  // Whether `pid` is the child of a launch still waiting for its exec, and
  // `filename` one of the launch's candidates not claimed yet: then it is
  // claimed (the same exec is let through once, however fast the program
  // execs again).
  bool claimLaunchExec(pid_t pid, const std::string& filename);
  // Off: never run a launch on the submitting thread (when no thread can
  // start, the launch fails with EAGAIN). With the exec gate the submitting
  // thread is the one that must answer the child's exec.
  void allowInline(bool allowed) { inlineAllowed_ = allowed; }
  // Stops the threads (see the destructor) and returns what finished.
  std::vector<std::unique_ptr<Launch>> stop();

 private:
  void work();
  bool startThread();                           // with mutex_ held
  void finish(std::unique_ptr<Launch> launch);  // with mutex_ held
  // A launch needs little: vfork and the child's few calls run on it.
  static constexpr size_t kThreadStack = 512 * 1024;

  size_t maxThreads_;
  std::chrono::milliseconds idleExit_;
  UniqueFd ready_;  // eventfd
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable ended_;  // a thread ended (stop waits for all)
  std::deque<std::unique_ptr<Launch>> queue_;
  std::vector<Launch*> inFlight_;  // taken by a thread, not finished
  std::vector<std::unique_ptr<Launch>> finished_;
  size_t threads_ = 0;  // detached; each ends by itself (idle, or stopping)
  size_t idle_ = 0;
  size_t running_ = 0;
  bool stopping_ = false;
  std::atomic<bool> idleExitAllowed_{false};
  bool inlineAllowed_ = true;
};

}  // namespace moat::init
