#include "egress/authorize.h"

namespace moat::egress {

Decision authorize(const Policy& policy, const Request& request, const Lookups& lookups) {
  Decision d;
  const std::string destination = request.host + ":" + std::to_string(request.port);
  Verdict v = decide(policy, Destination{request.host, request.port, std::nullopt, request.method, request.path});
  d.rule = v.rule;
  d.ruleJson = v.ruleJson;
  d.inspect = v.inspect;
  if (v.outcome == Outcome::kDeny) {
    d.why = destination + " is denied by the network policy (" + v.rule + ")";
    return d;
  }
  if (v.outcome == Outcome::kUnlisted) {
    GateAnswer g = lookups.gate ? lookups.gate(request.environment, request.host, request.port, false)
                                : GateAnswer{false, "not on the allowlist"};
    d.rule = "gate";
    if (!g.allowed) {
      d.why = destination + " is not on the allowlist (" + g.why + ")";
      return d;
    }
    d.byGate = true;
  } else if (lookups.gate) {
    GateAnswer g = lookups.gate(request.environment, request.host, request.port, true);
    if (!g.allowed) {
      d.rule = "ceiling";
      d.why = destination + " is refused (" + g.why + ")";
      return d;
    }
  }
  auto addresses = lookups.resolve(request.host);
  if (!addresses.ok() || addresses->empty()) {
    d.why = addresses.ok() ? request.host + " has no address" : addresses.error().message();
    return d;
  }
  d.address = addresses->front();
  Destination resolved{request.host, request.port, d.address, request.method, request.path};
  // Without a way to tell, every address counts as the host's own: refused.
  resolved.hostLocal = !isSpecialAddress(d.address) && (!lookups.hostLocal || lookups.hostLocal(d.address));
  Verdict withAddress = decide(policy, resolved);
  if (withAddress.outcome == Outcome::kDeny) {
    d.rule = withAddress.rule;
    d.why = request.host + " resolves to " + formatIpv4(d.address) + ", which the policy refuses (" + withAddress.rule +
            ")";
    return d;
  }
  d.inspect = d.inspect || withAddress.inspect;
  d.allowed = true;
  return d;
}

}  // namespace moat::egress
