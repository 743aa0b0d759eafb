// The reaper's thread: expiry, environments whose pid 1 went, warm ones
// that died, and lossless output nobody reads any more.
#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "manager/environment_manager.h"

namespace moat::manager {

void EnvironmentManager::reaperLoop() {
  std::unique_lock<std::mutex> lock(threadsMutex_);
  while (!stopping_) {
    reaperCv_.wait_for(lock, std::chrono::milliseconds(200));
    if (stopping_) break;
    // Expiry from memory (LiveTable::expired): a store read per environment
    // every 200 ms cost moatd ~10% of a core with 1,000 idle environments.
    const int64_t now = nowMs();
    std::vector<std::string> expired = live_.expired(now);
    // Checkpoints brought back for reads that no read came for since.
    std::vector<std::string> idle;
    for (auto it = backToDiskAt_.begin(); it != backToDiskAt_.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      idle.push_back(it->first);
      it = backToDiskAt_.erase(it);
    }
    std::vector<std::string> gone = std::move(initGone_);
    initGone_.clear();
    std::vector<std::weak_ptr<Process>> lossless = std::move(lossless_);
    lossless_.clear();
    lock.unlock();
    // A pool member that died is dropped and destroyed.
    for (const auto& id : gone) {
      if (auto dead = pools_.remove(id)) {
        (void)backend_.destroy(id);
        dead->connection.reset();
        capacity_.release(pools_.pools()[dead->pool].ramMb);
      }
    }
    poolCv_.notify_all();
    for (const auto& id : gone) {
      {
        std::lock_guard<std::mutex> relock(threadsMutex_);
        // Being destroyed, snapshotted or restored: decided once that ends.
        if (operations_.held(id)) {
          initGone_.push_back(id);
          continue;
        }
      }
      // A restore replaced the connection that went: this one is alive.
      if (live_.connected(id)) continue;
      auto record = store_.getEnvironment(id);
      if (record.ok() && record.value() &&
          (record.value()->state == EnvironmentState::kRunning || record.value()->state == EnvironmentState::kPaused)) {
        const std::string why = backend_.whyEnded(id);
        (void)destroy(id, "failed: " + (why.empty() ? std::string("pid 1 of the environment exited") : why));
      }
    }
    for (const auto& id : expired) expire(id);
    for (const auto& id : idle) {
      if (aside(id, [this, id] { backToDisk(id); })) continue;
      std::lock_guard<std::mutex> relock(threadsMutex_);  // its expiry's pause is under way: later
      if (!stopping_) backToDiskAt_.emplace(id, now + 1000);
    }
    // Lossless processes nobody follows any more go back to dropping.
    const auto wait = std::chrono::milliseconds(config_.processLimits.losslessWaitMs);
    const auto checked = std::chrono::steady_clock::now();  // after the destroys above
    std::erase_if(lossless, [&](const std::weak_ptr<Process>& weak) {
      auto process = weak.lock();
      return !process || !process->releaseIfUnfollowed(checked, wait);
    });
    lock.lock();
    lossless_.insert(lossless_.end(), lossless.begin(), lossless.end());
  }
}

void EnvironmentManager::onInitGone(const std::string& id) {
  // moat-init went away. After a destroy that is expected; otherwise the
  // environment failed. The reaper thread decides and cleans up (this is the
  // connection's reader thread, which the cleanup joins).
  {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    if (stopping_) return;  // a shutdown drops connections on purpose
    initGone_.push_back(id);
  }
  reaperCv_.notify_all();
}

}  // namespace moat::manager
