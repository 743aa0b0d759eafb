#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

// An environment's network policy (docs/EGRESS.md): a mode and, for
// "allowlist", which destinations may be reached. Pure data and matching:
// the proxy and the resolver ask it; no I/O here.
namespace moat::egress {

enum class Mode { kNone, kAllowlist, kOpen };
const char* modeName(Mode m);

// An IPv4 network; addresses in host byte order.
struct Cidr {
  uint32_t address = 0;
  int prefix = 32;
  bool contains(uint32_t a) const;
};
std::optional<uint32_t> parseIpv4(const std::string& text);  // dotted quad only
std::string formatIpv4(uint32_t address);
// Addresses no public destination has: private, loopback, link-local (and
// so cloud metadata), CGNAT, multicast, reserved, "this network", broadcast.
bool isSpecialAddress(uint32_t address);
// A host name as policies see it: lower case, without the trailing dot of a
// fully qualified name ("API.example.com." is "api.example.com").
std::string canonicalHost(std::string host);
// The forms of a request path that rules must agree on (query gone, dot
// segments resolved): as sent, and as a server that decodes %XX,
// takes '\' for '/' and drops ";parameters" before resolving "..". An
// allow rule must match every form, a deny rule any.
std::vector<std::string> requestPathForms(const std::string& target);

struct Entry {
  std::optional<std::string> host;   // glob over a lower-case name ("*.pypi.org")
  std::optional<Cidr> network;       // or an address range
  std::vector<uint16_t> ports;       // empty: any port
  std::vector<std::string> methods;  // upper case; empty: any
  std::vector<std::string> paths;    // globs ("/repos/**"); empty: any
  nlohmann::json written;            // as the user wrote it (for events)
  // Needs the HTTP request to decide: over TLS, that means interception.
  bool inspectsRequests() const { return !methods.empty() || !paths.empty(); }
};

struct Policy {
  Mode mode = Mode::kNone;
  std::vector<Entry> allow;
  std::vector<Entry> deny;
  uint32_t maxConnections = 64;     // open at once
  uint64_t bandwidthBytesPerS = 0;  // both directions together; 0: unlimited

  // {"mode": ..., "allow": [...], "deny": [...], "max_connections": N,
  //  "bandwidth_mbps": N}. Errors name the field (code "invalid_request",
  // context "<field>: <problem>").
  static Result<Policy> parse(const nlohmann::json& j, const std::string& prefix = "network");
  nlohmann::json toJson() const;
};

// One destination as the proxy sees it. `host` is the name the client asked
// for (lower case) or an address literal; `address` what it resolves to.
struct Destination {
  std::string host;
  uint16_t port = 0;                // 0: any (a DNS question)
  std::optional<uint32_t> address;  // host byte order
  std::string method;               // empty: not visible (a TLS tunnel)
  std::string path;
  // `address` is one of moatd's own host's (its services listen there):
  // refused like a special address.
  bool hostLocal = false;
};

enum class Outcome { kAllow, kDeny, kUnlisted };
struct Verdict {
  Outcome outcome = Outcome::kUnlisted;
  std::string rule;  // "allow[2]", "deny[0]", "open", "special address", ...
  nlohmann::json ruleJson;
  bool inspect = false;  // an allow that depends on the request (method/path)
};

// Deny entries first, then (open) everything, then allow entries. A host
// whose address is special is refused unless an allow entry's network covers
// that address. With no method/path yet, an entry with method or path rules
// matches provisionally (`inspect`): each request is decided again.
Verdict decide(const Policy& policy, const Destination& d);

}  // namespace moat::egress
