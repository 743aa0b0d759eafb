#include "audit/environment_share.h"

#include <algorithm>
#include <chrono>

namespace moat::audit {

EnvironmentShare::EnvironmentShare(std::function<void(const std::string&, const std::string&, nlohmann::json)> write,
                                   Options options)
    : write_(std::move(write)), options_(std::move(options)) {
  if (!options_.clockMs) {
    options_.clockMs = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
}

void EnvironmentShare::summarize(const std::string& environment, Env& env, const char* why) {
  nlohmann::json counts = nlohmann::json::object();
  uint64_t total = 0;
  for (auto& [type, n] : env.beyondShare) {
    if (n) counts[type] = n;
    total += n;
  }
  for (auto& [type, bucket] : env.types) {
    if (!bucket.suppressed) continue;
    counts[type] = counts.value(type, uint64_t{0}) + bucket.suppressed;
    total += bucket.suppressed;
    bucket.suppressed = 0;
  }
  env.beyondShare.clear();
  if (!total) return;
  write_("audit.summarized", environment,
         {{"counts", counts},
          {"reason", why},
          {"share", options_.share},
          {"message", "events the environment caused that the log counted instead of keeping one by one"}});
}

void EnvironmentShare::record(const std::string& type, const std::string& environment, nlohmann::json data, Pace pace) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t now = options_.clockMs();
  Env& env = envs_[environment];
  if (options_.share && env.recorded >= options_.share) {
    ++env.beyondShare[type];
    if (now - env.summarizedMs >= options_.summaryEveryMs) {
      env.summarizedMs = now;
      summarize(environment, env, "share");
    }
    return;
  }
  Bucket& bucket = env.types[type];
  if (bucket.tokens < 0) {
    bucket.tokens = pace.burst;
    bucket.refilledMs = now;
  }
  bucket.tokens =
      std::min(pace.burst, bucket.tokens + pace.rate * static_cast<double>(now - bucket.refilledMs) / 1000.0);
  bucket.refilledMs = now;
  if (bucket.tokens < 1) {
    ++bucket.suppressed;
    return;
  }
  bucket.tokens -= 1;
  if (bucket.suppressed) {
    data["suppressed"] = bucket.suppressed;
    bucket.suppressed = 0;
  }
  ++env.recorded;
  write_(type, environment, std::move(data));
  if (options_.share && env.recorded == options_.share) env.summarizedMs = now;  // summaries from here on
}

void EnvironmentShare::close(const std::string& environment) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = envs_.find(environment);
  if (it == envs_.end()) return;
  summarize(environment, it->second, "the environment ended");
  envs_.erase(it);
}

}  // namespace moat::audit
