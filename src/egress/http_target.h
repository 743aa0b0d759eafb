#pragma once

#include <cstdint>
#include <string>

// The proxy's reading of where a request goes, kept apart from its
// connection handling so that it can be unit-tested and fuzzed
// (fuzz/proxy_http.cc): the bytes come from inside a sandbox.
namespace moat::egress {

// "host", "host:port" -> host (canonical: lower case, no trailing dot, so
// "evil.com." is "evil.com" to every rule) and port (`defaultPort` when none
// is given). False for anything else: IPv6 literals ("[v6]:port":
// environments have none), an empty or over-long host, a port outside
// 1..65535, characters other than [A-Za-z0-9._-].
bool splitAuthority(const std::string& authority, uint16_t defaultPort, std::string& host, uint16_t& port);

}  // namespace moat::egress
