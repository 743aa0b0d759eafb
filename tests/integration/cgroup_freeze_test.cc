// A pause (Cgroup::freeze/thaw) on this host's real cgroup file systems:
// the v1 freezer hierarchy (this host's layout) and the cgroup v2 freezer
// on its cgroup2 mount (what pure-v2 hosts use). Counting processes stop,
// the one kept goes on, a kill of a frozen process ends it, and nothing is
// left behind.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
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

// Counts each program it starts with vfork: a v1 freezer can catch the
// child before its exec, with the parent asleep waiting for it.
[[noreturn]] void countSpawns(std::atomic<uint64_t>* slot) {
  for (;;) {
    pid_t pid = ::vfork();
    if (pid == 0) {
      ::execl("/bin/true", "true", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (pid > 0) ::waitpid(pid, nullptr, 0);
    slot->fetch_add(1);
  }
}

// CPU time its threads have run, in ns (schedstat: finer than ticks).
uint64_t runtimeNs(pid_t pid) {
  uint64_t total = 0;
  auto tasks = os::listDir("/proc/" + std::to_string(pid) + "/task");
  if (!tasks.ok()) return 0;
  for (const auto& tid : tasks.value()) {
    auto stat = os::readFile("/proc/" + std::to_string(pid) + "/task/" + tid + "/schedstat");
    if (stat.ok()) total += std::strtoull(stat->c_str(), nullptr, 10);
  }
  return total;
}

enum class Kind { kCounts, kForksOne, kSpawns, kLeaderExits, kHoldsMemory };

// Whether a process is on its way out (PF_EXITING in its stat's flags, not
// yet a zombie): what the kernel lists in its cgroup but will not move.
bool exiting(pid_t pid) {
  auto stat = os::readFile("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return false;
  std::istringstream fields(stat->substr(stat->rfind(')') + 2));
  std::string state, skipped;
  unsigned long flags = 0;
  fields >> state;
  for (int i = 0; i < 5; ++i) fields >> skipped;
  fields >> flags;
  return state != "Z" && state != "X" && (flags & 0x4) != 0;
}

// A counting child in `cg` (v2: born in it; v1: it joins each controller's
// tasks file first).
os::Child spawnCounter(const Cgroup& cg, Version version, Counters& counters, int slot, Kind kind) {
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
    if (kind == Kind::kForksOne && ::fork() == 0) count(&counters.slots[2]);
    if (kind == Kind::kSpawns) countSpawns(&counters.slots[slot]);
    // Its memory's release takes ~20 ms when it ends (512 MiB of small pages).
    if (kind == Kind::kHoldsMemory) {
      const size_t size = size_t{512} << 20;
      void* memory = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (memory == MAP_FAILED) ::_exit(4);
      (void)::madvise(memory, size, MADV_NOHUGEPAGE);
      std::memset(memory, 1, size);
    }
    // Its first thread ends while another spins on (a program of its own:
    // this copy of the test process may not start threads).
    if (kind == Kind::kLeaderExits) {
      const std::string tool = std::string(MOAT_BIN_DIR) + "/moat-guest-tool";
      ::execl(tool.c_str(), "moat-guest-tool", "leaderless", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    count(&counters.slots[slot]);
  }
  return std::move(child.value());
}

void pauseKeepsOneAndResumes(const Layout& layout, const std::string& name) {
  Counters counters;
  auto cg = Cgroup::create(layout, name, {});
  ASSERT_TRUE(cg.ok()) << cg.error().message();
  os::Child kept = spawnCounter(cg.value(), layout.version, counters, 0, Kind::kCounts);
  os::Child paused = spawnCounter(cg.value(), layout.version, counters, 1, Kind::kForksOne);
  os::Child spawner = spawnCounter(cg.value(), layout.version, counters, 3, Kind::kSpawns);
  os::Child leaderless = spawnCounter(cg.value(), layout.version, counters, 4, Kind::kLeaderExits);
  ASSERT_TRUE(counters.advances(2, 0)) << "the grandchild never counted";
  auto proc = [](pid_t pid, const std::string& what) {
    auto text = os::readFile("/proc/" + std::to_string(pid) + "/" + what);
    return text.ok() ? text.value() : std::string("?");
  };
  ASSERT_TRUE(counters.advances(3, 0)) << "the spawner never spawned: " << proc(spawner.pid, "stat")
                                       << proc(spawner.pid, "wchan") << proc(spawner.pid, "status");
  const auto spinning = Clock::now() + std::chrono::seconds(10);
  while (runtimeNs(leaderless.pid) < 1000000 && Clock::now() < spinning) std::this_thread::yield();
  ASSERT_GE(runtimeNs(leaderless.pid), 1000000u) << "the leaderless process never ran";
  EXPECT_FALSE(cg->frozen());

  // Pause after pause catches every kind, a vfork parent asleep with its
  // child caught before its exec included (v1 missed it ~1 time in 5).
  for (int round = 0; round < 20; ++round) {
    Status s = cg->freeze(kept.pid);
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.error().message();
    const uint64_t spawned = counters.at(3), spun = runtimeNs(leaderless.pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(counters.at(3), spawned) << "round " << round << ": the spawner ran while paused";
    // The last microseconds of its slice may be counted after the freezer
    // reported it stopped; a spinning thread that runs on counts ms.
    EXPECT_LT(runtimeNs(leaderless.pid) - spun, 2'000'000u)
        << "round " << round << ": the leaderless process ran while paused";
    Status thawed = cg->thaw();
    ASSERT_TRUE(thawed.ok()) << "round " << round << ": " << thawed.error().message();
    if (!counters.advances(3, spawned)) {
      std::string ps;
      for (pid_t pid : cg->processes()) {
        auto st = os::readFile("/proc/" + std::to_string(pid) + "/stat");
        auto wchan = os::readFile("/proc/" + std::to_string(pid) + "/wchan");
        ps += (st.ok() ? st->substr(0, 40) : "?") + " " + (wchan.ok() ? *wchan : "?") + "\n";
      }
      for (pid_t pid : {kept.pid, paused.pid, spawner.pid, leaderless.pid}) {
        ps += proc(pid, "stat") + proc(pid, "wchan") + "\n";
      }
      ps += proc(spawner.pid, "task/" + std::to_string(spawner.pid) + "/children");
      FAIL() << "round " << round << ": the spawner did not go on after the thaw; frozen=" << cg->frozen() << "\n"
             << ps << "\ncpu tasks: " << os::readFile(cg->procsFiles()[0]).value();
    }
  }

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
  for (os::Child* c : {&kept, &paused, &spawner, &leaderless}) {
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

// A process on its way out is listed by its cgroup while its memory is
// released, and a write of its id "moves" it without effect: a pause passes
// over it (it runs no more of its program) rather than writing it again and
// again until it gives up (a pause failed so under a busy CI, where an
// ending process waited out a time slice).
void passesOverAnEndingProcess(const Layout& layout, const std::string& name) {
  Counters counters;
  auto cg = Cgroup::create(layout, name, {});
  ASSERT_TRUE(cg.ok()) << cg.error().message();
  os::Child big = spawnCounter(cg.value(), layout.version, counters, 0, Kind::kHoldsMemory);
  ASSERT_TRUE(counters.advances(0, 0)) << "it never filled its memory";
  ASSERT_EQ(::kill(big.pid, SIGKILL), 0);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!exiting(big.pid) && Clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(exiting(big.pid)) << "it was never seen on its way out";
  Status s = cg->freeze(0);
  EXPECT_TRUE(s.ok()) << s.error().message();
  auto status = os::waitPidfd(big.pidfd.get());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status.value(), SIGKILL);
  EXPECT_TRUE(cg->thaw().ok());
  Status removed = cg->remove();
  EXPECT_TRUE(removed.ok()) << removed.error().message();
}

// A v1 layout without a freezer hierarchy of its own: a pause says why it
// cannot be.
void withoutAFreezer(const Layout& layout, const std::string& name) {
  Layout without = layout;
  without.v1Parents.erase("freezer");
  auto cg = Cgroup::create(without, name, {});
  ASSERT_TRUE(cg.ok()) << cg.error().message();
  Status s = cg->freeze(0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Code::kUnsupported);
  EXPECT_NE(s.error().message().find("freezer"), std::string::npos) << s.error().message();
}

// Runs `test(layout, name)` on this host's cgroup2 mount, under a parent
// made for it and removed after (skipped where there is no cgroup2 mount):
// nothing of `name` is left.
template <class Test>
void onV2(const std::string& name, Test test) {
  const std::string mount = cgroup2Mount();
  if (mount.empty()) GTEST_SKIP() << "this host has no cgroup2 mount";
  Layout layout;
  layout.version = Version::kV2;
  layout.v2Parent = mount + "/moat-freeze-test-" + std::to_string(::getpid());
  ASSERT_TRUE(os::makeDirs(layout.v2Parent).ok());
  test(layout, name);
  EXPECT_FALSE(os::exists(layout.v2Parent + "/" + name));
  EXPECT_EQ(::rmdir(layout.v2Parent.c_str()), 0);
}

// Runs `test(layout, name)` on this host's prepared v1 layout (skipped where
// its limits are on cgroup v2: the v2 tests cover it), `name` made the
// process's own; with `freezer`, the layout must have a v1 freezer
// hierarchy of its own.
template <class Test>
void onV1(const std::string& name, bool freezer, Test test) {
  auto layout = isolation::cgroup::preparedHostLayout(false);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  if (layout->version != Version::kV1) GTEST_SKIP() << "this host's limits are on cgroup v2 (the v2 tests cover it)";
  if (freezer) {
    ASSERT_TRUE(layout->v1Parents.count("freezer")) << "this host has a v1 freezer hierarchy of its own";
  }
  test(layout.value(), name + "-" + std::to_string(::getpid()));
}

TEST(CgroupFreeze, V2PausesAllButOneAndResumes) {
  MOAT_REQUIRE_ROOT();
  onV2("moat-v2freeze", pauseKeepsOneAndResumes);
}

TEST(CgroupFreeze, V2PassesOverAnEndingProcess) {
  MOAT_REQUIRE_ROOT();
  onV2("moat-v2ending", passesOverAnEndingProcess);
}

TEST(CgroupFreeze, V1PausesAllButOneAndResumes) {
  MOAT_REQUIRE_ROOT();
  onV1("moat-v1freeze", true, pauseKeepsOneAndResumes);
}

TEST(CgroupFreeze, V1PassesOverAnEndingProcess) {
  MOAT_REQUIRE_ROOT();
  onV1("moat-v1ending", true, passesOverAnEndingProcess);
}

TEST(CgroupFreeze, V1WithoutAFreezerSaysSo) {
  MOAT_REQUIRE_ROOT();
  onV1("moat-nofreezer", false, withoutAFreezer);
}

}  // namespace
}  // namespace moat::test
