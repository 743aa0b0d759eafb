#pragma once

#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/metrics.h"
#include "api/rate_limit.h"
#include "api/validation.h"

namespace moat::api {

// Whether an API key's request may start (before its body is read): at
// most `maxInFlight` of the key's requests in progress at once, and its
// rate (RateLimiter): a request beyond the rate waits its turn, up to 2 s,
// or is refused with when to come back. The master token is not admitted
// here. Its own locks.
class KeyAdmission {
 public:
  KeyAdmission(size_t maxInFlight, double perSecond, ApiMetrics& metrics)
      : maxInFlight_(maxInFlight), rate_({perSecond, 2 * perSecond}), metrics_(metrics) {}

  struct Verdict {
    // Admitted: held until the request is answered (or its stream ends);
    // its place among the key's requests in progress.
    std::shared_ptr<void> hold;
    // Refused: why (429 capacity; 503 once stopping), and when to retry.
    std::optional<ApiError> refusal;
    std::string retryAfter;
  };
  // Blocks while the request waits its turn.
  Verdict admit(const std::string& keyId);
  // At stop: requests waiting for their turn are refused now, and none waits from now on.
  void stop();

 private:
  const size_t maxInFlight_;
  RateLimiter rate_;
  ApiMetrics& metrics_;
  std::mutex inFlightMutex_;
  std::map<std::string, size_t> inFlight_;  // requests in progress per key id
  std::mutex turnMutex_;
  std::condition_variable turnCv_;  // wakes requests waiting for their turn at stop
  bool stopping_ = false;
};

}  // namespace moat::api
