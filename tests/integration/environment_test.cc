// The namespace backend's create path in this process: the child that
// becomes pid 1 shares its creator's memory until it execs moat-init
// (os::cloneVfork), so it must leave that memory as it found it.
#include "backend/namespaces/environment.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "common/sanitizer.h"
#include "isolation/fs/storage_pool.h"
#include "moat_process.h"
#include "os/block.h"
#include "os/file.h"
#include "os/process.h"

namespace moat::test {
namespace {

using backend::namespaces::Environment;
using backend::namespaces::EnvironmentSpec;

#if defined(__x86_64__) && !MOAT_ASAN
TEST(CloneVfork, TheChildRunsInTheCallersMemoryUntilItExecs) {
  static int seen = 0;
  auto child = os::cloneVfork(
      {},
      [](void* p) -> int {
        *static_cast<int*>(p) = 42;
        char name[] = "true";
        char* argv[] = {name, nullptr};
        ::execv("/bin/true", argv);
        return 127;
      },
      &seen);
  ASSERT_TRUE(child.ok()) << child.error().message();
  // Back here only once the child has exec'd: its write is already ours.
  EXPECT_EQ(seen, 42);
  auto status = os::waitPidfd(child.value().pidfd.get());
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(status.value()) && WEXITSTATUS(status.value()) == 0) << status.value();
}
#endif

TEST(CloneVfork, AChildThatReturnsExitsWithItsValueAndErrorsNameClone3) {
  auto child = os::cloneVfork(
      {}, [](void*) -> int { return 7; }, nullptr);
  ASSERT_TRUE(child.ok()) << child.error().message();
  auto status = os::waitPidfd(child.value().pidfd.get());
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(status.value()) && WEXITSTATUS(status.value()) == 7) << status.value();
  // The kernel refuses a new mount namespace that shares the file system
  // information (CLONE_FS): an error, and no child.
  os::CloneOptions bad;
  bad.flags = CLONE_NEWNS | CLONE_FS;
  auto refused = os::cloneVfork(
      bad, [](void*) -> int { return 0; }, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("clone3"), std::string::npos) << refused.error().message();
  EXPECT_EQ(refused.error().sysErrno, EINVAL);
}

// What the child allocates and does not free before its exec would stay
// allocated in the creator (moatd's spawner) once per environment.
TEST(EnvironmentCreate, ManyCreatesLeaveTheCreatorsHeapAsItWas) {
  MOAT_REQUIRE_ROOT();
  ::setenv("MOAT_STORAGE_GB", "8", 0);
  EnvironmentSpec spec;
  spec.stateDir = testStateDir();
  spec.memoryMb = 64;
  spec.storageGb = 0.1;
  auto cycle = [&] {
    auto env = Environment::create(spec);
    ASSERT_TRUE(env.ok()) << env.error().message();
    ASSERT_TRUE(env.value()->destroy().ok());
  };
  cycle();  // what is made once per process (cgroup layout, pool) is made
  // Two rounds of 20: what each create leaves grows both; a one-off (the
  // cgroup parents made again after a neighbouring test removed them) at
  // most one.
  std::vector<long> grew;
  for (int round = 0; round < 2; ++round) {
    const size_t before = ::mallinfo2().uordblks;
    for (int i = 0; i < 20; ++i) cycle();
    grew.push_back(static_cast<long>(::mallinfo2().uordblks) - static_cast<long>(before));
  }
  EXPECT_LE(std::min(grew[0], grew[1]), 256)
      << "heap in use grew by " << grew[0] << " and " << grew[1] << " bytes over two rounds of 20 creates";
}

// What an environment's destroy could not remove (a volume holding another)
// stays marked by its unlocked lock file, and every later collection tries
// again until it is gone. Before, the mark went with the first try.
TEST(EnvironmentLeftovers, WhatCouldNotBeRemovedIsTriedAgainUntilItIsGone) {
  MOAT_REQUIRE_ROOT();
  ::setenv("MOAT_STORAGE_GB", "8", 0);
  const std::string state = testStateDir();
  auto pool = isolation::fs::StoragePool::open(state);
  ASSERT_TRUE(pool.ok()) << pool.error().message();
  const std::string id = "env-leftover01";
  auto volume = pool->createVolume(id, 64u << 20);
  ASSERT_TRUE(volume.ok()) << volume.error().message();
  ASSERT_TRUE(os::makeDir(state + "/run", 0700).ok());
  const std::string lock = state + "/run/" + id + ".lock";
  ASSERT_TRUE(os::writeFile(lock, "").ok());
  // A volume inside it: btrfs refuses to delete it (ENOTEMPTY).
  ASSERT_TRUE(os::createSubvolume(volume.value(), "inner").ok());
  backend::namespaces::collectLeftovers(state);
  EXPECT_TRUE(os::exists(volume.value()));
  EXPECT_TRUE(os::exists(lock)) << "the mark went while the volume stayed";
  ASSERT_TRUE(os::destroySubvolume(volume.value(), "inner").ok());
  backend::namespaces::collectLeftovers(state);
  EXPECT_FALSE(os::exists(volume.value()));
  EXPECT_FALSE(os::exists(lock));
}

}  // namespace
}  // namespace moat::test
