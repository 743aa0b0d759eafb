// moat-init's launch threads (init/launcher.h): they start on demand, end
// when idle once no command of theirs lives, and a launch after that starts
// another.
#include "init/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "init/launch.h"

namespace moat::init {
namespace {

// Launches argv and waits (up to 10 s) for the launch to be reported.
pid_t launch(Launcher& launcher, int devNull, std::vector<std::string> argv) {
  SpawnRequest request;
  request.id = 1;
  request.argv = std::move(argv);
  request.env = {"PATH=/usr/bin:/bin"};
  LaunchEnds ends;
  auto launch = prepareLaunch(request, devNull, ends);
  if (!launch.ok()) return -1;
  launcher.submit(std::move(launch.value()));
  pollfd ready{launcher.readyFd(), POLLIN, 0};
  if (::poll(&ready, 1, 10000) != 1) return -1;
  auto finished = launcher.takeFinished();
  if (finished.size() != 1) return -1;
  return finished[0]->pid;
}

pid_t launchTrue(Launcher& launcher, int devNull) { return launch(launcher, devNull, {"/bin/true"}); }

bool reapedWithZero(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Waits (up to 10 s) for the launcher's threads to come to `count`.
bool threadsComeTo(const Launcher& launcher, size_t count) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (launcher.threads() != count) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(InitLauncher, AnIdleThreadEndsAndTheNextLaunchStartsAnother) {
  UniqueFd devNull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(devNull);
  Launcher launcher(4, std::chrono::milliseconds(200));
  EXPECT_EQ(launcher.threads(), 0u);  // none before the first launch

  pid_t first = launchTrue(launcher, devNull.get());
  ASSERT_GT(first, 0);
  EXPECT_TRUE(reapedWithZero(first));
  launcher.allowIdleExit(true);  // as moat-init's loop says once no command lives
  // Idle for 200 ms: the thread ends (an idle environment holds none).
  EXPECT_TRUE(threadsComeTo(launcher, 0)) << launcher.threads() << " threads still";

  pid_t second = launchTrue(launcher, devNull.get());
  ASSERT_GT(second, 0) << "a launch after the idle thread ended";
  EXPECT_TRUE(reapedWithZero(second));
}

// A command's parent is the thread that launched it: one that asked for a
// parent-death signal gets it when that thread ends. While a command lives,
// its thread stays, however long it is idle.
TEST(InitLauncher, AThreadStaysWhileACommandItLaunchedLives) {
  UniqueFd devNull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(devNull);
  ASSERT_EQ(::access("/usr/bin/setpriv", X_OK), 0) << "util-linux's setpriv is needed";
  Launcher launcher(4, std::chrono::milliseconds(100));
  pid_t pid = launch(launcher, devNull.get(), {"/usr/bin/setpriv", "--pdeathsig", "KILL", "/bin/sleep", "30"});
  ASSERT_GT(pid, 0);
  // Five idle periods: what is checked is that nothing happens.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the command ended: its launch thread went";
  EXPECT_EQ(launcher.threads(), 1u);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  launcher.allowIdleExit(true);
  EXPECT_TRUE(threadsComeTo(launcher, 0)) << launcher.threads() << " threads still";
}

TEST(InitLauncher, ABusyThreadStaysWhileLaunchesKeepComing) {
  UniqueFd devNull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(devNull);
  Launcher launcher(4, std::chrono::seconds(30));
  for (int i = 0; i < 3; ++i) {
    pid_t pid = launchTrue(launcher, devNull.get());
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(reapedWithZero(pid));
    EXPECT_EQ(launcher.threads(), 1u) << "one thread serves launches one after another";
  }
  // stop() returns once every thread has ended.
  launcher.stop();
  EXPECT_EQ(launcher.threads(), 0u);
}

}  // namespace
}  // namespace moat::init
