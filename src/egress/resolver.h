#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"

// How moatd finds the addresses of the hosts environments reach: a hosts
// file of its own first (`moatd --egress-hosts`: pinning, and how tests
// point names at their own servers), then the host's resolver. IPv4 only.
namespace moat::egress {

class Resolver {
 public:
  // Lines "ADDRESS NAME [NAME...]", '#' comments; an empty path: none.
  static Result<Resolver> load(const std::string& hostsFile);
  // Addresses in host byte order; an address literal resolves to itself.
  Result<std::vector<uint32_t>> resolve(const std::string& host) const;
  // Whether a line of the hosts file names this address: the operator made
  // it a destination, even when it is one of moatd's host's own.
  bool pinned(uint32_t address) const;

 private:
  std::map<std::string, std::vector<uint32_t>> overrides_;
};

}  // namespace moat::egress
