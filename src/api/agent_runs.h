#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/run.h"

// The agent runs moatd holds (docs/AGENTS.md), each with its environment
// and whose it is. Kept in memory: a moatd restart ends the running ones
// (their environments are destroyed at the next start) and forgets them.
namespace moat::api {

struct AgentRunEntry {
  std::string id;
  std::string owner;  // "master" or a key id: as the environment's
  std::string environment;
  bool keepEnvironment = false;
  agent::ProviderKind kind = agent::ProviderKind::kAnthropic;
  std::string model;
  std::string baseUrl;
  uint32_t maxIterations = 30;
  int64_t createdAtMs = 0;
  std::map<std::string, std::string> labels;
  std::unique_ptr<agent::Run> run;
};

class AgentRuns {
 public:
  ~AgentRuns() { stopAll("moatd is stopping"); }
  void add(std::shared_ptr<AgentRunEntry> entry);
  std::shared_ptr<AgentRunEntry> get(const std::string& id) const;
  // Newest first; `owner` empty: everyone's.
  std::vector<std::shared_ptr<AgentRunEntry>> list(const std::string& owner) const;
  // Every running one ends as stopped (moatd's shutdown).
  void stopAll(const std::string& why);
  size_t running() const;
  // Ended runs kept for reading, beyond which the oldest ended go.
  // (A transcript holds at most 2 MiB: 512 MiB for all at worst.)
  static constexpr size_t kKeptEnded = 256;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<AgentRunEntry>> runs_;
};

}  // namespace moat::api
