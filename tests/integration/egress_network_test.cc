// The egress network namespace on the real kernel: an environment's veth
// reaches moatd's listeners (any destination address, original destination
// visible), every other port is refused, nothing else is reachable, and the
// namespace persists across a reopen until remove().
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip_icmp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "egress/network.h"
#include "moat_process.h"
#include "os/file.h"
#include "os/mount.h"
#include "os/netlink.h"

namespace moat::test {
namespace {

using egress::EgressNetwork;
using Clock = std::chrono::steady_clock;

uint32_t ipv4(const char* text) {
  in_addr a{};
  ::inet_pton(AF_INET, text, &a);
  return a.s_addr;
}

// Runs fn on a thread that has setns'd into netnsFd: the environment's view.
template <class T>
T inNamespaceThread(int netnsFd, const std::function<T()>& fn) {
  T result{};
  std::thread thread([&] {
    if (::setns(netnsFd, CLONE_NEWNET) != 0) {
      ADD_FAILURE() << "setns: " << std::strerror(errno);
      return;
    }
    result = fn();
  });
  thread.join();
  return result;
}

struct Outcome {
  int error = 0;  // errno of connect, 0 on success
  double ms = 0;
  std::string received;
};

// TCP connect to addr:port from the current thread; on success sends
// "ping" and reads the answer.
Outcome connectTcp(const char* addr, uint16_t port, const char* fromAddr = nullptr, int timeoutMs = 2000) {
  Outcome out;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval timeout{timeoutMs / 1000, (timeoutMs % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (fromAddr) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = ipv4(fromAddr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
      out.error = errno;
      ::close(fd);
      return out;
    }
  }
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = ipv4(addr);
  sin.sin_port = htons(port);
  auto start = Clock::now();
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin);
  out.error = rc == 0 ? 0 : errno;
  out.ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (rc == 0 && ::send(fd, "ping", 4, MSG_NOSIGNAL) == 4) {
    char buf[16];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) out.received.assign(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

bool readable(int fd, int timeoutMs) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeoutMs) == 1;
}

// Sends "query" to addr:port from the current thread, from fromAddr if set.
int sendUdp(const char* fromAddr, const char* addr, uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fromAddr) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = ipv4(fromAddr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = ipv4(addr);
  to.sin_port = htons(port);
  int n = static_cast<int>(::sendto(fd, "query", 5, 0, reinterpret_cast<sockaddr*>(&to), sizeof to));
  ::close(fd);
  return n;
}

// One ICMP echo request from the current thread; true if a reply comes
// within 300 ms.
bool pingAnswered(const char* addr) {
  int fd = ::socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP);
  icmphdr echo{};
  echo.type = ICMP_ECHO;
  echo.un.echo.id = htons(0x4d54);
  echo.checksum = htons(static_cast<uint16_t>(~((ICMP_ECHO << 8) + 0x4d54)));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = ipv4(addr);
  ::sendto(fd, &echo, sizeof echo, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  bool reply = false;
  char buf[256];
  while (!reply && readable(fd, 300)) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    // An IP header (20 bytes, no options), then the ICMP message.
    if (n >= 28 && static_cast<unsigned char>(buf[20]) == ICMP_ECHOREPLY) reply = true;
  }
  ::close(fd);
  return reply;
}

std::set<std::string> interfaceNames() {
  std::set<std::string> names;
  if (struct if_nameindex* list = ::if_nameindex()) {
    for (auto* i = list; i->if_index != 0; ++i) names.insert(i->if_name);
    ::if_freenameindex(list);
  }
  return names;
}

ino_t inodeOf(int fd) {
  struct stat st {};
  ::fstat(fd, &st);
  return st.st_ino;
}

bool mounted(const std::string& path) {
  auto mountinfo = os::readFile("/proc/self/mountinfo", 1 << 22);
  return mountinfo.ok() && mountinfo->find(" " + path + " ") != std::string::npos;
}

// An environment's namespace: new, loopback up (as the spawner leaves it).
UniqueFd newEnvironmentNamespace() {
  auto netns = os::newNetworkNamespace();
  EXPECT_TRUE(netns.ok()) << netns.error().message();
  if (!netns.ok()) return {};
  auto netlink = os::Netlink::open(netns->get());
  EXPECT_TRUE(netlink.ok()) << netlink.error().message();
  if (netlink.ok()) {
    Status up = netlink->setLinkUp("lo");
    EXPECT_TRUE(up.ok()) << up.error().message();
  }
  return std::move(netns.value());
}

class EgressNetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!isRoot()) GTEST_SKIP() << "needs root: creates network namespaces, veths and mounts";
    char tmpl[] = "/tmp/moat-egress-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    stateDir_ = tmpl;
    hostInterfaces_ = interfaceNames();
  }
  void TearDown() override {
    if (stateDir_.empty()) return;
    // Nothing of the egress side ever shows up in the host namespace.
    EXPECT_EQ(interfaceNames(), hostInterfaces_);
    std::string path = stateDir_ + "/run/egress.netns";
    while (mounted(path) && os::unmount(path, MNT_DETACH).ok()) {
    }
    (void)os::removeTree(stateDir_);
  }

  std::unique_ptr<EgressNetwork> open() {
    auto egress = EgressNetwork::openOrCreate(stateDir_);
    EXPECT_TRUE(egress.ok()) << egress.error().message();
    return egress.ok() ? std::move(egress.value()) : nullptr;
  }

  std::string stateDir_;
  std::set<std::string> hostInterfaces_;
};

TEST(EgressNetworkAddressing, SlotsMapToSlash30s) {
  auto link = EgressNetwork::linkFor(5);
  EXPECT_EQ(egress::dottedQuad(link.gateway), "100.64.0.21");
  EXPECT_EQ(egress::dottedQuad(link.address), "100.64.0.22");
  EXPECT_EQ(link.hostIfName, "mx5");
  auto last = EgressNetwork::linkFor(EgressNetwork::kSlotCount - 1);
  EXPECT_EQ(egress::dottedQuad(last.address), "100.127.255.254");
  EXPECT_EQ(last.hostIfName, "mxfffff");
  EXPECT_LT(last.hostIfName.size(), size_t{IFNAMSIZ});
  for (uint32_t slot : {0u, 5u, 255u, 0x12345u, EgressNetwork::kSlotCount - 1}) {
    auto back = EgressNetwork::slotOf(EgressNetwork::linkFor(slot).address);
    ASSERT_TRUE(back.ok()) << slot;
    EXPECT_EQ(*back, slot);
  }
  for (const char* other : {"100.64.0.21", "100.64.0.23", "100.128.0.2", "10.0.0.2", "0.0.0.0"}) {
    EXPECT_FALSE(EgressNetwork::slotOf(ipv4(other)).ok()) << other;
  }
}

TEST_F(EgressNetworkTest, AnEnvironmentReachesOnlyTheListeners) {
  auto egress = open();
  ASSERT_TRUE(egress);
  auto https = egress->listenTcp(443);
  ASSERT_TRUE(https.ok()) << https.error().message();
  auto dns = egress->bindUdp(53);
  ASSERT_TRUE(dns.ok()) << dns.error().message();
  int on = 1;
  ASSERT_EQ(::setsockopt(dns->get(), IPPROTO_IP, IP_PKTINFO, &on, sizeof on), 0);

  UniqueFd env = newEnvironmentNamespace();
  ASSERT_TRUE(env);
  auto link = egress->attach(env.get(), 5);
  ASSERT_TRUE(link.ok()) << link.error().message();
  EXPECT_EQ(egress::dottedQuad(link->address), "100.64.0.22");
  EXPECT_EQ(link->hostIfName, "mx5");
  EXPECT_EQ(::if_nametoindex("mx5"), 0u) << "the host end must live in the egress namespace";

  // Any destination address on a listened port reaches the listener, which
  // sees the original destination and the environment's address; the
  // answer makes it back.
  std::thread server([&] {
    if (!readable(https->get(), 3000)) return;
    sockaddr_in local{}, peer{};
    socklen_t length = sizeof peer;
    int conn = ::accept4(https->get(), reinterpret_cast<sockaddr*>(&peer), &length, SOCK_CLOEXEC);
    if (conn < 0) return;
    length = sizeof local;
    ::getsockname(conn, reinterpret_cast<sockaddr*>(&local), &length);
    EXPECT_EQ(egress::dottedQuad(local.sin_addr.s_addr), "203.0.113.7");
    EXPECT_EQ(ntohs(local.sin_port), 443);
    EXPECT_EQ(egress::dottedQuad(peer.sin_addr.s_addr), "100.64.0.22");
    auto slot = EgressNetwork::slotOf(peer.sin_addr.s_addr);
    EXPECT_TRUE(slot.ok() && *slot == 5u);
    char buf[8];
    if (::recv(conn, buf, sizeof buf, 0) == 4) ::send(conn, "pong", 4, MSG_NOSIGNAL);
    ::close(conn);
  });
  Outcome reached = inNamespaceThread<Outcome>(env.get(), [] { return connectTcp("203.0.113.7", 443); });
  server.join();
  EXPECT_EQ(reached.error, 0) << std::strerror(reached.error);
  EXPECT_EQ(reached.received, "pong");

  // Any other port: a RST, at once.
  Outcome refused = inNamespaceThread<Outcome>(env.get(), [] { return connectTcp("203.0.113.7", 8080); });
  EXPECT_EQ(refused.error, ECONNREFUSED) << std::strerror(refused.error);
  std::printf("[ timing ] refused connect to :8080 took %.3f ms\n", refused.ms);

  // DNS: the datagram arrives with its original destination (IP_PKTINFO).
  int sent = inNamespaceThread<int>(env.get(), [] { return sendUdp(nullptr, "8.8.8.8", 53); });
  EXPECT_EQ(sent, 5);
  ASSERT_TRUE(readable(dns->get(), 2000)) << "no datagram on the egress :53";
  char payload[16];
  char control[CMSG_SPACE(sizeof(in_pktinfo))];
  sockaddr_in from{};
  iovec iov{payload, sizeof payload};
  msghdr msg{};
  msg.msg_name = &from;
  msg.msg_namelen = sizeof from;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ASSERT_EQ(::recvmsg(dns->get(), &msg, 0), 5);
  EXPECT_EQ(std::string(payload, 5), "query");
  EXPECT_EQ(egress::dottedQuad(from.sin_addr.s_addr), "100.64.0.22");
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  ASSERT_NE(cmsg, nullptr);
  in_pktinfo info;
  std::memcpy(&info, CMSG_DATA(cmsg), sizeof info);
  EXPECT_EQ(egress::dottedQuad(info.ipi_addr.s_addr), "8.8.8.8");

  // Pings get no answer (the loopback one shows the probe itself works).
  EXPECT_TRUE(inNamespaceThread<bool>(env.get(), [] { return pingAnswered("127.0.0.1"); }));
  EXPECT_FALSE(inNamespaceThread<bool>(env.get(), [] { return pingAnswered("203.0.113.7"); }));

  // No IPv6 in the environment: no address at all, no route anywhere.
  std::string inet6 = inNamespaceThread<std::string>(env.get(), [] {
    // thread-self: /proc/net follows the thread group leader's namespace.
    auto text = os::readFile("/proc/thread-self/net/if_inet6");
    return text.ok() ? *text : std::string("unreadable");
  });
  EXPECT_EQ(inet6, "");
  int v6 = inNamespaceThread<int>(env.get(), [] {
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 to{};
    to.sin6_family = AF_INET6;
    ::inet_pton(AF_INET6, "2001:db8::1", &to.sin6_addr);
    to.sin6_port = htons(443);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
    int err = rc == 0 ? 0 : errno;
    ::close(fd);
    return err;
  });
  // With no IPv6 address at all, source selection fails before the missing
  // route is reported.
  EXPECT_TRUE(v6 == ENETUNREACH || v6 == EADDRNOTAVAIL) << std::strerror(v6);

  ASSERT_TRUE(egress->detach(5).ok());
  Outcome gone = inNamespaceThread<Outcome>(env.get(), [] { return connectTcp("203.0.113.7", 443); });
  EXPECT_EQ(gone.error, ENETUNREACH) << std::strerror(gone.error);
  // Detached twice: the pair is already gone.
  Status again = egress->detach(5);
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(again.error().sysErrno, ENODEV);

  ASSERT_TRUE(egress->remove().ok());
}

TEST_F(EgressNetworkTest, EnvironmentsCannotReachOrImpersonateEachOther) {
  auto egress = open();
  ASSERT_TRUE(egress);
  auto https = egress->listenTcp(443);
  ASSERT_TRUE(https.ok()) << https.error().message();
  UniqueFd five = newEnvironmentNamespace(), six = newEnvironmentNamespace();
  ASSERT_TRUE(five && six);
  ASSERT_TRUE(egress->attach(five.get(), 5).ok());
  ASSERT_TRUE(egress->attach(six.get(), 6).ok());

  // Another environment's address is not routed to anything: the egress
  // namespace does not forward, and drops such packets silently.
  Outcome direct = inNamespaceThread<Outcome>(five.get(), [] { return connectTcp("100.64.0.26", 443, nullptr, 300); });
  EXPECT_NE(direct.error, 0);
  std::printf("[ info   ] connect to the other environment: %s after %.1f ms\n", std::strerror(direct.error),
              direct.ms);

  // Spoofing slot 6's address from slot 5: rp_filter drops the datagram,
  // so a listener never sees traffic claiming to be slot 6. (UDP, because a
  // spoofed TCP SYN could not complete its handshake anyway.)
  auto dns = egress->bindUdp(53);
  ASSERT_TRUE(dns.ok()) << dns.error().message();
  auto netlink = os::Netlink::open(five.get());
  ASSERT_TRUE(netlink.ok());
  ASSERT_TRUE(netlink->addAddress("eth0", ipv4("100.64.0.26"), 32).ok());
  for (const char* source : {"100.64.0.26", "100.64.0.22"}) {
    int sent = inNamespaceThread<int>(five.get(), [source] { return sendUdp(source, "8.8.8.8", 53); });
    EXPECT_EQ(sent, 5) << source;
  }
  ASSERT_TRUE(readable(dns->get(), 2000));
  sockaddr_in from{};
  socklen_t fromLength = sizeof from;
  char payload[16];
  ASSERT_EQ(::recvfrom(dns->get(), payload, sizeof payload, 0, reinterpret_cast<sockaddr*>(&from), &fromLength), 5);
  EXPECT_EQ(egress::dottedQuad(from.sin_addr.s_addr), "100.64.0.22") << "spoofed source got through";
  EXPECT_FALSE(readable(dns->get(), 100));

  // Attaching an environment that already has an eth0 fails and leaves no
  // half-made pair.
  auto twice = egress->attach(six.get(), 7);
  EXPECT_FALSE(twice.ok());
  auto check = os::Netlink::open(egress->fd());
  ASSERT_TRUE(check.ok());
  auto mx7 = check->linkIndex("mx7");
  EXPECT_FALSE(mx7.ok());
  EXPECT_TRUE(check->linkIndex("mx6").ok());
  EXPECT_FALSE(egress->attach(six.get(), EgressNetwork::kSlotCount).ok());

  ASSERT_TRUE(egress->remove().ok());
}

TEST_F(EgressNetworkTest, ReopeningFindsTheSameNamespaceAndItsVeths) {
  std::string path = stateDir_ + "/run/egress.netns";
  UniqueFd env = newEnvironmentNamespace();
  ASSERT_TRUE(env);
  ino_t inode;
  {
    auto first = open();
    ASSERT_TRUE(first);
    inode = inodeOf(first->fd());
    EXPECT_EQ(first->path(), path);
    EXPECT_TRUE(mounted(path));
    ASSERT_TRUE(first->attach(env.get(), 9).ok());
    auto second = open();  // while the first lives
    ASSERT_TRUE(second);
    EXPECT_EQ(inodeOf(second->fd()), inode);
  }
  // As after a moatd restart: the namespace and the environment's veth
  // survived without any fd held.
  auto reopened = open();
  ASSERT_TRUE(reopened);
  EXPECT_EQ(inodeOf(reopened->fd()), inode);
  auto http = reopened->listenTcp(80);
  ASSERT_TRUE(http.ok()) << http.error().message();
  std::thread server([&] {
    if (!readable(http->get(), 3000)) return;
    int conn = ::accept4(http->get(), nullptr, nullptr, SOCK_CLOEXEC);
    char buf[8];
    if (::recv(conn, buf, sizeof buf, 0) == 4) ::send(conn, "pong", 4, MSG_NOSIGNAL);
    ::close(conn);
  });
  Outcome reached = inNamespaceThread<Outcome>(env.get(), [] { return connectTcp("198.51.100.1", 80); });
  server.join();
  EXPECT_EQ(reached.error, 0) << std::strerror(reached.error);
  EXPECT_EQ(reached.received, "pong");
  // What a restarted moatd reconciles its store with: the slots there are.
  auto slots = reopened->linkedSlots();
  ASSERT_TRUE(slots.ok()) << slots.error().message();
  EXPECT_EQ(*slots, std::vector<uint32_t>{9});
  // A re-attach of the same slot replaces the stale pair.
  UniqueFd newEnv = newEnvironmentNamespace();
  auto relink = reopened->attach(newEnv.get(), 9);
  EXPECT_TRUE(relink.ok()) << relink.error().message();
  UniqueFd thirdEnv = newEnvironmentNamespace();
  ASSERT_TRUE(reopened->attach(thirdEnv.get(), 0x1a2).ok());
  slots = reopened->linkedSlots();
  ASSERT_TRUE(slots.ok()) << slots.error().message();
  std::sort(slots->begin(), slots->end());
  EXPECT_EQ(*slots, (std::vector<uint32_t>{9, 0x1a2}));
  ASSERT_TRUE(reopened->detach(9).ok());
  slots = reopened->linkedSlots();
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(*slots, std::vector<uint32_t>{0x1a2});

  ASSERT_TRUE(reopened->remove().ok());
  EXPECT_FALSE(mounted(path));
  EXPECT_FALSE(os::exists(path));
  // The next start makes a new one.
  auto fresh = open();
  ASSERT_TRUE(fresh);
  EXPECT_NE(inodeOf(fresh->fd()), inode);
  ASSERT_TRUE(fresh->remove().ok());
}

// Any `ip rule` unmerges the kernel's local and main tables; from then on
// the local table is looked up first, and without the throw route for
// 100.64.0.0/10 the AnyIP route would swallow every reply to an environment.
TEST_F(EgressNetworkTest, RepliesStillReachTheEnvironmentWithPolicyRules) {
  for (const char* tool : {"/usr/bin/nsenter", "/usr/sbin/ip"}) {
    if (!os::exists(tool)) GTEST_SKIP() << "needs " << tool << " to add a policy rule";
  }
  auto egress = open();
  ASSERT_TRUE(egress);
  auto rule = runProcess({"/usr/bin/nsenter", "--net=" + egress->path(), "/usr/sbin/ip", "rule", "add", "pref", "1000",
                          "from", "192.0.2.1", "lookup", "100"});
  ASSERT_EQ(rule.exitCode, 0) << rule.err;
  auto https = egress->listenTcp(443);
  ASSERT_TRUE(https.ok()) << https.error().message();
  UniqueFd env = newEnvironmentNamespace();
  ASSERT_TRUE(env);
  ASSERT_TRUE(egress->attach(env.get(), 3).ok());
  std::thread server([&] {
    if (!readable(https->get(), 3000)) return;
    int conn = ::accept4(https->get(), nullptr, nullptr, SOCK_CLOEXEC);
    char buf[8];
    if (::recv(conn, buf, sizeof buf, 0) == 4) ::send(conn, "pong", 4, MSG_NOSIGNAL);
    ::close(conn);
  });
  Outcome reached = inNamespaceThread<Outcome>(env.get(), [] { return connectTcp("203.0.113.7", 443); });
  server.join();
  EXPECT_EQ(reached.error, 0) << std::strerror(reached.error);
  EXPECT_EQ(reached.received, "pong");
  ASSERT_TRUE(egress->remove().ok());
}

TEST_F(EgressNetworkTest, AttachAndDetachTimings) {
  auto egress = open();
  ASSERT_TRUE(egress);
  constexpr int kRounds = 20;
  std::vector<double> create, attach, detach, drop;
  for (int i = 0; i < kRounds; ++i) {
    auto t0 = Clock::now();
    UniqueFd env = newEnvironmentNamespace();
    auto t1 = Clock::now();
    auto link = egress->attach(env.get(), 100 + i);
    auto t2 = Clock::now();
    ASSERT_TRUE(link.ok()) << link.error().message();
    if (i % 2 == 0) {
      ASSERT_TRUE(egress->detach(100 + i).ok());
      detach.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t2).count());
    } else {
      env.reset();  // the namespace goes, and its veth with it (asynchronously)
      drop.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t2).count());
    }
    create.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    attach.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "[ timing ] median of %d: new env netns %.3f ms, attach %.3f ms, detach %.3f ms, "
      "drop env netns fd %.3f ms\n",
      kRounds, median(create), median(attach), median(detach), median(drop));
  ASSERT_TRUE(egress->remove().ok());
}

}  // namespace
}  // namespace moat::test
