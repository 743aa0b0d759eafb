#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/result.h"
#include "egress/policy.h"

namespace moat::egress {

// The gate's say on a destination: one that no allowlist entry matched
// (listed false), where the environment's network permission decides and
// waits for a person when it is "ask"; and one the policy allows (listed
// true), which the ceiling of the key that created the environment may
// still refuse or ask about.
struct GateAnswer {
  bool allowed = false;
  std::string why;  // for the refusal and the event
};
using GateHook =
    std::function<GateAnswer(const std::string& environment, const std::string& host, uint16_t port, bool listed)>;

// What a connection (or one request on it) gets.
struct Decision {
  bool allowed = false;
  std::string rule;  // which rule decided ("allow[0]", "gate", "ceiling", "deny[1]", ...)
  nlohmann::json ruleJson;
  std::string why;       // for a refusal
  bool inspect = false;  // requests must be seen: TLS is intercepted
  bool byGate = false;   // unlisted, allowed by the gate (or a person)
  uint32_t address = 0;  // where to connect, host byte order
};

struct Request {
  std::string environment;
  std::string host;  // as the client asked for it (lower case) or an address literal
  uint16_t port = 0;
  std::string method;  // empty: not visible (a TLS tunnel)
  std::string path;
};

// What authorize() asks of the world: the gate (none: unlisted is refused),
// the name's addresses, and whether an address is one of moatd's host's own
// (none: every address is, and refused unless an allow entry names it).
struct Lookups {
  GateHook gate;
  std::function<Result<std::vector<uint32_t>>(const std::string& host)> resolve;
  std::function<bool(uint32_t address)> hostLocal;
};

// The policy on the name first (a deny never reaches the gate or the
// resolver), then the gate, then the policy again on the address the name
// resolves to: a name that resolves to a private range or to moatd's host
// is refused unless an allow entry names that network (DNS rebinding).
Decision authorize(const Policy& policy, const Request& request, const Lookups& lookups);

}  // namespace moat::egress
