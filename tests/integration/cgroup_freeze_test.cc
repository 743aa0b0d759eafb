// A pause (Cgroup::freeze/thaw) on this host's real cgroup file systems:
// the v1 freezer hierarchy (this host's layout) and the cgroup v2 freezer
// on its cgroup2 mount (what pure-v2 hosts use). Counting processes stop,
// the one kept goes on, a kill of a frozen process ends it, and nothing is
// left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <sstream>
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
using Clock = std::chrono::steady_clock;

std::string cgroup2Mount() {
  auto mountinfo = os::readFile("/proc/self/mountinfo", 1 << 22);
  if (!mountinfo.ok()) return "";
  std::istringstream in(mountinfo.value());
  for (std::string line; std::getline(in, line);) {
    if (line.find(" - cgroup2 ") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string f[5];
    for (auto& x : f) fields >> x;
    return f[4];
  }
  return "";
}

// Two counters in shared memory, each advanced by a process of its own in
// the cgroup; the first also forks a grandchild that counts in slot 2.
struct Counters {
  std::atomic<uint64_t>* slots = nullptr;
  Counters() {
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    slots = static_cast<std::atomic<uint64_t>*>(p);
  }
  ~Counters() { ::munmap(slots, 4096); }
  uint64_t at(int i) const { return slots[i].load(); }
  // Waits until slot i moves past `from` (bounded: 10 s).
  bool advances(int i, uint64_t from) const {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      if (at(i) > from) return true;
      std::this_thread::yield();
    }
    return false;
  }
};

[[noreturn]] void count(std::atomic<uint64_t>* slot) {
  for (;;) slot->fetch_add(1);
}

// A counting child in `cg` (v2: born in it; v1: it joins each controller's
// tasks file first).
os::Child spawnCounter(const Cgroup& cg, Version version, Counters& counters, int slot, bool forkOne) {
  UniqueFd dir;
  if (version == Version::kV2) {
    auto d = cg.openDirectory();
    EXPECT_TRUE(d.ok());
    if (d.ok()) dir = std::move(d.value());
  }
  auto child = os::clone3({0, version == Version::kV2 ? dir.get() : -1});
  EXPECT_TRUE(child.ok()) << child.error().message();
  if (!child.ok()) return {};
  if (child->pid == 0) {
    if (version == Version::kV1) {
      for (const auto& f : cg.joinFiles()) {
        if (!os::writeExisting(f, "0").ok()) ::_exit(3);
      }
    }
    if (forkOne && ::fork() == 0) count(&counters.slots[2]);
    count(&counters.slots[slot]);
  }
  return std::move(child.value());
}

void pauseKeepsOneAndResumes(const Layout& layout, const std::string& name) {
  Counters counters;
  auto cg = Cgroup::create(layout, name, {});
  ASSERT_TRUE(cg.ok()) << cg.error().message();
  os::Child kept = spawnCounter(cg.value(), layout.version, counters, 0, false);
  os::Child paused = spawnCounter(cg.value(), layout.version, counters, 1, true);
  ASSERT_TRUE(counters.advances(2, 0)) << "the grandchild never counted";
  EXPECT_FALSE(cg->frozen());

  Status frozen = cg->freeze(kept.pid);
  ASSERT_TRUE(frozen.ok()) << frozen.error().message();
  EXPECT_TRUE(cg->frozen());
  EXPECT_TRUE(cg->freeze(kept.pid).ok()) << "a second pause is no error";
  // Stopped: nothing moves over a quarter second (what "stopped" means
  // can only be seen over a span of time), while the kept one goes on.
  const uint64_t one = counters.at(1), two = counters.at(2), zero = counters.at(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(counters.at(1), one) << "a paused process ran";
  EXPECT_EQ(counters.at(2), two) << "a paused process's child ran";
  EXPECT_TRUE(counters.advances(0, zero)) << "the kept process was paused too";

  Status thawed = cg->thaw();
  ASSERT_TRUE(thawed.ok()) << thawed.error().message();
  EXPECT_FALSE(cg->frozen());
  EXPECT_TRUE(counters.advances(1, one)) << "it did not go on after the thaw";
  EXPECT_TRUE(counters.advances(2, two)) << "its child did not go on after the thaw";
  EXPECT_TRUE(cg->thaw().ok()) << "a second resume is no error";

  // Paused again, then ended: a kill reaches frozen processes.
  ASSERT_TRUE(cg->freeze(kept.pid).ok());
  cg->killAll();
  for (os::Child* c : {&kept, &paused}) {
    auto status = os::waitPidfd(c->pidfd.get());
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status.value(), SIGKILL);
  }
  const std::string v1Freezer = layout.version == Version::kV1 ? layout.v1Parents.at("freezer") + "/" + name : "";
  Status removed = cg->remove();
  EXPECT_TRUE(removed.ok()) << removed.error().message();
  if (!v1Freezer.empty()) {
    EXPECT_FALSE(os::exists(v1Freezer)) << "the freezer's cgroup stayed";
  }
}

TEST(CgroupFreeze, V2PausesAllButOneAndResumes) {
  MOAT_REQUIRE_ROOT();
  std::string mount = cgroup2Mount();
  if (mount.empty()) GTEST_SKIP() << "this host has no cgroup2 mount";
  Layout layout;
  layout.version = Version::kV2;
  layout.v2Parent = mount + "/moat-freeze-test-" + std::to_string(::getpid());
  ASSERT_TRUE(os::makeDirs(layout.v2Parent).ok());
  pauseKeepsOneAndResumes(layout, "moat-v2freeze");
  EXPECT_FALSE(os::exists(layout.v2Parent + "/moat-v2freeze"));
  EXPECT_EQ(::rmdir(layout.v2Parent.c_str()), 0);
}

TEST(CgroupFreeze, V1PausesAllButOneAndResumes) {
  MOAT_REQUIRE_ROOT();
  auto layout = isolation::cgroup::preparedHostLayout(false);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  if (layout->version != Version::kV1) GTEST_SKIP() << "this host's limits are on cgroup v2 (the v2 test covers it)";
  ASSERT_TRUE(layout->v1Parents.count("freezer")) << "this host has a v1 freezer hierarchy of its own";
  pauseKeepsOneAndResumes(layout.value(), "moat-v1freeze-" + std::to_string(::getpid()));
}

// Without a freezer hierarchy of its own, a pause says why it cannot be.
TEST(CgroupFreeze, V1WithoutAFreezerSaysSo) {
  MOAT_REQUIRE_ROOT();
  auto layout = isolation::cgroup::preparedHostLayout(false);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  if (layout->version != Version::kV1) GTEST_SKIP() << "this host's limits are on cgroup v2";
  Layout without = layout.value();
  without.v1Parents.erase("freezer");
  auto cg = Cgroup::create(without, "moat-nofreezer-" + std::to_string(::getpid()), {});
  ASSERT_TRUE(cg.ok()) << cg.error().message();
  Status s = cg->freeze(0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Code::kUnsupported);
  EXPECT_NE(s.error().message().find("freezer"), std::string::npos) << s.error().message();
}

}  // namespace
}  // namespace moat::test
