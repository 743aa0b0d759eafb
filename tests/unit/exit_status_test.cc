// os::exitStatusOf: how a child ended, seen without reaping it (its owner
// still waits for it), or that it runs on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "os/process.h"

namespace moat::os {
namespace {

pid_t child(int (*body)()) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  return pid;
}

TEST(ExitStatusOf, SaysHowAChildEndedAndLeavesItToItsOwnersWait) {
  pid_t exited = child([] { return 3; });
  ASSERT_GT(exited, 0);
  auto pidfd = pidfdOpen(exited);
  ASSERT_TRUE(pidfd.ok()) << pidfd.error().message();
  auto status = exitStatusOf(pidfd->get(), 10000);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << *status;
  // Not reaped: the owner's wait still finds it, with the same status.
  int reaped = 0;
  ASSERT_EQ(::waitpid(exited, &reaped, 0), exited);
  EXPECT_EQ(reaped, *status);
}

TEST(ExitStatusOf, NamesTheSignalThatKilledAChildAndNothingWhileItRuns) {
  pid_t running = child([] {
    const struct rlimit noCore = {0, 0};  // killed by SIGSEGV: no core file
    ::setrlimit(RLIMIT_CORE, &noCore);
    ::pause();
    return 0;
  });
  ASSERT_GT(running, 0);
  auto pidfd = pidfdOpen(running);
  ASSERT_TRUE(pidfd.ok()) << pidfd.error().message();
  EXPECT_FALSE(exitStatusOf(pidfd->get(), 0).has_value()) << "it runs";
  ASSERT_EQ(::kill(running, SIGSEGV), 0);
  auto status = exitStatusOf(pidfd->get(), 10000);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGSEGV) << *status;
  EXPECT_EQ(describeWaitStatus(*status), "killed by signal Segmentation fault");
  ASSERT_EQ(::waitpid(running, nullptr, 0), running);
}

}  // namespace
}  // namespace moat::os
