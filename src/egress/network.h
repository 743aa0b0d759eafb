#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "os/netlink.h"

// Egress: the one network namespace through which environments reach the
// outside, and only through moatd's listeners.
namespace moat::egress {

// The egress network namespace. An environment with network access gets a
// veth pair: `eth0` in its own namespace, `mx<slot in hex>` in this one.
// Here an AnyIP route (local 0.0.0.0/0 dev lo table local) makes every IPv4
// destination local, so moatd's listeners on 0.0.0.0 receive whatever an
// environment sends and getsockname() gives the original destination; any
// other TCP port answers with a RST. Nothing is forwarded. moatd's own
// upstream connections leave from the host namespace.
//
// The namespace is persisted as a bind mount on <stateDir>/run/egress.netns
// (like `ip netns add`), so it and its veths outlive a moatd restart.
class EgressNetwork {
 public:
  // Environments live in 100.64.0.0/10, one /30 per slot.
  static constexpr uint32_t kNetwork = 0x64400000;  // 100.64.0.0, host byte order
  static constexpr uint8_t kNetworkPrefixLen = 10;
  static constexpr uint8_t kPrefixLen = 30;
  static constexpr uint32_t kSlotCount = 1u << (32 - kNetworkPrefixLen - 2);
  static constexpr char kEnvironmentIfName[] = "eth0";

  // One environment's addressing. Addresses are in network byte order.
  struct Link {
    uint32_t slot = 0;
    uint32_t gateway = 0;    // egress end: base + 1
    uint32_t address = 0;    // environment end: base + 2
    std::string hostIfName;  // "mx<slot in hex>", in the egress namespace
  };

  // Opens the persisted namespace, or creates, sets up and persists one.
  static Result<std::unique_ptr<EgressNetwork>> openOrCreate(const std::string& stateDir);

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }

  // Sockets on 0.0.0.0:port inside the egress namespace.
  Result<UniqueFd> listenTcp(uint16_t port) const;
  Result<UniqueFd> bindUdp(uint16_t port) const;

  // Precondition: slot < kSlotCount (attach checks it).
  static Link linkFor(uint32_t slot);
  // The slot whose environment address is sourceAddress (network byte
  // order); "not_found" for any other address.
  static Result<uint32_t> slotOf(uint32_t sourceAddress);

  // Connects the environment namespace envNetnsFd as `slot`: veth pair,
  // addresses, links up, default route via the gateway, IPv6 off in the
  // environment. A stale mx<slot> is deleted first. On failure nothing is
  // left behind.
  Result<Link> attach(int envNetnsFd, uint32_t slot) const;
  // Deletes the pair (synchronous, ~30 ms). An environment whose namespace
  // is about to go away needs no detach: its veth goes with it.
  Status detach(uint32_t slot) const;
  // What the link of `slot` has carried, from the environment's side (what
  // mx<slot> received, the environment sent). ENODEV when it has no link.
  Result<os::LinkCounters> counters(uint32_t slot) const;
  // The slots of the links in the egress namespace now (mx<slot>).
  Result<std::vector<uint32_t>> linkedSlots() const;

  // Unmounts and deletes the persisted file (orderly shutdown). The
  // namespace and every veth go away once no fd holds it, this one included.
  Status remove();

 private:
  EgressNetwork(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}

  std::string path_;
  UniqueFd fd_;
  // counters()' socket in the namespace, opened at its first reading and
  // kept (a reading is one request then, not a setns and a socket), made
  // anew after an error.
  mutable std::mutex countersMutex_;
  mutable std::optional<os::Netlink> countersSocket_;
};

// "100.64.0.22" for an address in network byte order.
std::string dottedQuad(uint32_t address);

}  // namespace moat::egress
