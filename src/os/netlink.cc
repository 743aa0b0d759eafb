#include "os/netlink.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/magic.h>
#include <linux/netlink.h>
#include <linux/nsfs.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "common/scope_exit.h"
#include "os/file.h"
#include "os/process.h"

namespace moat::os {
namespace {

constexpr char kThreadNetns[] = "/proc/thread-self/ns/net";

// One rtnetlink request: the header, the family struct, then attributes,
// some nested. Requests here are small and bounded (names are checked
// against IFNAMSIZ first), so running out of room is a programming error.
class Request {
 public:
  Request(uint16_t type, uint16_t flags) {
    header()->nlmsg_len = NLMSG_LENGTH(0);
    header()->nlmsg_type = type;
    header()->nlmsg_flags = static_cast<uint16_t>(flags | NLM_F_REQUEST | NLM_F_ACK);
  }

  nlmsghdr* header() { return reinterpret_cast<nlmsghdr*>(buffer_); }

  // The family struct (ifinfomsg, ifaddrmsg, rtmsg) right after the header.
  template <class T>
  T* body() {
    return static_cast<T*>(reserve(sizeof(T)));
  }

  void addAttr(uint16_t type, const void* data, size_t length) {
    auto* attr = static_cast<rtattr*>(reserve(RTA_LENGTH(length)));
    attr->rta_type = type;
    attr->rta_len = static_cast<uint16_t>(RTA_LENGTH(length));
    std::memcpy(RTA_DATA(attr), data, length);
  }
  void addU32(uint16_t type, uint32_t value) { addAttr(type, &value, sizeof value); }
  void addString(uint16_t type, const std::string& value) { addAttr(type, value.c_str(), value.size() + 1); }

  // Returns the nest's offset, for endNested once its contents are added.
  size_t beginNested(uint16_t type) {
    size_t offset = header()->nlmsg_len;
    auto* attr = static_cast<rtattr*>(reserve(RTA_LENGTH(0)));
    attr->rta_type = type;
    return offset;
  }
  void endNested(size_t offset) {
    auto* attr = reinterpret_cast<rtattr*>(buffer_ + offset);
    attr->rta_len = static_cast<uint16_t>(header()->nlmsg_len - offset);
  }

 private:
  void* reserve(size_t length) {
    size_t offset = NLMSG_ALIGN(header()->nlmsg_len);
    size_t end = offset + NLMSG_ALIGN(length);
    if (end > sizeof buffer_) {
      std::fprintf(stderr, "moat: netlink request overflow\n");
      std::abort();
    }
    header()->nlmsg_len = static_cast<uint32_t>(end);
    return buffer_ + offset;
  }

  alignas(nlmsghdr) char buffer_[512] = {};
};

Status checkIfName(const std::string& name) {
  if (name.empty() || name.size() >= IFNAMSIZ) {
    return Error::make(Code::kInvalidArgument, "interface name '" + name + "'");
  }
  return {};
}

// Calls fn(type, data, length) for each attribute of a link message
// (RTM_NEWLINK), after its ifinfomsg; stops at the first malformed one.
template <class Fn>
void forEachLinkAttribute(const nlmsghdr* reply, Fn fn) {
  const char* base = reinterpret_cast<const char*>(reply);
  size_t offset = NLMSG_LENGTH(NLMSG_ALIGN(sizeof(ifinfomsg)));
  while (offset + RTA_LENGTH(0) <= reply->nlmsg_len) {
    const auto* attr = reinterpret_cast<const rtattr*>(base + offset);
    if (attr->rta_len < RTA_LENGTH(0) || offset + attr->rta_len > reply->nlmsg_len) break;
    fn(attr->rta_type, base + offset + RTA_LENGTH(0), static_cast<size_t>(attr->rta_len - RTA_LENGTH(0)));
    offset += RTA_ALIGN(attr->rta_len);
  }
}

// The kernel's extended-ACK text ("Invalid prefix for given prefix
// length"), when it sent one.
std::string extendedAckMessage(const nlmsghdr* header) {
  if (!(header->nlmsg_flags & NLM_F_ACK_TLVS)) return "";
  const auto* err = static_cast<const nlmsgerr*>(NLMSG_DATA(header));
  size_t offset = NLMSG_HDRLEN + sizeof(nlmsgerr);
  if (!(header->nlmsg_flags & NLM_F_CAPPED)) offset += err->msg.nlmsg_len - NLMSG_HDRLEN;
  const char* base = reinterpret_cast<const char*>(header);
  while (offset + NLA_HDRLEN <= header->nlmsg_len) {
    const auto* attr = reinterpret_cast<const nlattr*>(base + offset);
    if (attr->nla_len < NLA_HDRLEN || offset + attr->nla_len > header->nlmsg_len) break;
    if (attr->nla_type == NLMSGERR_ATTR_MSG) {
      return std::string(base + offset + NLA_HDRLEN, strnlen(base + offset + NLA_HDRLEN, attr->nla_len - NLA_HDRLEN));
    }
    offset += NLA_ALIGN(attr->nla_len);
  }
  return "";
}

// Brings the calling thread back to `original`. A thread left in another
// network namespace would open every later socket there: not recoverable.
void returnToNamespace(int original) {
  if (::setns(original, CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "moat: cannot return to the original network namespace: %s\n", std::strerror(errno));
    std::abort();
  }
}

Result<UniqueFd> openInetSocket(int type, uint32_t addr, uint16_t port) {
  std::string what =
      std::string(type == SOCK_STREAM ? "tcp " : "udp ") + ipv4ToString(addr) + ":" + std::to_string(port);
  UniqueFd fd(::socket(AF_INET, type | SOCK_CLOEXEC, 0));
  if (!fd) return Error::fromErrno("socket for " + what);
  int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) {
    return Error::fromErrno("SO_REUSEADDR on " + what);
  }
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = addr;
  sin.sin_port = htons(port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0) {
    return Error::fromErrno("bind " + what);
  }
  if (type == SOCK_STREAM && ::listen(fd.get(), 512) != 0) return Error::fromErrno("listen " + what);
  return fd;
}

Result<UniqueFd> openInetSocketIn(int netnsFd, int type, uint32_t addr, uint16_t port) {
  if (netnsFd < 0) return openInetSocket(type, addr, port);
  UniqueFd socket;
  MOAT_TRY(inNetworkNamespace(netnsFd, [&]() -> Status {
    MOAT_ASSIGN(socket, openInetSocket(type, addr, port));
    return {};
  }));
  return socket;
}

}  // namespace

std::string ipv4ToString(uint32_t address) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address, text, sizeof text);
  return text;
}

Result<Netlink> Netlink::open(int netnsFd) {
  UniqueFd fd;
  auto openSocket = [&]() -> Status {
    fd.reset(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
    if (!fd) return Error::fromErrno("socket NETLINK_ROUTE");
    return {};
  };
  MOAT_TRY(netnsFd < 0 ? openSocket() : inNetworkNamespace(netnsFd, openSocket));
  int one = 1;
  // Error text from the kernel, and ACKs without a copy of the request.
  // Both are optional: an old kernel just gives less detail.
  ::setsockopt(fd.get(), SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof one);
  ::setsockopt(fd.get(), SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof one);
  sockaddr_nl local{};
  local.nl_family = AF_NETLINK;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
    return Error::fromErrno("bind NETLINK_ROUTE");
  }
  return Netlink(std::move(fd));
}

Status Netlink::transact(void* request, const std::string& what,
                         const std::function<void(const void* message)>& onReply) {
  auto* header = static_cast<nlmsghdr*>(request);
  header->nlmsg_seq = ++sequence_;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ssize_t sent;
  do {
    sent = ::sendto(fd_.get(), header, header->nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return Error::fromErrno("netlink send for " + what);

  alignas(nlmsghdr) static thread_local char buffer[32768];
  for (;;) {
    ssize_t received = ::recv(fd_.get(), buffer, sizeof buffer, 0);
    if (received < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno("netlink receive for " + what);
    }
    size_t remaining = static_cast<size_t>(received);
    for (auto* reply = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(reply, remaining);
         reply = NLMSG_NEXT(reply, remaining)) {
      if (reply->nlmsg_seq != header->nlmsg_seq) continue;  // left over from an earlier request
      if (reply->nlmsg_type == NLMSG_ERROR) {
        const auto* err = static_cast<const nlmsgerr*>(NLMSG_DATA(reply));
        if (err->error == 0) return {};
        std::string detail = extendedAckMessage(reply);
        return Error::fromErrno(detail.empty() ? what : what + " (" + detail + ")", -err->error);
      }
      if (reply->nlmsg_type == NLMSG_DONE && (header->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP) {
        // The end of a dump (its payload: 0 or a negative errno).
        int error = 0;
        if (reply->nlmsg_len >= NLMSG_LENGTH(sizeof error)) std::memcpy(&error, NLMSG_DATA(reply), sizeof error);
        if (error < 0) return Error::fromErrno(what, -error);
        return {};
      }
      if (reply->nlmsg_type != NLMSG_DONE && onReply) onReply(reply);
    }
  }
}

Status vethPairsWork() {
  return runInChild([]() -> Status {
    if (::unshare(CLONE_NEWNET) != 0) return Error::fromErrno("a network namespace");
    MOAT_ASSIGN(Netlink self, Netlink::open(-1));
    UniqueFd ns(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!ns.valid()) return Error::fromErrno("open /proc/self/ns/net");
    return self.createVethPair("moatprobe0", "moatprobe1", ns.get());
  });
}

Status Netlink::createVethPair(const std::string& name, const std::string& peerName, int peerNetnsFd) {
  MOAT_TRY(checkIfName(name));
  MOAT_TRY(checkIfName(peerName));
  Request request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
  request.body<ifinfomsg>()->ifi_family = AF_UNSPEC;
  request.addString(IFLA_IFNAME, name);
  size_t linkInfo = request.beginNested(IFLA_LINKINFO);
  request.addString(IFLA_INFO_KIND, "veth");
  size_t infoData = request.beginNested(IFLA_INFO_DATA);
  size_t peer = request.beginNested(VETH_INFO_PEER);
  request.body<ifinfomsg>()->ifi_family = AF_UNSPEC;
  request.addString(IFLA_IFNAME, peerName);
  request.addU32(IFLA_NET_NS_FD, static_cast<uint32_t>(peerNetnsFd));
  request.endNested(peer);
  request.endNested(infoData);
  request.endNested(linkInfo);
  return transact(request.header(), "create veth " + name + " (peer " + peerName + ")");
}

Result<int> Netlink::linkIndex(const std::string& name) {
  MOAT_TRY(checkIfName(name));
  Request request(RTM_GETLINK, 0);
  request.body<ifinfomsg>()->ifi_family = AF_UNSPEC;
  request.addString(IFLA_IFNAME, name);
  request.addU32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
  int index = 0;
  MOAT_TRY(transact(request.header(), "find link " + name, [&](const void* message) {
    const auto* reply = static_cast<const nlmsghdr*>(message);
    if (reply->nlmsg_type != RTM_NEWLINK) return;
    index = static_cast<const ifinfomsg*>(NLMSG_DATA(reply))->ifi_index;
  }));
  if (index <= 0) return Error::fromErrno("find link " + name, ENODEV);
  return index;
}

Result<std::vector<std::string>> Netlink::linkNames() {
  Request request(RTM_GETLINK, NLM_F_DUMP);
  request.body<ifinfomsg>()->ifi_family = AF_UNSPEC;
  request.addU32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
  std::vector<std::string> names;
  MOAT_TRY(transact(request.header(), "list links", [&](const void* message) {
    const auto* reply = static_cast<const nlmsghdr*>(message);
    if (reply->nlmsg_type != RTM_NEWLINK) return;
    forEachLinkAttribute(reply, [&](uint16_t type, const char* data, size_t length) {
      if (type == IFLA_IFNAME) names.emplace_back(data, strnlen(data, length));
    });
  }));
  return names;
}

std::optional<LinkCounters> linkCountersIn(const void* stats64, size_t length) {
  // The struct grew over time (rx_otherhost_dropped in 5.19): the kernel
  // sends its own size, older ones less than these headers' struct.
  if (length < offsetof(rtnl_link_stats64, tx_bytes) + sizeof(uint64_t)) return std::nullopt;
  rtnl_link_stats64 stats{};
  std::memcpy(&stats, stats64, std::min(length, sizeof stats));
  return LinkCounters{.receivedBytes = stats.rx_bytes, .sentBytes = stats.tx_bytes};
}

Result<LinkCounters> Netlink::linkCounters(const std::string& name) {
  MOAT_TRY(checkIfName(name));
  Request request(RTM_GETLINK, 0);
  request.body<ifinfomsg>()->ifi_family = AF_UNSPEC;
  request.addString(IFLA_IFNAME, name);
  std::optional<LinkCounters> counters;
  MOAT_TRY(transact(request.header(), "read the counters of link " + name, [&](const void* message) {
    const auto* reply = static_cast<const nlmsghdr*>(message);
    if (reply->nlmsg_type != RTM_NEWLINK) return;
    forEachLinkAttribute(reply, [&](uint16_t type, const char* data, size_t length) {
      if (type == IFLA_STATS64) counters = linkCountersIn(data, length);
    });
  }));
  if (!counters) return Error::make(Code::kUnsupported, "the kernel gave no counters for link " + name);
  return *counters;
}

Result<uint8_t> Netlink::routeType(uint32_t destination) {
  Request request(RTM_GETROUTE, 0);
  auto* rtm = request.body<rtmsg>();
  rtm->rtm_family = AF_INET;
  rtm->rtm_dst_len = 32;
  request.addAttr(RTA_DST, &destination, sizeof destination);
  int type = -1;
  MOAT_TRY(transact(request.header(), "route to " + ipv4ToString(destination), [&](const void* message) {
    const auto* reply = static_cast<const nlmsghdr*>(message);
    if (reply->nlmsg_type == RTM_NEWROUTE) type = static_cast<const rtmsg*>(NLMSG_DATA(reply))->rtm_type;
  }));
  if (type < 0) return Error::make(Code::kNotFound, "no route to " + ipv4ToString(destination));
  return static_cast<uint8_t>(type);
}

Status Netlink::addAddress(const std::string& ifName, uint32_t address, uint8_t prefixLen) {
  std::string what = "add address " + ipv4ToString(address) + "/" + std::to_string(prefixLen) + " to " + ifName;
  MOAT_ASSIGN(int index, linkIndex(ifName));
  Request request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE);
  auto* ifa = request.body<ifaddrmsg>();
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = prefixLen;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = static_cast<uint32_t>(index);
  request.addAttr(IFA_LOCAL, &address, sizeof address);
  request.addAttr(IFA_ADDRESS, &address, sizeof address);
  return transact(request.header(), what);
}

Status Netlink::setLinkUp(const std::string& ifName) {
  MOAT_TRY(checkIfName(ifName));
  Request request(RTM_NEWLINK, 0);
  auto* ifi = request.body<ifinfomsg>();
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  request.addString(IFLA_IFNAME, ifName);
  return transact(request.header(), "set link " + ifName + " up");
}

Status Netlink::addDefaultRoute(uint32_t gateway, const std::string& ifName) {
  std::string what = "add default route via " + ipv4ToString(gateway) + " dev " + ifName;
  MOAT_ASSIGN(int index, linkIndex(ifName));
  Request request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE);
  auto* rtm = request.body<rtmsg>();
  rtm->rtm_family = AF_INET;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_BOOT;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = RTN_UNICAST;
  request.addAttr(RTA_GATEWAY, &gateway, sizeof gateway);
  request.addU32(RTA_OIF, static_cast<uint32_t>(index));
  return transact(request.header(), what);
}

Status Netlink::addAnyIpLocalRoute() {
  MOAT_ASSIGN(int loopback, linkIndex("lo"));
  Request request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE);
  auto* rtm = request.body<rtmsg>();
  rtm->rtm_family = AF_INET;
  rtm->rtm_dst_len = 0;
  rtm->rtm_table = RT_TABLE_LOCAL;
  rtm->rtm_protocol = RTPROT_BOOT;
  rtm->rtm_scope = RT_SCOPE_HOST;
  rtm->rtm_type = RTN_LOCAL;
  request.addU32(RTA_OIF, static_cast<uint32_t>(loopback));
  return transact(request.header(), "add route local 0.0.0.0/0 dev lo table local");
}

Status Netlink::addNetworkRoute(uint8_t type, uint8_t table, uint32_t network, uint8_t prefixLen,
                                const std::string& what) {
  Request request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE);
  auto* rtm = request.body<rtmsg>();
  rtm->rtm_family = AF_INET;
  rtm->rtm_dst_len = prefixLen;
  rtm->rtm_table = table;
  rtm->rtm_protocol = RTPROT_BOOT;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = type;
  request.addAttr(RTA_DST, &network, sizeof network);
  return transact(request.header(), "add route " + what + " " + ipv4ToString(network) + "/" +
                                        std::to_string(prefixLen) + (table == RT_TABLE_LOCAL ? " table local" : ""));
}

Status Netlink::addLocalThrowRoute(uint32_t network, uint8_t prefixLen) {
  return addNetworkRoute(RTN_THROW, RT_TABLE_LOCAL, network, prefixLen, "throw");
}

Status Netlink::addUnreachableRoute(uint32_t network, uint8_t prefixLen) {
  return addNetworkRoute(RTN_UNREACHABLE, RT_TABLE_MAIN, network, prefixLen, "unreachable");
}

Status Netlink::deleteLink(const std::string& name) {
  MOAT_TRY(checkIfName(name));
  Request request(RTM_DELLINK, 0);
  request.body<ifinfomsg>()->ifi_family = AF_UNSPEC;
  request.addString(IFLA_IFNAME, name);
  return transact(request.header(), "delete link " + name);
}

Status inNetworkNamespace(int netnsFd, const std::function<Status()>& fn) {
  MOAT_ASSIGN(UniqueFd original, open(kThreadNetns, O_RDONLY));
  if (::setns(netnsFd, CLONE_NEWNET) != 0) return Error::fromErrno("setns network namespace");
  ScopeExit back([&] { returnToNamespace(original.get()); });
  return fn();
}

Result<UniqueFd> newNetworkNamespace() {
  // unshare moves only the calling thread (CLONE_NEWNET has no
  // single-threaded requirement); the fd keeps the namespace alive once the
  // thread has gone back.
  MOAT_ASSIGN(UniqueFd original, open(kThreadNetns, O_RDONLY));
  if (::unshare(CLONE_NEWNET) != 0) return Error::fromErrno("unshare network namespace");
  ScopeExit back([&] { returnToNamespace(original.get()); });
  return open(kThreadNetns, O_RDONLY);
}

Result<UniqueFd> openNetworkNamespace(const std::string& path) {
  MOAT_ASSIGN(UniqueFd fd, open(path, O_RDONLY));
  struct statfs sfs;
  if (::fstatfs(fd.get(), &sfs) != 0) return Error::fromErrno("fstatfs " + path);
  if (sfs.f_type != static_cast<decltype(sfs.f_type)>(NSFS_MAGIC)) {
    return Error::make(Code::kNotNetns, path + " is not a namespace file");
  }
  int type = ::ioctl(fd.get(), NS_GET_NSTYPE);
  if (type < 0) return Error::fromErrno("NS_GET_NSTYPE " + path);
  if (type != CLONE_NEWNET) return Error::make(Code::kNotNetns, path + " is not a network namespace");
  return fd;
}

Result<std::string> namespaceIdentity(int nsFd) {
  struct stat st;
  if (::fstat(nsFd, &st) != 0) return Error::fromErrno("fstat namespace");
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

Status writeNetSysctls(int netnsFd, const std::vector<std::pair<std::string, std::string>>& values) {
  auto write = [&]() -> Status {
    for (const auto& [key, value] : values) {
      MOAT_TRY(writeExisting("/proc/sys/net/" + key, value));
    }
    return {};
  };
  return netnsFd < 0 ? write() : inNetworkNamespace(netnsFd, write);
}

Result<UniqueFd> openTcpListener(int netnsFd, uint32_t addr, uint16_t port) {
  return openInetSocketIn(netnsFd, SOCK_STREAM, addr, port);
}

Result<UniqueFd> openUdpSocket(int netnsFd, uint32_t addr, uint16_t port) {
  return openInetSocketIn(netnsFd, SOCK_DGRAM, addr, port);
}

Result<UniqueFd> connectLoopbackIn(int netnsFd, uint16_t port, std::chrono::milliseconds timeout, uint32_t address) {
  const std::string what = ipv4ToString(htonl(address)) + ":" + std::to_string(port) + " in the environment's network";
  UniqueFd fd;
  MOAT_TRY(inNetworkNamespace(netnsFd, [&]() -> Status {
    fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) return Error::fromErrno("socket for " + what);
    return {};
  }));
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(address);
  sin.sin_port = htons(port);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sin), sizeof sin) == 0) return fd;
  if (errno == ECONNREFUSED) return Error::make(Code::kRefused, "nothing listens on " + what);
  if (errno != EINPROGRESS) return Error::fromErrno("connect to " + what);
  pollfd p{fd.get(), POLLOUT, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) return Error::fromErrno("poll connect to " + what);
  if (ready == 0)
    return Error::make(Code::kTimeout, "no answer from " + what + " within " + std::to_string(timeout.count()) + " ms");
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return Error::fromErrno("SO_ERROR " + what);
  if (err == ECONNREFUSED) return Error::make(Code::kRefused, "nothing listens on " + what);
  if (err != 0) return Error::fromErrno("connect to " + what, err);
  return fd;
}

}  // namespace moat::os
