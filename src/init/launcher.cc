#include "init/launcher.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

namespace moat::init {

Launcher::Launcher(size_t maxThreads, std::chrono::milliseconds idleExit)
    : maxThreads_(maxThreads ? maxThreads : 1), idleExit_(idleExit), ready_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

Launcher::~Launcher() { stop(); }

std::vector<std::unique_ptr<Launch>> Launcher::stop() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
    cv_.notify_all();
    ended_.wait(lock, [&] { return threads_ == 0; });
  }
  return takeFinished();
}

void Launcher::submit(std::unique_ptr<Launch> launch) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) return;
  queue_.push_back(std::move(launch));
  // Every thread busy (or none yet): one more, within the cap.
  if (idle_ < queue_.size() && threads_ < maxThreads_) {
    if (startThread()) return;  // it takes the launch
    if (threads_ == 0) {
      // No thread at all (the environment's pids limit is reached): launch
      // on the caller's, whose vfork then fails or succeeds the same way.
      std::unique_ptr<Launch> now = std::move(queue_.back());
      queue_.pop_back();
      if (!inlineAllowed_) {
        now->err = EAGAIN;
        now->stage = "fork";
        finish(std::move(now));
        return;
      }
      ++running_;
      lock.unlock();
      runLaunch(*now);
      lock.lock();
      --running_;
      finish(std::move(now));
      return;
    }
  }
  lock.unlock();
  cv_.notify_one();
}

size_t Launcher::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return threads_;
}

bool Launcher::startThread() {
  pthread_attr_t attr;
  if (::pthread_attr_init(&attr) != 0) return false;
  ::pthread_attr_setstacksize(&attr, kThreadStack);
  ::pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  int err = ::pthread_create(
      &thread, &attr,
      [](void* self) -> void* {
        static_cast<Launcher*>(self)->work();
        return nullptr;
      },
      this);
  ::pthread_attr_destroy(&attr);
  if (err != 0) return false;
  ++threads_;
  return true;
}

void Launcher::finish(std::unique_ptr<Launch> launch) {
  finished_.push_back(std::move(launch));
  uint64_t one = 1;
  ssize_t ignored = ::write(ready_.get(), &one, sizeof one);
  (void)ignored;
}

void Launcher::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    bool woken = cv_.wait_for(lock, idleExit_, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (!woken && !idleExitAllowed_.load(std::memory_order_relaxed)) continue;  // a command it launched may still live
    if (!woken || queue_.empty()) {                                             // idle for idleExit_, or stopping
      --threads_;
      ended_.notify_all();
      return;
    }
    std::unique_ptr<Launch> launch = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    inFlight_.push_back(launch.get());
    lock.unlock();
    runLaunch(*launch);
    lock.lock();
    --running_;
    std::erase(inFlight_, launch.get());
    finish(std::move(launch));
  }
}

std::vector<std::unique_ptr<Launch>> Launcher::takeFinished() {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t count;
  ssize_t ignored = ::read(ready_.get(), &count, sizeof count);
  (void)ignored;
  std::vector<std::unique_ptr<Launch>> done;
  done.swap(finished_);
  return done;
}

bool Launcher::claimLaunchExec(pid_t pid, const std::string& filename) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Launch* l : inFlight_) {
    if (l->childPid.load() != pid) continue;
    for (size_t i = 0; i < l->candidates.size(); ++i) {
      if (l->candidates[i] == filename && !l->claimed[i]) return l->claimed[i] = true;
    }
  }
  return false;
}

size_t Launcher::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size() + running_ + finished_.size();
}

}  // namespace moat::init
