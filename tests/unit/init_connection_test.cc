#include "manager/init_connection.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <thread>

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

// A read through a moat-init stand-in of `version` that answers with
// `answer` (its tag set here), after `check` saw the request it got.
Result<init::FileResult> readThrough(uint32_t version, const init::FileRequest& request, init::FileResult answer,
                                     const std::function<void(const init::FileRequest&)>& check = {}) {
  Peer peer;
  peer.hello(version);
  int theirs = peer.theirs.get();
  std::thread moatInit([&, theirs] {
    init::FrameReader reader;
    auto frame = init::readFrame(theirs, reader);
    if (!frame.ok()) return;
    auto got = init::FileRequest::decode(frame->payload);
    if (!got.ok()) return;
    if (check) check(got.value());
    answer.tag = got->tag;
    std::string payload = answer.encode();
    if (version < init::kSparseReadSince) payload.resize(payload.size() - 8);  // no offset before 6
    (void)init::writeFrame(theirs, init::MsgType::kFileResult, payload);
  });
  InitConnection connection(std::move(peer.ours), nullptr);
  auto result = connection.file(request);
  moatInit.join();
  return result;
}

init::FileRequest readAt(uint64_t offset, uint64_t length, bool skipHoles) {
  init::FileRequest r;
  r.op = init::FileOp::kRead;
  r.path = "/workspace/f";
  r.offset = offset;
  r.length = length;
  if (skipHoles) r.flags = init::kFileSkipHoles;
  return r;
}

init::FileResult bytesAt(uint64_t offset, std::string data) {
  init::FileResult r;
  r.offset = offset;
  r.data = std::move(data);
  return r;
}

// A moat-init before version 6 is not sent the flag (it would refuse it):
// it reads as before, and the answer's offset is the one asked for.
TEST(InitConnection, AnOlderMoatInitReadsHolesAsZerosFromTheOffsetAskedFor) {
  uint8_t flagsSeen = 0xff;
  auto r = readThrough(init::kSparseReadSince - 1, readAt(4096, 10, true), bytesAt(0, std::string(10, '\0')),
                       [&](const init::FileRequest& got) { flagsSeen = got.flags; });
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(flagsSeen, 0) << "kFileSkipHoles sent to a moat-init that does not know it";
  EXPECT_EQ(r->offset, 4096u);
  EXPECT_EQ(r->data, std::string(10, '\0'));
}

// A guest's moat-init is not trusted with where its bytes come from.
TEST(InitConnection, AReadAnsweredWithBytesFromElsewhereIsAProtocolError) {
  struct Case {
    const char* what;
    init::FileRequest request;
    init::FileResult answer;
    bool ok;
  };
  const Case cases[] = {
      {"skipped to later data", readAt(100, 10, true), bytesAt(5000, "abc"), true},
      {"from before the offset", readAt(100, 10, true), bytesAt(99, "abc"), false},
      {"a plain read moved", readAt(100, 10, false), bytesAt(200, "abc"), false},
      {"more than asked", readAt(0, 2, false), bytesAt(0, "abc"), false},
      {"past any file's end", readAt(0, 10, true), bytesAt(static_cast<uint64_t>(INT64_MAX), "abc"), false},
  };
  for (const Case& c : cases) {
    auto r = readThrough(init::kProtocolVersion, c.request, c.answer);
    EXPECT_EQ(r.ok(), c.ok) << c.what;
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, Code::kProtocol) << c.what;
    }
  }
}

}  // namespace
}  // namespace moat::manager
