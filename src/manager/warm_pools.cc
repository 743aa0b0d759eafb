#include "manager/warm_pools.h"

#include <algorithm>

namespace moat::manager {

namespace {
constexpr int64_t kBackOffMs = 5000;  // after a failed refill, that pool's next try
}

std::optional<size_t> WarmPools::poolFor(const std::string& templ, double cpus, uint64_t ramMb, double storageGb,
                                         uint64_t pids, backend::Isolation isolation) const {
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (pools_[i].keeps(templ, cpus, ramMb, storageGb, pids, isolation)) return i;
  }
  return std::nullopt;
}

std::optional<size_t> WarmPools::shortOf(int64_t nowMs) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<size_t> have = creating_;
  for (const auto& r : ready_) ++have[r.pool];
  for (size_t pool = 0; pool < pools_.size(); ++pool) {
    if (have[pool] < pools_[pool].size && nowMs >= retryAfterMs_[pool]) return pool;
  }
  return std::nullopt;
}

void WarmPools::refilling(size_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++creating_[pool];
}

void WarmPools::refilled(ReadyEnvironment ready) {
  std::lock_guard<std::mutex> lock(mutex_);
  --creating_[ready.pool];
  ready_.push_back(std::move(ready));
}

void WarmPools::refillFailed(size_t pool, int64_t nowMs) {
  std::lock_guard<std::mutex> lock(mutex_);
  --creating_[pool];
  retryAfterMs_[pool] = nowMs + kBackOffMs;
}

std::optional<ReadyEnvironment> WarmPools::take(size_t pool, int64_t nowMs) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(ready_.rbegin(), ready_.rend(), [&](const ReadyEnvironment& r) { return r.pool == pool; });
  if (it == ready_.rend()) return std::nullopt;
  ReadyEnvironment ready = std::move(*it);
  ready_.erase(std::next(it).base());
  lastClaimMs_ = nowMs;
  return ready;
}

void WarmPools::claimed(size_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++claims_[pool];
  ++allClaims_;
}

void WarmPools::putBack(ReadyEnvironment ready) {
  std::lock_guard<std::mutex> lock(mutex_);
  ready_.push_back(std::move(ready));
}

int64_t WarmPools::lastClaimMs() {
  std::lock_guard<std::mutex> lock(mutex_);
  return lastClaimMs_;
}

std::optional<ReadyEnvironment> WarmPools::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(ready_.begin(), ready_.end(), [&](const ReadyEnvironment& r) { return r.id == id; });
  if (it == ready_.end()) return std::nullopt;
  ReadyEnvironment ready = std::move(*it);
  ready_.erase(it);
  return ready;
}

std::vector<ReadyEnvironment> WarmPools::takeAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ReadyEnvironment> all;
  all.swap(ready_);
  return all;
}

std::vector<std::pair<std::string, std::shared_ptr<InitConnection>>> WarmPools::connections() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, std::shared_ptr<InitConnection>>> all;
  for (const auto& r : ready_) all.emplace_back(r.id, r.connection);
  return all;
}

size_t WarmPools::ready() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ready_.size();
}

uint64_t WarmPools::claims() {
  std::lock_guard<std::mutex> lock(mutex_);
  return allClaims_;
}

std::vector<PoolCount> WarmPools::counts() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<PoolCount> out;
  for (size_t i = 0; i < pools_.size(); ++i) out.push_back({pools_[i], 0, claims_[i]});
  for (const auto& r : ready_) ++out[r.pool].ready;
  return out;
}

}  // namespace moat::manager
