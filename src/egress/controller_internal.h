#pragma once

// What controller.cc and proxy.cc share: an attached environment's state.
#include <algorithm>
#include <map>
#include <mutex>

#include "egress/controller.h"

namespace moat::egress {

// A token bucket: `rate` a second, at most `burst` saved up.
struct RateBucket {
  explicit RateBucket(double burst) : tokens(burst) {}
  double tokens;
  Clock::time_point refilled = Clock::now();
  bool take(double rate, double burst) {
    auto now = Clock::now();
    tokens = std::min(burst, tokens + std::chrono::duration<double>(now - refilled).count() * rate);
    refilled = now;
    if (tokens < 1) return false;
    tokens -= 1;
    return true;
  }
};

struct Controller::Env {
  std::string id;
  EgressNetwork::Link link;
  bool attaching = false;  // its link is being made: not served yet
  std::mutex mutex;        // guards policy and secrets (replaced whole), the buckets, the stand-ins
  std::shared_ptr<const Policy> policy;
  std::shared_ptr<const std::vector<Secret>> secrets;
  std::atomic<uint32_t> connections{0};
  double tokens = 0;  // bandwidth bucket, bytes
  Clock::time_point refilled = Clock::now();
  // DNS questions: answered at a bounded rate, a bounded number at a time
  // (a flood costs this environment its own answers, nobody else's).
  RateBucket dnsQuestions{kDnsBurst};
  std::atomic<uint32_t> dnsInFlight{0};
  // Refusals, and allowed connections and requests, are recorded at a
  // bounded rate each; the ones left out are counted into the next one
  // recorded of their kind ("suppressed").
  // Stand-in addresses (198.18.0.0/15) for names waiting on an "ask": this
  // environment's own, so no other learns what it looked up.
  std::map<std::string, uint32_t> standInByName;
  std::map<uint32_t, std::string> nameByStandIn;
  uint32_t nextStandIn = 0;

  std::shared_ptr<const Policy> currentPolicy() {
    std::lock_guard<std::mutex> lock(mutex);
    return policy;
  }
  std::shared_ptr<const std::vector<Secret>> currentSecrets() {
    std::lock_guard<std::mutex> lock(mutex);
    return secrets;
  }
};

// How a destination was judged.

}  // namespace moat::egress
