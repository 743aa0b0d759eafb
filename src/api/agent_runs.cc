#include "api/agent_runs.h"

#include <algorithm>

namespace moat::api {

void AgentRuns::add(std::shared_ptr<AgentRunEntry> entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  runs_[entry->id] = std::move(entry);
  std::vector<std::shared_ptr<AgentRunEntry>> ended;
  for (const auto& [id, r] : runs_) {
    if (r->run && r->run->status().state != agent::RunState::kRunning) ended.push_back(r);
  }
  if (ended.size() <= kKeptEnded) return;
  std::sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) { return a->createdAtMs < b->createdAtMs; });
  for (size_t i = 0; i + kKeptEnded < ended.size(); ++i) runs_.erase(ended[i]->id);
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

size_t AgentRuns::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(std::count_if(runs_.begin(), runs_.end(), [](const auto& kv) {
    return kv.second->run && kv.second->run->status().state == agent::RunState::kRunning;
  }));
}

}  // namespace moat::api
