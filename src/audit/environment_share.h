#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "audit/event.h"

namespace moat::audit {

// Keeps what code inside one environment can make the log record to a share
// of it. Such events (connections, refusals, network questions) cost the
// environment nothing to cause; recorded one by one without bound, one
// environment would fill the log, and retention by count would then prune
// every other environment's history to make room.
//
// - Per environment and type, at most `pace` (a token bucket): the events
//   beyond it are counted, and the next one recorded carries "suppressed":
//   how many were left out since the last.
// - Per environment, at most `share` such events in all: beyond it, each
//   type is only counted, and an `audit.summarized` event with the counts
//   is written at most once per `summaryEveryMs` (and at the environment's
//   end).
class EnvironmentShare {
 public:
  struct Options {
    uint64_t share = 50'000;  // 0: no share (only the pace)
    int64_t summaryEveryMs = 60'000;
    std::function<int64_t()> clockMs;  // milliseconds, monotonic; a test sets one
  };
  EnvironmentShare(std::function<void(const std::string&, const std::string&, nlohmann::json)> write, Options options);

  void record(const std::string& type, const std::string& environment, nlohmann::json data, Pace pace);
  void close(const std::string& environment);

 private:
  struct Bucket {
    double tokens = -1;  // -1: not used yet (full)
    int64_t refilledMs = 0;
    uint64_t suppressed = 0;  // left out by the pace since the last recorded
  };
  struct Env {
    std::map<std::string, Bucket> types;
    uint64_t recorded = 0;
    std::map<std::string, uint64_t> beyondShare;  // counted since the last summary
    int64_t summarizedMs = 0;
  };
  void summarize(const std::string& environment, Env& env, const char* why);

  std::function<void(const std::string&, const std::string&, nlohmann::json)> write_;
  Options options_;
  std::mutex mutex_;
  std::map<std::string, Env> envs_;
};

}  // namespace moat::audit
