#include "init/launcher.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace moat::init {

Launcher::Launcher(size_t maxThreads)
    : maxThreads_(maxThreads ? maxThreads : 1), ready_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

Launcher::~Launcher() { stop(); }

std::vector<std::unique_ptr<Launch>> Launcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  return takeFinished();
}

void Launcher::submit(std::unique_ptr<Launch> launch) {
  bool startThread = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    queue_.push_back(std::move(launch));
    // Every thread busy (or none yet): one more, within the cap.
    startThread = idle_ < queue_.size() && threads_.size() < maxThreads_;
    if (startThread) threads_.emplace_back([this] { work(); });
  }
  if (!startThread) cv_.notify_one();
}

void Launcher::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;  // stopping
    std::unique_ptr<Launch> launch = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    runLaunch(*launch);
    lock.lock();
    --running_;
    finished_.push_back(std::move(launch));
    uint64_t one = 1;
    ssize_t ignored = ::write(ready_.get(), &one, sizeof one);
    (void)ignored;
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

size_t Launcher::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size() + running_ + finished_.size();
}

}  // namespace moat::init
