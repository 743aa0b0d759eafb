#include "egress/network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstdio>
#include <utility>
#include <vector>

#include "common/scope_exit.h"
#include "os/file.h"
#include "os/mount.h"
#include "os/netlink.h"

namespace moat::egress {
namespace {

using Sysctls = std::vector<std::pair<std::string, std::string>>;

// IPv6 off before any veth exists ("default" covers interfaces created
// later), so no link-local address is ever assigned. A kernel without IPv6
// has no such files, and nothing to turn off.
Status disableIpv6(int netnsFd) {
  Status status =
      os::writeNetSysctls(netnsFd, {{"ipv6/conf/all/disable_ipv6", "1"}, {"ipv6/conf/default/disable_ipv6", "1"}});
  if (!status.ok() && status.error().sysErrno == ENOENT) return {};
  return status;
}

Status checkSlot(uint32_t slot) {
  if (slot >= EgressNetwork::kSlotCount) {
    return Error::make(Code::kInvalidArgument, "egress slot " + std::to_string(slot) + " out of range");
  }
  return {};
}

Status setUpEgressNamespace(int netnsFd) {
  MOAT_TRY(disableIpv6(netnsFd));
  MOAT_TRY(os::writeNetSysctls(netnsFd, Sysctls{
                                            {"ipv4/icmp_echo_ignore_all", "1"},
                                            {"ipv4/ip_forward", "0"},
                                            // A veth only accepts its own environment's
                                            // address as source: no spoofing another slot.
                                            {"ipv4/conf/all/rp_filter", "1"},
                                            {"ipv4/conf/default/rp_filter", "1"},
                                        }));
  MOAT_ASSIGN(os::Netlink netlink, os::Netlink::open(netnsFd));
  MOAT_TRY(netlink.setLinkUp("lo"));
  MOAT_TRY(netlink.addAnyIpLocalRoute());
  // With AnyIP in the local table, replies to an environment (and the
  // rp_filter check of its source) would also resolve to "local" as soon as
  // the local and main tables are unmerged (any `ip rule`). The throw sends
  // environment addresses on to the main table and its per-veth /30 routes.
  MOAT_TRY(netlink.addLocalThrowRoute(htonl(EgressNetwork::kNetwork), EgressNetwork::kNetworkPrefixLen));
  return {};
}

// Creates, sets up and persists a new egress namespace on `path`.
Result<UniqueFd> createAt(const std::string& path) {
  MOAT_ASSIGN(UniqueFd netns, os::newNetworkNamespace());
  MOAT_TRY(setUpEgressNamespace(netns.get()));
  // The mount point: an empty file, as `ip netns add` makes.
  MOAT_TRY(os::open(path, O_RDONLY | O_CREAT, 0444));
  MOAT_TRY(os::bindMount("/proc/self/fd/" + std::to_string(netns.get()), path));
  return netns;
}

}  // namespace

std::string dottedQuad(uint32_t address) { return os::ipv4ToString(address); }

Result<std::unique_ptr<EgressNetwork>> EgressNetwork::openOrCreate(const std::string& stateDir) {
  std::string runDir = stateDir + "/run";
  MOAT_TRY(os::makeDirs(runDir, 0700));
  std::string path = runDir + "/egress.netns";
  auto existing = os::openNetworkNamespace(path);
  UniqueFd netns;
  if (existing.ok()) {
    netns = std::move(existing.value());
  } else if (existing.error().code == Code::kNotNetns || existing.error().sysErrno == ENOENT) {
    // No file, or a file left without its mount (a reboot): a new namespace.
    MOAT_ASSIGN(netns, createAt(path));
  } else {
    return existing.error();
  }
  return std::unique_ptr<EgressNetwork>(new EgressNetwork(std::move(path), std::move(netns)));
}

Result<UniqueFd> EgressNetwork::listenTcp(uint16_t port) const {
  return os::openTcpListener(fd_.get(), INADDR_ANY, port);
}

Result<UniqueFd> EgressNetwork::bindUdp(uint16_t port) const { return os::openUdpSocket(fd_.get(), INADDR_ANY, port); }

EgressNetwork::Link EgressNetwork::linkFor(uint32_t slot) {
  uint32_t base = kNetwork + 4 * slot;
  char name[16];
  std::snprintf(name, sizeof name, "mx%x", slot);
  return Link{slot, htonl(base + 1), htonl(base + 2), name};
}

Result<uint32_t> EgressNetwork::slotOf(uint32_t sourceAddress) {
  uint32_t host = ntohl(sourceAddress);
  uint32_t networkMask = ~0u << (32 - kNetworkPrefixLen);
  if ((host & networkMask) != kNetwork || (host & 3) != 2) {
    return Error::make(Code::kNotFound, dottedQuad(sourceAddress) + " is no environment address");
  }
  return (host - kNetwork) >> 2;
}

Result<EgressNetwork::Link> EgressNetwork::attach(int envNetnsFd, uint32_t slot) const {
  MOAT_TRY(checkSlot(slot));
  Link link = linkFor(slot);
  MOAT_ASSIGN(os::Netlink egress, os::Netlink::open(fd_.get()));
  // Left by an environment of an earlier moatd run.
  Status stale = egress.deleteLink(link.hostIfName);
  if (!stale.ok() && stale.error().sysErrno != ENODEV) return stale.error();

  MOAT_TRY(disableIpv6(envNetnsFd));
  MOAT_TRY(egress.createVethPair(link.hostIfName, kEnvironmentIfName, envNetnsFd));
  ScopeExit undo([&] { (void)egress.deleteLink(link.hostIfName); });
  MOAT_TRY(egress.addAddress(link.hostIfName, link.gateway, kPrefixLen));
  MOAT_TRY(egress.setLinkUp(link.hostIfName));
  MOAT_ASSIGN(os::Netlink environment, os::Netlink::open(envNetnsFd));
  MOAT_TRY(environment.addAddress(kEnvironmentIfName, link.address, kPrefixLen));
  MOAT_TRY(environment.setLinkUp(kEnvironmentIfName));
  MOAT_TRY(environment.addDefaultRoute(link.gateway, kEnvironmentIfName));
  // Other environments' addresses are refused at once instead of timing out
  // (the egress namespace forwards nothing); the gateway's /30 stays reachable.
  MOAT_TRY(environment.addUnreachableRoute(htonl(kNetwork), kNetworkPrefixLen));
  undo.dismiss();
  return link;
}

Status EgressNetwork::detach(uint32_t slot) const {
  MOAT_TRY(checkSlot(slot));
  MOAT_ASSIGN(os::Netlink egress, os::Netlink::open(fd_.get()));
  return egress.deleteLink(linkFor(slot).hostIfName);
}

Result<os::LinkCounters> EgressNetwork::counters(uint32_t slot) const {
  MOAT_TRY(checkSlot(slot));
  std::lock_guard<std::mutex> lock(countersMutex_);
  if (!countersSocket_) {
    MOAT_ASSIGN(os::Netlink opened, os::Netlink::open(fd_.get()));
    countersSocket_.emplace(std::move(opened));
  }
  auto read = countersSocket_->linkCounters(linkFor(slot).hostIfName);
  if (!read.ok() && read.error().sysErrno != ENODEV) countersSocket_.reset();
  MOAT_ASSIGN(os::LinkCounters host, std::move(read));
  // The egress end receives what the environment sends.
  return os::LinkCounters{.receivedBytes = host.sentBytes, .sentBytes = host.receivedBytes};
}

Result<std::vector<uint32_t>> EgressNetwork::linkedSlots() const {
  MOAT_ASSIGN(os::Netlink egress, os::Netlink::open(fd_.get()));
  MOAT_ASSIGN(auto names, egress.linkNames());
  std::vector<uint32_t> slots;
  for (const auto& name : names) {
    if (name.size() < 3 || name.compare(0, 2, "mx") != 0 ||
        name.find_first_not_of("0123456789abcdef", 2) != std::string::npos || name.size() > 2 + 8) {
      continue;
    }
    uint32_t slot = static_cast<uint32_t>(std::stoul(name.substr(2), nullptr, 16));
    if (slot < kSlotCount && linkFor(slot).hostIfName == name) slots.push_back(slot);
  }
  return slots;
}

Status EgressNetwork::remove() {
  {
    std::lock_guard<std::mutex> lock(countersMutex_);
    countersSocket_.reset();  // it would hold the namespace
  }
  Status unmounted = os::unmount(path_, MNT_DETACH);
  if (!unmounted.ok() && unmounted.error().sysErrno != EINVAL) return unmounted;  // EINVAL: not mounted
  return os::removeTree(path_);
}

}  // namespace moat::egress
