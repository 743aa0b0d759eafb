#include "api/agent_runs.h"

#include <algorithm>

#include "common/clock.h"

namespace moat::api {

Status AgentRuns::admit(const std::string& owner) const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t all = 0, owners = 0;
  for (const auto& [id, r] : runs_) {
    if (!r->run || r->run->status().state != agent::RunState::kRunning) continue;
    ++all;
    if (r->owner == owner) ++owners;
  }
  if (owners >= kRunningPerOwner) {
    return Error::make(Code::kCapacity, "at most " + std::to_string(kRunningPerOwner) +
                                            " agent runs of one owner run at once; stop one or wait for one to end");
  }
  if (all >= kRunning) {
    return Error::make(Code::kCapacity, "moatd runs " + std::to_string(kRunning) + " agent runs, its most at once");
  }
  return {};
}

void AgentRuns::add(std::shared_ptr<AgentRunEntry> entry) {
  // The evicted go after the lock is let go: their runs' threads are joined.
  std::vector<std::shared_ptr<AgentRunEntry>> evicted;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string owner = entry->owner;
  runs_[entry->id] = std::move(entry);
  // Each owner keeps its own newest ended runs: one owner's failures do
  // not push out another's.
  std::vector<std::shared_ptr<AgentRunEntry>> ended;
  for (const auto& [id, r] : runs_) {
    if (r->owner == owner && r->run && r->run->status().state != agent::RunState::kRunning) ended.push_back(r);
  }
  if (ended.size() <= kKeptEndedPerOwner) return;
  std::sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) { return a->createdAtMs < b->createdAtMs; });
  for (size_t i = 0; i + kKeptEndedPerOwner < ended.size(); ++i) {
    runs_.erase(ended[i]->id);
    evicted.push_back(ended[i]);
  }
}

std::shared_ptr<AgentRunEntry> AgentRuns::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = runs_.find(id);
  return it == runs_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<AgentRunEntry>> AgentRuns::list(const std::string& owner) const {
  std::vector<std::shared_ptr<AgentRunEntry>> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, r] : runs_) {
      if (owner.empty() || r->owner == owner) out.push_back(r);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->createdAtMs > b->createdAtMs; });
  return out;
}

void AgentRuns::stopAll(const std::string& why) {
  std::vector<std::shared_ptr<AgentRunEntry>> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, r] : runs_) all.push_back(r);
  }
  for (const auto& r : all) {
    if (r->run) r->run->stop(why);
  }
}

void AgentRuns::environmentEnded(const std::string& environment, const std::string& reason) {
  std::vector<std::shared_ptr<AgentRunEntry>> ended;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, r] : runs_) {
      if (r->environment == environment && r->run && r->run->status().state == agent::RunState::kRunning) {
        ended.push_back(r);
      }
    }
  }
  for (const auto& r : ended) r->run->requestStop(reason);  // "the environment was destroyed", ".. expired ..."
}

std::string AgentRuns::spend(const std::string& owner, uint64_t tokens, uint64_t limit) {
  if (limit == 0) return "";
  std::lock_guard<std::mutex> lock(mutex_);
  Tokens& t = tokens_[owner];
  const int64_t today = nowMs() / 86400000;
  if (t.day != today) t = {today, 0};
  t.used += tokens;
  if (t.used < limit) return "";
  return "its owner's agent token budget for today (" + std::to_string(limit) + ", moatd --agent-key-tokens) is spent";
}

bool AgentRuns::spent(const std::string& owner, uint64_t limit) {
  if (limit == 0) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = tokens_.find(owner);
  return it != tokens_.end() && it->second.day == nowMs() / 86400000 && it->second.used >= limit;
}

}  // namespace moat::api
