#include "manager/init_connection.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
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

namespace moat::manager {
namespace {

// What the connection reports about one process.
struct RecordingSink : ProcessSink {
  std::mutex mutex;
  std::string output;
  bool exited = false, lost = false;
  void onSpawned(uint32_t) override {}
  void onSpawnFailed(int, const std::string&) override {}
  void onOutput(init::Stream, const std::string& data) override {
    std::lock_guard lock(mutex);
    output += data;
  }
  void onExited(const init::Exited&) override {
    std::lock_guard lock(mutex);
    exited = true;
  }
  void onLost(const std::string&) override {
    std::lock_guard lock(mutex);
    lost = true;
  }
  bool has(const std::function<bool(RecordingSink&)>& what) {
    for (int i = 0; i < 500; ++i) {  // bounded: 5 s for the reader thread
      {
        std::lock_guard lock(mutex);
        if (what(*this)) return true;
      }
      ::usleep(10000);
    }
    return false;
  }
};

// A file request `op` of `path` through `connection`.
Result<init::FileResult> fileRequest(InitConnection& connection, init::FileOp op, const std::string& path) {
  init::FileRequest request;
  request.op = op;
  request.path = path;
  return connection.file(request);
}

Result<init::Frame> nextFrame(int fd) {
  init::FrameReader reader;
  return init::readFrame(fd, reader);
}

// A microVM checkpointed to disk (docs/PAUSE.md, "To disk"): its connection
// is suspended after a barrier the guest answers, its transport ends (QEMU
// is ended) without ending anything, what is refused meanwhile says why,
// what is granted meanwhile waits, and on a new transport the same process
// goes on: its output reaches the same sink, its input the guest.
TEST(InitConnection, ASuspendedConnectionGoesOnOnANewTransportWithItsProcesses) {
  ::signal(SIGPIPE, SIG_IGN);
  Peer first;
  first.hello(init::kProtocolVersion);
  std::atomic<bool> ended{false};
  auto connection = std::make_shared<InitConnection>(std::move(first.ours), [&] { ended = true; });
  ASSERT_EQ(connection->peerVersion(), init::kProtocolVersion);
  auto sink = std::make_shared<RecordingSink>();
  init::SpawnRequest spawn;
  spawn.argv = {"/bin/tool", "remember"};
  auto id = connection->spawn(spawn, sink, "", false);
  ASSERT_TRUE(id.ok()) << id.error().message();
  auto spawned = nextFrame(first.theirs.get());
  ASSERT_TRUE(spawned.ok());
  EXPECT_EQ(spawned->type, init::MsgType::kSpawn);

  // The barrier: the last frame before the suspension, answered.
  std::thread guest([&] {
    auto barrier = nextFrame(first.theirs.get());
    ASSERT_TRUE(barrier.ok());
    ASSERT_EQ(barrier->type, init::MsgType::kFile);
    auto request = init::FileRequest::decode(barrier->payload);
    ASSERT_TRUE(request.ok());
    EXPECT_EQ(request->op, init::FileOp::kQuiesce);
    init::FileResult answer;
    answer.tag = request->tag;
    ASSERT_TRUE(init::writeFrame(first.theirs.get(), init::MsgType::kFileResult, answer.encode()).ok());
  });
  init::FileRequest quiesce;
  quiesce.op = init::FileOp::kQuiesce;
  quiesce.path = "/";
  Status suspended = connection->suspend("on disk: resume it first", quiesce);
  guest.join();
  ASSERT_TRUE(suspended.ok()) << suspended.error().message();
  EXPECT_TRUE(connection->suspended());

  // Refused, saying why; a credit is kept for the guest's return.
  auto refused = connection->writeStdin(id.value(), "lost?\n");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Code::kConflict);
  EXPECT_EQ(refused.error().message(), "on disk: resume it first");
  auto file = fileRequest(*connection, init::FileOp::kRead, "/workspace/f");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.error().code, Code::kConflict);
  EXPECT_TRUE(connection->grantOutput(id.value(), 4096).ok());

  // The old transport ends (its QEMU is gone): nothing ends with it.
  first.theirs.reset();
  ::usleep(100000);  // the reader sees the end at once; nothing may follow it
  EXPECT_FALSE(connection->closed());
  EXPECT_FALSE(ended);
  EXPECT_FALSE(sink->lost);

  // The guest back on a new transport: what was kept comes first.
  Peer second;
  second.hello(init::kProtocolVersion);
  ASSERT_TRUE(connection->resumeOn(std::move(second.ours)).ok());
  EXPECT_FALSE(connection->suspended());
  EXPECT_EQ(connection->peerVersion(), init::kProtocolVersion);
  auto credit = nextFrame(second.theirs.get());
  ASSERT_TRUE(credit.ok());
  ASSERT_EQ(credit->type, init::MsgType::kOutputCredit);
  auto granted = init::OutputCredit::decode(credit->payload);
  ASSERT_TRUE(granted.ok());
  EXPECT_EQ(granted->id, id.value());
  EXPECT_EQ(granted->upTo, 4096u);
  ASSERT_TRUE(connection->writeStdin(id.value(), "second\n").ok());
  auto input = nextFrame(second.theirs.get());
  ASSERT_TRUE(input.ok());
  EXPECT_EQ(input->type, init::MsgType::kStdin);
  ASSERT_TRUE(init::writeFrame(second.theirs.get(), init::MsgType::kOutput,
                               init::Output{id.value(), init::Stream::kStdout, "[first second]\n"}.encode())
                  .ok());
  init::Exited exited;
  exited.id = id.value();
  ASSERT_TRUE(init::writeFrame(second.theirs.get(), init::MsgType::kExited, exited.encode()).ok());
  EXPECT_TRUE(sink->has([](RecordingSink& s) { return s.exited && s.output == "[first second]\n"; }));
  EXPECT_FALSE(sink->lost);
  EXPECT_FALSE(ended);
}

// A suspended connection that is closed (its environment destroyed while
// on disk) ends: its processes are lost and its owner told, at once.
TEST(InitConnection, ASuspendedConnectionThatIsClosedEndsItsProcesses) {
  std::atomic<bool> ended{false};
  // As a restart makes one: suspended from the start, no transport.
  auto connection = std::make_shared<InitConnection>(
      UniqueFd(), [&] { ended = true; }, InitConnection::ExecHooks{}, "on disk");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(connection->peerVersion(), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << "no wait for a Hello";
  auto refused = fileRequest(*connection, init::FileOp::kStat, "/");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Code::kConflict);
  EXPECT_FALSE(connection->closed());
  connection->close("destroyed");
  for (int i = 0; i < 500 && !ended; ++i) ::usleep(10000);  // bounded: the reader thread's end
  EXPECT_TRUE(ended);
  EXPECT_TRUE(connection->closed());
}

}  // namespace
}  // namespace moat::manager
