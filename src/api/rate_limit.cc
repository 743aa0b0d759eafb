#include "api/rate_limit.h"

#include <algorithm>

namespace moat::api {

namespace {

RateLimiter::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<RateLimiter::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

RateLimiter::Admission RateLimiter::admit(const std::string& key, Clock::time_point now) {
  Admission a;
  if (!enabled()) return a;
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, fresh] = buckets_.try_emplace(key, Bucket{limits_.burst, now});
  Bucket& b = it->second;
  if (now > b.at) {
    double elapsed = std::chrono::duration<double>(now - b.at).count();
    b.tokens = std::min(limits_.burst, b.tokens + elapsed * limits_.perSecond);
    b.at = now;
  }
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return a;
  }
  // This request's turn comes when the bucket holds one token again.
  double turnS = (1 - b.tokens) / limits_.perSecond;
  if (seconds(turnS) > limits_.maxWait) {
    a.admitted = false;
    a.retryAfter = seconds(turnS);
    return a;
  }
  b.tokens -= 1;
  a.wait = seconds(turnS);
  return a;
}

}  // namespace moat::api
