#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

namespace moat::api {

// Requests per second per API key: a token bucket per key that refills at
// `perSecond` up to `burst`. A request beyond waits its turn (the bucket goes
// into debt, so those waiting are let through in order, at the rate) unless
// its turn is more than `maxWait` away: then it is refused and told when a
// request would be let through at once. A flooding key gets its rate and no
// more of moatd's time, whatever number of connections it opens.
class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    double perSecond = 0;  // 0: no limit
    double burst = 0;      // at least 1 when limited
    Clock::duration maxWait = std::chrono::seconds(2);
  };
  struct Admission {
    bool admitted = true;
    Clock::duration wait{};        // admitted: wait this long, then go on
    Clock::duration retryAfter{};  // refused: a request then would not wait
  };

  explicit RateLimiter(Limits limits) : limits_(limits) {}
  bool enabled() const { return limits_.perSecond > 0; }
  const Limits& limits() const { return limits_; }
  Admission admit(const std::string& key, Clock::time_point now);

 private:
  struct Bucket {
    double tokens;  // below 0: what those already waiting owe
    Clock::time_point at;
  };
  Limits limits_;
  std::mutex mutex_;
  std::map<std::string, Bucket> buckets_;  // one per key that sent a request
};

}  // namespace moat::api
