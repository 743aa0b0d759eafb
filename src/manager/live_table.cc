#include "manager/live_table.h"

#include <algorithm>

namespace moat::manager {

void LiveTable::beginCreate(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  creating_.insert(id);
}

void LiveTable::abandonCreate(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  creating_.erase(id);
  destroyRequested_.erase(id);
}

std::string LiveTable::destroyRequestedBy(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = destroyRequested_.find(id);
  return it == destroyRequested_.end() ? std::string() : it->second;
}

void LiveTable::put(const std::string& id, LiveEnvironment live) {
  // An entry it replaces ends after the lock is let go: its connection's
  // end joins a reader thread that may be asking the gate, which looks here.
  std::optional<LiveEnvironment> replaced;
  std::lock_guard<std::mutex> lock(mutex_);
  creating_.erase(id);
  destroyRequested_.erase(id);
  nextExpiryMs_ = std::min(nextExpiryMs_, live.expiresAtMs);
  auto [it, added] = live_.try_emplace(id);
  if (!added) replaced = std::move(it->second);
  it->second = std::move(live);
}

std::optional<LiveEnvironment> LiveTable::take(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  if (it == live_.end()) return std::nullopt;
  LiveEnvironment taken = std::move(it->second);
  live_.erase(it);
  return taken;
}

LiveTable::Destroy LiveTable::takeForDestroy(const std::string& id, const std::string& actor, LiveEnvironment& taken) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (creating_.count(id)) {
    destroyRequested_.emplace(id, actor);
    return Destroy::kRequested;
  }
  auto it = live_.find(id);
  if (it == live_.end()) return Destroy::kAbsent;
  taken = std::move(it->second);
  live_.erase(it);
  return Destroy::kTaken;
}

std::optional<LiveEnvironment> LiveTable::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  if (it == live_.end()) return std::nullopt;
  return it->second;
}

bool LiveTable::runs(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_.count(id) > 0;
}

bool LiveTable::runsOrIsBeingCreated(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_.count(id) > 0 || creating_.count(id) > 0;
}

bool LiveTable::connected(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  return it != live_.end() && it->second.connection && !it->second.connection->closed();
}

bool LiveTable::update(const std::string& id, const std::function<void(LiveEnvironment&)>& change) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  if (it == live_.end()) return false;
  change(it->second);
  return true;
}

void LiveTable::setExpiry(const std::string& id, int64_t expiresAtMs) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = live_.find(id); it != live_.end()) it->second.expiresAtMs = expiresAtMs;
  nextExpiryMs_ = std::min(nextExpiryMs_, expiresAtMs);
}

std::vector<std::string> LiveTable::ids() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> ids;
  ids.reserve(live_.size());
  for (const auto& [id, live] : live_) ids.push_back(id);
  return ids;
}

std::vector<std::pair<std::string, std::shared_ptr<InitConnection>>> LiveTable::connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, std::shared_ptr<InitConnection>>> all;
  all.reserve(live_.size());
  for (const auto& [id, live] : live_) all.emplace_back(id, live.connection);
  return all;
}

std::map<std::string, LiveEnvironment> LiveTable::takeAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, LiveEnvironment> all;
  all.swap(live_);
  return all;
}

std::vector<std::string> LiveTable::expired(int64_t nowMs) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> due;
  if (nowMs < nextExpiryMs_) return due;
  nextExpiryMs_ = INT64_MAX;
  for (const auto& [id, live] : live_) {
    if (live.expiresAtMs <= nowMs) due.push_back(id);
    nextExpiryMs_ = std::min(nextExpiryMs_, live.expiresAtMs);
  }
  return due;
}

}  // namespace moat::manager
