// os::exitStatusOf: how a child ended, seen without reaping it (its owner
// still waits for it), or that it runs on.
#include <gtest/gtest.h>
#include <signal.h>
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
  // SIGTERM, not SIGSEGV: a sanitizer's handler would take a SEGV, report
  // it and exit 1 (the child inherits it).
  pid_t running = child([] {
    // What an earlier test of this binary blocked (SIGTERM, by moatd-like
    // code) the child would inherit: it must die of the signal.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::pause();
    return 0;
  });
  ASSERT_GT(running, 0);
  auto pidfd = pidfdOpen(running);
  ASSERT_TRUE(pidfd.ok()) << pidfd.error().message();
  EXPECT_FALSE(exitStatusOf(pidfd->get(), 0).has_value()) << "it runs";
  ASSERT_EQ(::kill(running, SIGTERM), 0);
  auto status = exitStatusOf(pidfd->get(), 10000);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGTERM) << *status;
  EXPECT_EQ(describeWaitStatus(*status), "killed by signal Terminated");
  ASSERT_EQ(::waitpid(running, nullptr, 0), running);
}

}  // namespace
}  // namespace moat::os
