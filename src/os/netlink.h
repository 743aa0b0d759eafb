#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

// Network namespaces and rtnetlink: the primitives behind egress (veth
// pairs, addresses, routes, per-namespace sysctls and listeners). IPv4
// addresses are uint32_t in network byte order throughout.
namespace moat::os {

// Whether this kernel makes veth pairs: one made and dropped in a network
// namespace of a child's own (root; the namespace goes with the child).
// The error says why not (the kernel's errno for the creation).
Status vethPairsWork();

// What a link has carried since it was made, as the kernel counts it.
struct LinkCounters {
  uint64_t receivedBytes = 0;
  uint64_t sentBytes = 0;
  LinkCounters& operator+=(const LinkCounters& more) {
    receivedBytes += more.receivedBytes;
    sentBytes += more.sentBytes;
    return *this;
  }
};

// The counters in an IFLA_STATS64 attribute of `length` bytes (a struct
// rtnl_link_stats64 of the sending kernel's size); none when it is too
// short to hold the byte counts.
std::optional<LinkCounters> linkCountersIn(const void* stats64, size_t length);

// An rtnetlink (NETLINK_ROUTE) socket. It acts on the network namespace it
// was opened in for its whole life, whichever namespace the calling thread
// is in later. Every request asks for an ACK; a kernel error becomes
// Error::fromErrno with the operation and interface as context.
class Netlink {
 public:
  // netnsFd < 0: the calling thread's network namespace.
  static Result<Netlink> open(int netnsFd = -1);

  // A veth pair: `name` in this socket's namespace, `peerName` in the
  // namespace behind peerNetnsFd. Both ends start down.
  Status createVethPair(const std::string& name, const std::string& peerName, int peerNetnsFd);
  Status addAddress(const std::string& ifName, uint32_t address, uint8_t prefixLen);
  Status setLinkUp(const std::string& ifName);
  // default via `gateway` dev ifName (created or replaced).
  Status addDefaultRoute(uint32_t gateway, const std::string& ifName);
  // "unreachable network/prefixLen": connects there fail at once (EHOSTUNREACH).
  Status addUnreachableRoute(uint32_t network, uint8_t prefixLen);
  // "local 0.0.0.0/0 dev lo table local": every IPv4 destination is local.
  Status addAnyIpLocalRoute();
  // "throw network/prefixLen table local": the local-table lookup gives up
  // for these destinations and the main table decides (see EgressNetwork).
  Status addLocalThrowRoute(uint32_t network, uint8_t prefixLen);
  // Deleting one end of a veth deletes the pair. ENODEV when there is none.
  Status deleteLink(const std::string& name);
  Result<int> linkIndex(const std::string& name);
  // The names of every link in this socket's namespace (a dump).
  Result<std::vector<std::string>> linkNames();
  // The bytes the link `name` has received and sent (its IFLA_STATS64).
  // ENODEV when there is none.
  Result<LinkCounters> linkCounters(const std::string& name);
  // The type of the route this namespace takes to `destination` (RTM_GETROUTE):
  // RTN_LOCAL when the address is one of its own, RTN_UNICAST, ...
  Result<uint8_t> routeType(uint32_t destination);

 private:
  explicit Netlink(UniqueFd fd) : fd_(std::move(fd)) {}
  // Sends one request (its nlmsg_seq is set here) and waits for its ACK.
  // `onReply` sees each non-ACK reply message (for RTM_GET*).
  Status transact(void* request, const std::string& what, const std::function<void(const void* message)>& onReply = {});

  // A route of `type` (throw, unreachable) for network/prefixLen in `table`.
  Status addNetworkRoute(uint8_t type, uint8_t table, uint32_t network, uint8_t prefixLen, const std::string& what);

  UniqueFd fd_;
  uint32_t sequence_ = 0;
};

// Runs fn with the calling thread inside the network namespace netnsFd and
// always brings it back (setns(CLONE_NEWNET) is per thread, so other
// threads are unaffected). Sockets fn creates stay in that namespace.
Status inNetworkNamespace(int netnsFd, const std::function<Status()>& fn);

// A new, empty network namespace (only a down loopback). Safe to call from
// a multi-threaded process: only the calling thread moves, and it moves
// back before this returns.
Result<UniqueFd> newNetworkNamespace();

// Opens a file that must be a network namespace (an nsfs bind mount such as
// /run/netns/x or /proc/<pid>/ns/net). Error code "not_netns" when it exists
// but is something else.
Result<UniqueFd> openNetworkNamespace(const std::string& path);

// "dev:inode" of a namespace file: which namespace it is, unique while the
// namespace lives.
Result<std::string> namespaceIdentity(int nsFd);

// Writes sysctls under /proc/sys/net inside netnsFd (those files belong to
// the namespace of the thread that opens them). Keys are relative paths
// such as "ipv4/conf/all/rp_filter".
Status writeNetSysctls(int netnsFd, const std::vector<std::pair<std::string, std::string>>& values);

// "100.64.0.22" for an address in network byte order.
std::string ipv4ToString(uint32_t address);

// A TCP listener (SO_REUSEADDR, backlog 512) or a bound UDP socket on
// addr:port inside netnsFd (< 0: the caller's). Close-on-exec, blocking.
Result<UniqueFd> openTcpListener(int netnsFd, uint32_t addr, uint16_t port);
Result<UniqueFd> openUdpSocket(int netnsFd, uint32_t addr, uint16_t port);

// A TCP connection to 127.0.0.1:port inside the network namespace netnsFd:
// the calling thread enters it only to make the socket (a socket stays in
// the namespace it was made in), and connects from its own, within
// `timeout`. Non-blocking, close-on-exec. Error code "refused" when nothing
// listens there, "timeout" when no answer came in time.
// `address` (host byte order) is another of the namespace's loopback
// addresses (127.0.0.2, say).
Result<UniqueFd> connectLoopbackIn(int netnsFd, uint16_t port, std::chrono::milliseconds timeout,
                                   uint32_t address = 0x7f000001);

}  // namespace moat::os
