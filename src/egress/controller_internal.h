#pragma once

// What controller.cc and proxy.cc share: an attached environment's state.
#include <mutex>

#include "egress/controller.h"

namespace moat::egress {

struct Controller::Env {
  std::string id;
  EgressNetwork::Link link;
  bool attaching = false;  // its link is being made: not served yet
  std::mutex mutex;        // guards policy and secrets (replaced whole), the bucket
  std::shared_ptr<const Policy> policy;
  std::shared_ptr<const std::vector<Secret>> secrets;
  std::atomic<uint32_t> connections{0};
  double tokens = 0;  // bandwidth bucket, bytes
  Clock::time_point refilled = Clock::now();

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
struct Controller::Decision {
  bool allowed = false;
  std::string rule;          // which rule decided ("allow[0]", "gate", "deny[1]", ...)
  nlohmann::json ruleJson;
  std::string why;           // for a refusal
  bool inspect = false;      // requests must be seen: TLS is intercepted
  bool byGate = false;       // unlisted, allowed by the gate (or a person)
  uint32_t address = 0;      // where to connect, host byte order
};

}  // namespace moat::egress
