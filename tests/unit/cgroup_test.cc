#include "isolation/cgroup/cgroup.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "isolation/cgroup/layout.h"
#include "os/file.h"

namespace moat::isolation::cgroup {
namespace {

// This machine: v1 controllers each on its own mount plus cgroup2 at
// /sys/fs/cgroup/unified, and this process in a non-root memory cgroup.
const char kHybridMountinfo[] =
    "22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

const char kHybridProcCgroup[] =
    "9:name=systemd:/\n"
    "8:pids:/\n"
    "7:blkio:/\n"
    "6:freezer:/\n"
    "5:devices:/\n"
    "4:memory:/process_api/abc\n"
    "3:cpuset:/\n"
    "2:cpuacct:/\n"
    "1:cpu:/\n"
    "0::/\n";

TEST(CgroupLayout, HybridHostUsesV1) {
  auto layout = detectLayout(kHybridMountinfo, kHybridProcCgroup);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->version, Version::kV1);
  ASSERT_EQ(layout->v1Parents.size(), 6u);
  EXPECT_EQ(layout->v1Parents.at("cpu"), "/sys/fs/cgroup/cpu/moat");
  EXPECT_EQ(layout->v1Parents.at("cpuacct"), "/sys/fs/cgroup/cpuacct/moat");  // mounted apart: CPU usage
  EXPECT_EQ(layout->v1Parents.at("cpuset"), "/sys/fs/cgroup/cpuset/moat");    // its own: CPUs per environment
  EXPECT_EQ(layout->v1Parents.at("freezer"), "/sys/fs/cgroup/freezer/moat");  // its own: pauses
  EXPECT_EQ(layout->v1Parents.at("memory"), "/sys/fs/cgroup/memory/process_api/abc/moat");
  EXPECT_EQ(layout->v1Parents.at("pids"), "/sys/fs/cgroup/pids/moat");
}

TEST(CgroupLayout, HybridOverrideDoesNotApplyToV1) {
  auto layout = detectLayout(kHybridMountinfo, kHybridProcCgroup, "/sys/fs/cgroup/unified/x");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->version, Version::kV1);
  EXPECT_EQ(layout->v1Parents.at("cpu"), "/sys/fs/cgroup/cpu/moat");
}

TEST(CgroupLayout, CoMountedCpuCpuacct) {
  const char mountinfo[] =
      "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
      "33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:8 - cgroup cgroup "
      "rw,cpu,cpuacct\n"
      "34 30 0:30 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory\n"
      "35 30 0:31 / /sys/fs/cgroup/pids rw,nosuid shared:10 - cgroup cgroup rw,pids\n";
  const char procCgroup[] =
      "4:pids:/user.slice/user-1000.slice\n"
      "3:memory:/user.slice\n"
      "2:cpu,cpuacct:/user.slice\n"
      "1:name=systemd:/user.slice/user-1000.slice/session-1.scope\n";
  auto layout = detectLayout(mountinfo, procCgroup);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->version, Version::kV1);
  EXPECT_EQ(layout->v1Parents.at("cpu"), "/sys/fs/cgroup/cpu,cpuacct/user.slice/moat");
  EXPECT_EQ(layout->v1Parents.count("cpuacct"), 0u);  // the cpu directory has cpuacct.usage
  EXPECT_EQ(layout->v1Parents.at("memory"), "/sys/fs/cgroup/memory/user.slice/moat");
  EXPECT_EQ(layout->v1Parents.at("pids"), "/sys/fs/cgroup/pids/user.slice/user-1000.slice/moat");
}

// cpuacct sharing a hierarchy with memory (or cpuset) is not used: memory's
// directory would be made twice, and a new cpuset cgroup has no CPUs.
TEST(CgroupLayout, CpuacctSharingAHierarchyWithMemoryOrCpusetIsLeftOut) {
  for (const std::string shared : {"memory,cpuacct", "cpuset,cpuacct"}) {
    std::string mountinfo =
        "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
        "33 31 0:30 / /sys/fs/cgroup/x rw - cgroup cgroup rw," +
        shared +
        "\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
    auto layout = detectLayout(mountinfo, "0::/\n");
    ASSERT_TRUE(layout.ok()) << layout.error().message();
    EXPECT_EQ(layout->v1Parents.count("cpuacct"), 0u) << shared;
  }
}

// A freezer sharing a hierarchy with a limit is not used for pauses: moving
// the paused processes there would take them out of their limit's cgroup.
TEST(CgroupLayout, AFreezerSharingAHierarchyWithALimitIsLeftOut) {
  std::string mountinfo =
      "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,freezer\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
  auto layout = detectLayout(mountinfo, "0::/\n");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->v1Parents.count("freezer"), 0u);
}

const char kPureV2Mountinfo[] =
    "22 27 0:21 / /proc rw,nosuid - proc proc rw\n"
    "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";

TEST(CgroupLayout, PureV2) {
  auto layout = detectLayout(kPureV2Mountinfo, "0::/user.slice/x\n");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->version, Version::kV2);
  EXPECT_EQ(layout->v2Parent, "/sys/fs/cgroup/moat");
  EXPECT_TRUE(layout->v1Parents.empty());
}

TEST(CgroupLayout, PureV2WithOverride) {
  auto layout = detectLayout(kPureV2Mountinfo, "0::/user.slice/x\n", "/sys/fs/cgroup/user.slice/./delegated//moat/");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->version, Version::kV2);
  EXPECT_EQ(layout->v2Parent, "/sys/fs/cgroup/user.slice/delegated/moat");
}

TEST(CgroupLayout, HybridWithoutV1MemoryUsesV2) {
  // v1 controllers that do not include memory: memory is free for v2.
  const char mountinfo[] =
      "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  auto layout = detectLayout(mountinfo, "1:cpu:/\n0::/\n");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->version, Version::kV2);
  EXPECT_EQ(layout->v2Parent, "/sys/fs/cgroup/unified/moat");
}

TEST(CgroupLayout, V1WithoutPidsNamesPids) {
  const char mountinfo[] =
      "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  auto layout = detectLayout(mountinfo, "2:memory:/\n1:cpu,cpuacct:/\n0::/\n");
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.error().code, Code::kUnsupported);
  EXPECT_NE(layout.error().context.find("'pids'"), std::string::npos) << layout.error().context;
}

TEST(CgroupLayout, V1WithoutCpuNamesCpu) {
  const char mountinfo[] =
      "33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n"
      "34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
  auto layout = detectLayout(mountinfo, "");
  ASSERT_FALSE(layout.ok()) << "cpuacct/cpuset must not count as cpu";
  EXPECT_NE(layout.error().context.find("'cpu'"), std::string::npos) << layout.error().context;
}

TEST(CgroupLayout, NoCgroupMountsIsAnError) {
  const char mountinfo[] =
      "22 27 0:21 / /proc rw,nosuid - proc proc rw\n"
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n";
  for (const char* text : {mountinfo, ""}) {
    auto layout = detectLayout(text, "0::/\n");
    ASSERT_FALSE(layout.ok());
    EXPECT_EQ(layout.error().code, Code::kUnsupported);
    EXPECT_NE(layout.error().context.find("no cgroup"), std::string::npos) << layout.error().context;
  }
}

TEST(CgroupLayout, NestedContainerMountRoot) {
  // A container that sees its own part of the host's v1 hierarchies: the
  // mounts' roots are /docker/abc and /proc/self/cgroup shows full paths.
  const char mountinfo[] =
      "700 690 0:29 /docker/abc /sys/fs/cgroup/cpu ro,nosuid master:11 - cgroup cgroup rw,cpu\n"
      "701 690 0:32 /docker/abc /sys/fs/cgroup/memory rw,nosuid master:14 - cgroup cgroup "
      "rw,memory\n"
      "702 690 0:36 /docker/abc /sys/fs/cgroup/pids rw,nosuid master:18 - cgroup cgroup "
      "rw,pids\n";
  const char procCgroup[] =
      "8:pids:/docker/abc\n"
      "4:memory:/docker/abc/sub\n"
      "1:cpu:/docker/abc\n";
  auto layout = detectLayout(mountinfo, procCgroup);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->version, Version::kV1);
  EXPECT_EQ(layout->v1Parents.at("cpu"), "/sys/fs/cgroup/cpu/moat");
  EXPECT_EQ(layout->v1Parents.at("memory"), "/sys/fs/cgroup/memory/sub/moat");
  EXPECT_EQ(layout->v1Parents.at("pids"), "/sys/fs/cgroup/pids/moat");
}

TEST(CgroupLayout, NestedContainerRootIsAPathPrefixNotAStringPrefix) {
  // Mount root /docker/abc must not strip "/docker/abc" from "/docker/abcdef".
  const char mountinfo[] =
      "700 690 0:29 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
      "701 690 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "702 690 0:36 /docker/abc /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
  auto layout = detectLayout(mountinfo, "4:memory:/docker/abcdef\n1:cpu:/docker/abc\n");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->v1Parents.at("cpu"), "/sys/fs/cgroup/cpu/moat");
  EXPECT_EQ(layout->v1Parents.at("memory").rfind("/sys/fs/cgroup/memory/", 0), 0u) << layout->v1Parents.at("memory");
}

TEST(CgroupLayout, SkipsMalformedLines) {
  std::string mountinfo = std::string("garbage\n - cgroup\n1 2 3\n") + kPureV2Mountinfo;
  auto layout = detectLayout(mountinfo, "nonsense\n::\n0::/\n");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->version, Version::kV2);
  EXPECT_EQ(layout->v2Parent, "/sys/fs/cgroup/moat");
}

// --- limitWrites -----------------------------------------------------------------

std::string describe(const std::vector<KnobWrite>& writes) {
  std::ostringstream out;
  for (const auto& w : writes) {
    out << "[" << w.controller << "] " << w.file << "=" << w.value << (w.optional ? " (opt)" : "") << "\n";
  }
  return out.str();
}

TEST(CgroupLimits, V2Writes) {
  Limits limits;
  limits.cpus = 1.5;
  limits.memoryBytes = 512ull << 20;
  limits.pids = 64;
  auto writes = limitWrites(Version::kV2, limits);
  EXPECT_EQ(describe(writes),
            "[] cpu.max=15000 10000\n"
            "[] memory.max=536870912\n"
            "[] memory.swap.max=0 (opt)\n"
            "[] pids.max=64\n");
}

TEST(CgroupLimits, V1Writes) {
  Limits limits;
  limits.cpus = 1.5;
  limits.memoryBytes = 512ull << 20;
  limits.pids = 64;
  auto writes = limitWrites(Version::kV1, limits);
  EXPECT_EQ(describe(writes),
            "[cpu] cpu.cfs_period_us=10000\n"
            "[cpu] cpu.cfs_quota_us=15000\n"
            "[memory] memory.limit_in_bytes=536870912\n"
            "[memory] memory.memsw.limit_in_bytes=536870912 (opt)\n"
            "[memory] memory.swappiness=0 (opt)\n"
            "[pids] pids.max=64\n");
}

TEST(CgroupLimits, FractionalCpusRound) {
  Limits limits;
  limits.cpus = 0.01;
  auto v2 = limitWrites(Version::kV2, limits);
  ASSERT_EQ(v2.size(), 1u);
  EXPECT_EQ(v2[0].value, "1000 100000") << "the kernel's smallest quota, 1 ms, in a longer period";
  limits.cpus = 0.05;
  EXPECT_EQ(limitWrites(Version::kV2, limits)[0].value, "1000 20000");
  limits.cpus = 0.1;
  EXPECT_EQ(limitWrites(Version::kV2, limits)[0].value, "1000 10000");
  limits.cpus = 2.333333;
  auto v1 = limitWrites(Version::kV1, limits);
  ASSERT_EQ(v1.size(), 2u);
  EXPECT_EQ(v1[0].value, "10000");
  EXPECT_EQ(v1[1].file, "cpu.cfs_quota_us");
  EXPECT_EQ(v1[1].value, "23333");
}

TEST(CgroupLimits, ZeroLimitsWriteNothing) {
  EXPECT_TRUE(limitWrites(Version::kV1, Limits{}).empty());
  EXPECT_TRUE(limitWrites(Version::kV2, Limits{}).empty());
  Limits onlyPids;
  onlyPids.pids = 5;
  auto writes = limitWrites(Version::kV2, onlyPids);
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].file, "pids.max");
  EXPECT_EQ(writes[0].value, "5");
}

TEST(CgroupUsage, V2ReadsCpuStatCurrentAndEvents) {
  UsageFiles files;
  files.cpu = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n";
  files.memory = "4096000\n";
  files.pids = "7\n";
  files.memoryEvents = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n";
  Usage u = usageFrom(Version::kV2, files);
  ASSERT_TRUE(u.cpuUsec.has_value());
  EXPECT_EQ(*u.cpuUsec, 123456u);
  EXPECT_EQ(u.memoryBytes, 4096000u);
  EXPECT_EQ(u.pids, 7u);
  EXPECT_EQ(u.oomKills, 2u);
}

TEST(CgroupUsage, V1ReadsNanosecondsAndOomControl) {
  UsageFiles files;
  files.cpu = "2500000\n";  // cpuacct.usage: nanoseconds
  files.memory = "8192\n";
  files.pids = "1\n";
  files.memoryEvents = "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n";
  Usage u = usageFrom(Version::kV1, files);
  ASSERT_TRUE(u.cpuUsec.has_value());
  EXPECT_EQ(*u.cpuUsec, 2500u);
  EXPECT_EQ(u.memoryBytes, 8192u);
  EXPECT_EQ(u.oomKills, 4u);
}

TEST(CgroupUsage, AMissingCpuFileIsNoCpuNotZero) {
  UsageFiles files;
  files.memory = "1\n";
  Usage u = usageFrom(Version::kV1, files);
  EXPECT_FALSE(u.cpuUsec.has_value());
  EXPECT_EQ(u.memoryBytes, 1u);
  EXPECT_EQ(u.pids, 0u);
}

// --- prepareParents on a fake cgroupfs -------------------------------------------

class FakeCgroupFs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-cgroup-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    root_ = tmp_ + "/cg";
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
  }
  void TearDown() override {
    if (!tmp_.empty()) (void)os::removeTree(tmp_);
  }
  static void put(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << path;
  }
  static std::string get(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::string trim(std::string s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
    return s;
  }
  Layout v2Layout() const {
    Layout layout;
    layout.version = Version::kV2;
    layout.v2Parent = root_ + "/moat";
    return layout;
  }

  std::string tmp_;
  std::string root_;
};

TEST_F(FakeCgroupFs, V2DelegatesControllersAtBothLevels) {
  put(root_ + "/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
  put(root_ + "/cgroup.subtree_control", "");
  ASSERT_EQ(::mkdir((root_ + "/moat").c_str(), 0755), 0);
  put(root_ + "/moat/cgroup.controllers", "cpu memory pids\n");
  put(root_ + "/moat/cgroup.subtree_control", "");
  Status s = prepareParents(v2Layout());
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(trim(get(root_ + "/cgroup.subtree_control")), "+cpu +memory +pids");
  EXPECT_EQ(trim(get(root_ + "/moat/cgroup.subtree_control")), "+cpu +memory +pids");
}

TEST_F(FakeCgroupFs, V2CreatesTheParentDirectory) {
  // On a real cgroupfs the kernel fills the new directory's files; here the
  // new directory is empty, so prepareParents creates it, enables the
  // controllers one level up, and then fails to read the new level's list.
  put(root_ + "/cgroup.controllers", "cpu memory pids");
  put(root_ + "/cgroup.subtree_control", "");
  Status s = prepareParents(v2Layout());
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/moat").c_str(), &st), 0) << "parent not created";
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(trim(get(root_ + "/cgroup.subtree_control")), "+cpu +memory +pids");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("cgroup.controllers"), std::string::npos) << s.error().message();
}

TEST_F(FakeCgroupFs, V2MissingMemoryNamesMemory) {
  put(root_ + "/cgroup.controllers", "cpu io pids\n");
  put(root_ + "/cgroup.subtree_control", "");
  ASSERT_EQ(::mkdir((root_ + "/moat").c_str(), 0755), 0);
  put(root_ + "/moat/cgroup.controllers", "cpu pids\n");
  put(root_ + "/moat/cgroup.subtree_control", "");
  Status s = prepareParents(v2Layout());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Code::kUnsupported);
  EXPECT_NE(s.error().context.find("'memory'"), std::string::npos) << s.error().context;
  EXPECT_NE(s.error().context.find(root_), std::string::npos) << s.error().context;
  // Nothing was enabled where the check failed.
  EXPECT_EQ(get(root_ + "/cgroup.subtree_control"), "");
}

TEST_F(FakeCgroupFs, V2ControllerMatchIsByWordNotSubstring) {
  // "cpuset" is not "cpu": a hierarchy without the cpu controller must be refused.
  put(root_ + "/cgroup.controllers", "cpuset io memory pids\n");
  put(root_ + "/cgroup.subtree_control", "");
  ASSERT_EQ(::mkdir((root_ + "/moat").c_str(), 0755), 0);
  put(root_ + "/moat/cgroup.controllers", "cpuset memory pids\n");
  put(root_ + "/moat/cgroup.subtree_control", "");
  Status s = prepareParents(v2Layout());
  EXPECT_NE(s.error().context.find("'cpu'"), std::string::npos) << s.error().context;
}

TEST_F(FakeCgroupFs, V2MissingSubtreeControlIsAnError) {
  put(root_ + "/cgroup.controllers", "cpu memory pids\n");
  // No cgroup.subtree_control: writeExisting must not create it.
  Status s = prepareParents(v2Layout());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().context.find("subtree_control"), std::string::npos) << s.error().context;
  EXPECT_FALSE(os::exists(root_ + "/cgroup.subtree_control"));
}

// A cpuset shared with another controller is left out (that directory
// would be made twice, or hold no CPUs to join).
TEST(CgroupLayout, CpusetSharingAHierarchyIsLeftOut) {
  std::string mountinfo =
      "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
      "33 31 0:30 / /sys/fs/cgroup/x rw - cgroup cgroup rw,cpuset,memory\n"
      "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
  auto layout = detectLayout(mountinfo, "0::/\n");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->v1Parents.count("cpuset"), 0u);
}

// moat's cpuset parent takes its parent's CPUs and memory nodes (a new v1
// cpuset has none); one it cannot make stops nothing.
TEST_F(FakeCgroupFs, V1CpusetParentTakesItsParentsCpusAndMems) {
  Layout layout;
  layout.version = Version::kV1;
  ASSERT_TRUE(os::makeDirs(root_ + "/cpuset/moat").ok());
  ASSERT_TRUE(os::writeFile(root_ + "/cpuset/cpuset.cpus", "0-3\n").ok());
  ASSERT_TRUE(os::writeFile(root_ + "/cpuset/cpuset.mems", "0\n").ok());
  ASSERT_TRUE(os::writeFile(root_ + "/cpuset/moat/cpuset.cpus", "").ok());
  ASSERT_TRUE(os::writeFile(root_ + "/cpuset/moat/cpuset.mems", "").ok());
  layout.v1Parents = {{"cpu", root_ + "/cpu/moat"},
                      {"memory", root_ + "/memory/moat"},
                      {"pids", root_ + "/pids/moat"},
                      {"cpuset", root_ + "/cpuset/moat"}};
  ASSERT_TRUE(prepareParents(layout).ok());
  EXPECT_EQ(os::readFile(root_ + "/cpuset/moat/cpuset.cpus").value(), "0-3\n");
  EXPECT_EQ(os::readFile(root_ + "/cpuset/moat/cpuset.mems").value(), "0\n");
  layout.v1Parents["cpuset"] = root_ + "/not-a-dir-file/moat";
  ASSERT_TRUE(os::writeFile(root_ + "/not-a-dir-file", "").ok());
  EXPECT_TRUE(prepareParents(layout).ok());
}

TEST_F(FakeCgroupFs, V1CreatesEveryParent) {
  Layout layout;
  layout.version = Version::kV1;
  layout.v1Parents = {
      {"cpu", root_ + "/cpu/moat"}, {"memory", root_ + "/memory/a/b/moat"}, {"pids", root_ + "/pids/moat"}};
  Status s = prepareParents(layout);
  ASSERT_TRUE(s.ok()) << s.error().message();
  for (const auto& [c, dir] : layout.v1Parents) EXPECT_TRUE(os::isDirectory(dir)) << dir;
}

// Accounting is optional: a cpuacct parent moat cannot make stops nothing.
TEST_F(FakeCgroupFs, V1WithoutRoomForCpuacctStillPrepares) {
  put(root_ + "/acct", "a file where the hierarchy would be");
  Layout layout;
  layout.version = Version::kV1;
  layout.v1Parents = {{"cpu", root_ + "/cpu/moat"},
                      {"memory", root_ + "/memory/moat"},
                      {"pids", root_ + "/pids/moat"},
                      {"cpuacct", root_ + "/acct/moat"}};
  Status s = prepareParents(layout);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_TRUE(os::isDirectory(root_ + "/pids/moat"));
  layout.v1Parents.erase("cpuacct");
  layout.v1Parents["memory"] = root_ + "/acct/moat";  // a required one is still required
  EXPECT_FALSE(prepareParents(layout).ok());
}

}  // namespace
}  // namespace moat::isolation::cgroup
