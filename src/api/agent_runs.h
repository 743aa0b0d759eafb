#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/run.h"
#include "common/result.h"

// The agent runs moatd holds (docs/AGENTS.md), each with its environment
// and whose it is. Kept in memory: a moatd restart ends the running ones
// (their environments are destroyed at the next start) and forgets them.
namespace moat::api {

struct AgentRunEntry {
  std::string id;
  std::string owner;  // "master" or a key id: as the environment's
  std::string environment;
  bool keepEnvironment = false;
  std::string kind;  // anthropic, openai, replay
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
  // Room for one more running run of `owner` (capacity when not).
  Status admit(const std::string& owner) const;
  void add(std::shared_ptr<AgentRunEntry> entry);
  std::shared_ptr<AgentRunEntry> get(const std::string& id) const;
  // Newest first; `owner` empty: everyone's.
  std::vector<std::shared_ptr<AgentRunEntry>> list(const std::string& owner) const;
  // Every running one ends as stopped (moatd's shutdown).
  void stopAll(const std::string& why);
  // The environment ended (destroyed, expired, failed): its run stops,
  // `reason` (manager's "the environment was destroyed", ...) its error.
  void environmentEnded(const std::string& environment, const std::string& reason);
  // An owner's tokens today (UTC) across its runs, against `limit` (0: no
  // limit): spend() counts a turn's and says why the run must end once
  // the day's budget is spent; spent() whether it is.
  std::string spend(const std::string& owner, uint64_t tokens, uint64_t limit);
  bool spent(const std::string& owner, uint64_t limit);
  // Runs running at once, per owner and in all (each holds two threads).
  static constexpr size_t kRunningPerOwner = 32;
  static constexpr size_t kRunning = 256;
  // Ended runs each owner keeps for reading, beyond which its oldest ended
  // go (a transcript holds at most 2 MiB).
  static constexpr size_t kKeptEndedPerOwner = 64;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<AgentRunEntry>> runs_;
  struct Tokens {
    int64_t day = 0;
    uint64_t used = 0;
  };
  std::map<std::string, Tokens> tokens_;  // per owner, guarded by mutex_
};

}  // namespace moat::api
