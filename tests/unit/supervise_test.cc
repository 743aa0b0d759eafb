// moat run's side of the guest protocol: the command's end as moat-init
// reports it, and, for a guest (whose moat-init is the guest's), the host's
// own deadline when moat-init never reports one.
#include "cli/supervise.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "cli/exit_codes.h"
#include "init/protocol.h"

namespace moat::cli {
namespace {

struct Pair {
  int ours = -1, theirs = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    ours = fds[0];
    theirs = fds[1];
  }
  ~Pair() {
    ::close(ours);
    ::close(theirs);
  }
};

RunOptions options(double timeoutSeconds) {
  RunOptions o;
  o.command = {"/bin/tool"};
  o.timeoutSeconds = timeoutSeconds;
  return o;
}

TEST(SuperviseCommand, ReturnsTheExitCodeMoatInitReports) {
  Pair pair;
  init::Exited exited;
  exited.id = kRunCommandId;
  exited.exitCode = 7;
  ASSERT_TRUE(init::writeFrame(pair.theirs, init::MsgType::kExited, exited.encode()).ok());
  EXPECT_EQ(superviseCommand(pair.ours, options(0), [] { return uint64_t{0}; }), 7);
}

// A guest whose moat-init ignores the timeout (it says nothing at all):
// moat run ends at its own deadline with the timeout's exit code, not never.
TEST(SuperviseCommand, AGuestThatNeverEndsTheCommandTimesOutAtTheHostsDeadline) {
  Pair pair;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(200);
  EXPECT_EQ(superviseCommand(
                pair.ours, options(0.1), [] { return uint64_t{0}; }, deadline),
            kExitTimeout);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(190));
  EXPECT_LT(took, std::chrono::seconds(5));
  // Nothing it was told changes that: output keeps coming, no end.
  Pair chatty;
  init::Output out;
  out.id = kRunCommandId;
  out.stream = init::Stream::kStderr;
  out.data = "still running\n";
  ASSERT_TRUE(init::writeFrame(chatty.theirs, init::MsgType::kOutput, out.encode()).ok());
  EXPECT_EQ(superviseCommand(
                chatty.ours, options(0.1), [] { return uint64_t{0}; },
                std::chrono::steady_clock::now() + std::chrono::milliseconds(100)),
            kExitTimeout);
}

}  // namespace
}  // namespace moat::cli
