// The cgroup v2 mechanics moat uses on pure-v2 hosts (CLONE_INTO_CGROUP,
// cgroup.kill, removal), on this host's real cgroup2 mount. Hosts like the
// CI machine bind the resource controllers to v1, so limits are not
// exercised here; their knob writes are unit-tested (tests/unit/cgroup_test.cc).
#include <gtest/gtest.h>
#include <linux/sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "isolation/cgroup/cgroup.h"
#include "moat_process.h"
#include "os/file.h"
#include "os/process.h"

namespace moat::test {
namespace {

using isolation::cgroup::Cgroup;
using isolation::cgroup::Layout;
using isolation::cgroup::Version;

TEST(CgroupV2, CloneIntoCgroupKillAndRemove) {
  MOAT_REQUIRE_ROOT();
  std::string mount = cgroup2Mount();
  if (mount.empty()) GTEST_SKIP() << "this host has no cgroup2 mount";
  Layout layout;
  layout.version = Version::kV2;
  layout.v2Parent = mount + "/moat-test-" + std::to_string(::getpid());
  ASSERT_TRUE(os::makeDirs(layout.v2Parent).ok());

  {
    auto cg = Cgroup::create(layout, "moat-v2test", {});
    ASSERT_TRUE(cg.ok()) << cg.error().message();
    auto dirFd = cg->openDirectory();
    ASSERT_TRUE(dirFd.ok()) << dirFd.error().message();
    auto child = os::clone3({0, dirFd->get()});
    ASSERT_TRUE(child.ok()) << child.error().message();
    if (child->pid == 0) {
      ::pause();
      ::_exit(0);
    }
    // Born inside the cgroup: no migration, no window outside it.
    auto procs = os::readFile(cg->procsFiles()[0]);
    ASSERT_TRUE(procs.ok());
    EXPECT_EQ(procs.value(), std::to_string(child->pid) + "\n");
    cg->killAll();
    auto status = os::waitPidfd(child->pidfd.get());
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status.value(), SIGKILL);
    Status removed = cg->remove();
    EXPECT_TRUE(removed.ok()) << removed.error().message();
    EXPECT_FALSE(os::exists(layout.v2Parent + "/moat-v2test"));
  }
  EXPECT_EQ(::rmdir(layout.v2Parent.c_str()), 0);
}

}  // namespace
}  // namespace moat::test
