#include "common/keyed_lock.h"

namespace moat {

KeyedLock::Held KeyedLock::shared(const std::string& key) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    released_.wait(lock, [&] {
      auto it = holders_.find(key);
      return it == holders_.end() || it->second > 0;
    });
    ++holders_[key];
  }
  return Held([this, key] { release(key); });
}

KeyedLock::Held KeyedLock::exclusive(const std::string& key) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    released_.wait(lock, [&] { return holders_.count(key) == 0; });
    holders_[key] = -1;
  }
  return Held([this, key] { release(key); });
}

std::optional<KeyedLock::Held> KeyedLock::tryExclusive(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (holders_.count(key) > 0) return std::nullopt;
    holders_[key] = -1;
  }
  return std::optional<Held>(std::in_place, [this, key] { release(key); });
}

bool KeyedLock::held(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return holders_.count(key) > 0;
}

void KeyedLock::release(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = holders_.find(key);
    if (it->second > 1) {
      --it->second;
      return;  // other shared holders remain: no waiter can go on yet
    }
    holders_.erase(it);
  }
  released_.notify_all();
}

}  // namespace moat
