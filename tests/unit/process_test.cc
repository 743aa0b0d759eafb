#include "manager/process.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace moat::manager {
namespace {

// An exec's answer and a stream's last item are sent when the process is
// seen to end; the audit event its end hook records must be there by then,
// or a client that reads the log right after can miss it.
TEST(Process, NobodySeesTheEndBeforeTheEndHookHasRun) {
  auto process = std::make_shared<Process>(1, std::vector<std::string>{"true"}, "exec", false, false, 1024);
  std::mutex m;
  std::condition_variable cv;
  bool waiterReturned = false;
  std::atomic<bool> hookDone{false};
  process->onEnded([&](const ProcessInfo& info) {
    EXPECT_EQ(info.state, ProcessState::kExited);
    EXPECT_EQ(info.exitCode, 3);
    // Give a waiter that could already see the end the time to say so.
    std::unique_lock<std::mutex> lock(m);
    cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return waiterReturned; });
    hookDone = true;
  });
  bool hookDoneWhenSeen = false;
  std::thread waiter([&] {
    ASSERT_TRUE(process->waitEnded(std::chrono::steady_clock::now() + std::chrono::seconds(30)));
    hookDoneWhenSeen = hookDone;
    std::lock_guard<std::mutex> lock(m);
    waiterReturned = true;
    cv.notify_all();
  });
  init::Exited exited;
  exited.exitCode = 3;
  process->onExited(exited);
  waiter.join();
  EXPECT_TRUE(hookDoneWhenSeen) << "the end was visible while the end hook still ran";
  EXPECT_EQ(process->info().exitCode, 3);
}

TEST(Process, TheEndHookRunsOnceWhicheverEndComesFirst) {
  auto process = std::make_shared<Process>(1, std::vector<std::string>{"true"}, "exec", false, false, 1024);
  int calls = 0;
  ProcessState seen = ProcessState::kStarting;
  process->onEnded([&](const ProcessInfo& info) {
    ++calls;
    seen = info.state;
  });
  process->onLost("the environment went away");
  process->onExited(init::Exited{});
  process->onSpawnFailed(2, "exec");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, ProcessState::kLost);
  EXPECT_EQ(process->info().reason, "the environment went away");
}

}  // namespace
}  // namespace moat::manager
