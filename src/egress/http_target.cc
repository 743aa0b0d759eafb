#include "egress/http_target.h"

#include <algorithm>
#include <cctype>

#include "egress/policy.h"

namespace moat::egress {

bool splitAuthority(const std::string& authority, uint16_t defaultPort, std::string& host, uint16_t& port) {
  if (authority.empty() || authority.size() > 300) return false;
  if (authority[0] == '[') return false;  // IPv6: environments have none
  auto colon = authority.rfind(':');
  host = canonicalHost(authority.substr(0, colon));
  port = defaultPort;
  if (colon != std::string::npos) {
    std::string p = authority.substr(colon + 1);
    if (p.empty() || p.size() > 5 || !std::all_of(p.begin(), p.end(), ::isdigit)) return false;
    int v = std::stoi(p);
    if (v < 1 || v > 65535) return false;
    port = static_cast<uint16_t>(v);
  }
  if (host.empty() || host.size() > 253 || host.back() == '.') return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
}

}  // namespace moat::egress
