#include "egress/resolver.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "egress/policy.h"

namespace moat::egress {

Result<Resolver> Resolver::load(const std::string& hostsFile) {
  Resolver r;
  if (hostsFile.empty()) return r;
  std::ifstream in(hostsFile);
  if (!in) return Error::make(Code::kNotFound, "cannot read the egress hosts file " + hostsFile);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string address, name;
    if (!(words >> address)) continue;
    auto a = parseIpv4(address);
    if (!a) {
      return Error::make(Code::kInvalidArgument,
                         hostsFile + ":" + std::to_string(number) + ": '" + address + "' is not an IPv4 address");
    }
    while (words >> name) r.overrides_[canonicalHost(name)].push_back(*a);
  }
  return r;
}

bool Resolver::pinned(uint32_t address) const {
  for (const auto& [name, addresses] : overrides_) {
    if (std::find(addresses.begin(), addresses.end(), address) != addresses.end()) return true;
  }
  return false;
}

Result<std::vector<uint32_t>> Resolver::resolve(const std::string& hostIn) const {
  std::string host = canonicalHost(hostIn);
  if (auto literal = parseIpv4(host)) return std::vector<uint32_t>{*literal};
  if (auto it = overrides_.find(host); it != overrides_.end()) return it->second;
  struct addrinfo hints {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* list = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (rc != 0) return Error::make(Code::kNotFound, "cannot resolve " + host + ": " + gai_strerror(rc));
  std::vector<uint32_t> out;
  for (auto* p = list; p; p = p->ai_next) {
    uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(p->ai_addr)->sin_addr.s_addr);
    bool seen = false;
    for (uint32_t x : out) seen = seen || x == a;
    if (!seen) out.push_back(a);
  }
  ::freeaddrinfo(list);
  if (out.empty()) return Error::make(Code::kNotFound, "no IPv4 address for " + host);
  return out;
}

}  // namespace moat::egress
