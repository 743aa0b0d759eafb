#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "manager/environment_manager.h"

namespace moat::api {

// One running environment's reading, for its series in /metrics.
struct EnvironmentUsage {
  std::string id;
  uint64_t memoryLimitBytes = 0;
  uint64_t storageLimitBytes = 0;
  backend::Usage usage;
};

// What GET /metrics shows (Prometheus text, docs/API.md "Metrics"): the
// manager's counters as they are now, and what the API counted itself:
// execs and their latency, requests waiting for their turn, error answers
// by code. Its own lock, for the error counts only.
class ApiMetrics {
 public:
  void countError(const std::string& code);
  void observeExec(double seconds);
  // A request waits for its turn under its key's rate limit while the
  // returned guard lives.
  struct Waiting {
    explicit Waiting(std::atomic<uint64_t>& n) : n_(n) { ++n_; }
    ~Waiting() { --n_; }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    std::atomic<uint64_t>& n_;
  };
  Waiting waiting() { return Waiting(waiting_); }
  std::string render(const manager::Counters& counters);
  // The per-environment series (labelled by id) of `usages`, and how many
  // running environments were left out beyond kMaxEnvironmentSeries.
  static std::string renderEnvironments(const std::vector<EnvironmentUsage>& usages, size_t omitted);
  static constexpr size_t kMaxEnvironmentSeries = 1000;

 private:
  static constexpr std::array<double, 10> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 10};
  std::array<std::atomic<uint64_t>, kBuckets.size() + 1> execBuckets_{};
  std::atomic<uint64_t> execMicros_{0};
  std::atomic<uint64_t> execCount_{0};
  std::atomic<uint64_t> waiting_{0};
  std::mutex errorsMutex_;
  std::map<std::string, uint64_t> errors_;
};

}  // namespace moat::api
