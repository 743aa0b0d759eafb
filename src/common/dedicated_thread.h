#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <type_traits>

namespace moat {

// One thread that lives as long as this object and runs what it is given,
// one call at a time, for callers on any thread. For work tied to the
// thread that does it: a child started with PR_SET_PDEATHSIG dies when the
// thread that forked it ends, not when its process does, so a child that
// must outlive a request but not the process is forked here.
class DedicatedThread {
 public:
  DedicatedThread() : thread_([this] { loop(); }) {}
  ~DedicatedThread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  DedicatedThread(const DedicatedThread&) = delete;
  DedicatedThread& operator=(const DedicatedThread&) = delete;

  // Runs fn() on the thread and returns what it returned. Once the object
  // is being destroyed, on the caller's thread instead (never waits for a
  // thread that has stopped taking work).
  template <typename Fn>
  std::invoke_result_t<Fn> run(Fn fn) {
    std::packaged_task<std::invoke_result_t<Fn>()> task(std::move(fn));
    auto result = task.get_future();
    bool queued = false;
    {
      std::lock_guard lock(mutex_);
      if (!stopping_) {
        queue_.emplace_back([&task] { task(); });
        queued = true;
      }
    }
    if (queued) {
      cv_.notify_all();
    } else {
      task();
    }
    return result.get();
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      auto next = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      next();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace moat
