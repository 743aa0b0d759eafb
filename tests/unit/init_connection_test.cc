#include "manager/init_connection.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "init/protocol.h"
#include "os/socket.h"

namespace moat::manager {
namespace {

// A moat-init stand-in on the other end of a socketpair: it says what it is
// told to and nothing else.
struct Peer {
  UniqueFd ours, theirs;
  Peer() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    ours.reset(fds[0]);
    theirs.reset(fds[1]);
  }
  void hello(uint32_t version) {
    std::string frame = init::encodeFrame(init::MsgType::kHello, init::Hello{version, 1}.encode());
    ASSERT_EQ(::write(theirs.get(), frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  }
};

// moatd re-attaching after an upgrade meets moat-inits of older versions:
// what it may send depends on the version each announced.
TEST(InitConnection, KnowsTheVersionMoatInitAnnounced) {
  for (uint32_t version : {1u, init::kProtocolVersion}) {
    Peer peer;
    peer.hello(version);
    InitConnection connection(std::move(peer.ours), nullptr);
    EXPECT_EQ(connection.peerVersion(), version);
  }
  EXPECT_GE(init::kProtocolVersion, init::kFlowControlSince);
}

TEST(InitConnection, AMoatInitGoneBeforeItsHelloHasNoVersion) {
  Peer peer;
  InitConnection connection(std::move(peer.ours), nullptr);
  peer.theirs.reset();
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(connection.peerVersion(), 0u);
  // Not the 5 s wait: the end of the connection answers it.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

// A microVM's moat-init is the guest's to stop: one that stops reading
// makes moatd's write fail once its send timeout runs out (not wait for
// good), and the connection, which may hold part of a frame, ends.
TEST(InitConnection, AMoatInitThatStopsReadingEndsItsConnectionAtTheSendTimeout) {
  ::signal(SIGPIPE, SIG_IGN);  // as moatd: a write after the end is EPIPE
  Peer peer;
  peer.hello(init::kProtocolVersion);
  ASSERT_TRUE(os::setSendTimeout(peer.ours.get(), std::chrono::milliseconds(100)).ok());
  InitConnection connection(std::move(peer.ours), nullptr);
  ASSERT_EQ(connection.peerVersion(), init::kProtocolVersion);
  // More than the socket's buffers hold, to a peer that reads nothing.
  const std::string chunk(1 << 20, 'x');
  Status s;
  for (int i = 0; i < 64 && s.ok(); ++i) s = connection.writeStdin(7, chunk);
  ASSERT_FALSE(s.ok()) << "a write to a peer that reads nothing must end";
  // The reader sees the shutdown: the connection is closed for everyone.
  for (int i = 0; i < 200 && !connection.closed(); ++i) ::usleep(10000);  // bounded wait for the reader thread
  EXPECT_TRUE(connection.closed());
  EXPECT_FALSE(connection.writeStdin(7, "y").ok());
}

}  // namespace
}  // namespace moat::manager
