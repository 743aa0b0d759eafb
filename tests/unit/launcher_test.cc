// moat-init's launch threads (init/launcher.h): they start on demand, end
// when idle, and a launch after that starts another.
#include "init/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/unique_fd.h"
#include "init/launch.h"

namespace moat::init {
namespace {

// Launches /bin/true and waits (up to 10 s) for the launch to be reported.
pid_t launchTrue(Launcher& launcher, int devNull) {
  SpawnRequest request;
  request.id = 1;
  request.argv = {"/bin/true"};
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
  // Idle for 200 ms: the thread ends (an idle environment holds none).
  EXPECT_TRUE(threadsComeTo(launcher, 0)) << launcher.threads() << " threads still";

  pid_t second = launchTrue(launcher, devNull.get());
  ASSERT_GT(second, 0) << "a launch after the idle thread ended";
  EXPECT_TRUE(reapedWithZero(second));
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
