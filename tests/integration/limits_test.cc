// What an environment sees of its own limits (docs/SECURITY.md, "Limits
// inside"): /proc's memory, CPU and load files from LXCFS, and as many CPUs
// as its CPU limit allows. As root on the real kernel, through `moat run`
// and moatd, as a user would meet them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <sstream>
#include <string>

#include "isolation/proc/lxcfs.h"
#include "moat_process.h"
#include "moatd_fixture.h"
#include "os/file.h"
#include "os/process.h"

namespace moat::test {
namespace {

// A field of /proc/meminfo's text in kB; -1 when missing.
long meminfoKb(const std::string& text, const std::string& field) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

int countLinesStartingWith(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0;
  return n;
}

long hostCpus() { return ::sysconf(_SC_NPROCESSORS_ONLN); }

// LXCFS is part of what these tests check: without it they fail and say so,
// rather than skip (the package is a dependency of moat, install-deps.sh).
void requireLxcfsInstalled() { ASSERT_EQ(::access("/usr/bin/lxcfs", X_OK), 0) << "install the lxcfs package"; }

std::string readOrEmpty(const std::string& path) {
  auto text = os::readFile(path, 1 << 20);
  return text.ok() ? text.value() : "";
}

// What the host-wide lxcfs is doing, for a failure's message: its pid
// file, the end of its log, the mount.
std::string lxcfsState() {
  const auto config = isolation::proc::lxcfsConfigFromEnvironment();
  std::string out = "lxcfs at " + config.dir + ": pid file " + readOrEmpty(config.dir + ".pid");
  std::string text = readOrEmpty(config.dir + ".log");
  out += "\nits log's end:\n" + text.substr(text.size() > 2000 ? text.size() - 2000 : 0);
  return out;
}

// An lxcfs of a test's own, at a directory of its own, ended with the test.
struct OwnLxcfs {
  OwnLxcfs() {
    char tmpl[] = "/tmp/moat-lxcfs-XXXXXX";
    config.dir = std::string(::mkdtemp(tmpl)) + "/mnt";
  }
  ~OwnLxcfs() {
    for (pid_t pid : started) {
      if (auto fd = os::pidfdOpen(pid); fd.ok()) {
        (void)os::pidfdSendSignal(fd->get(), SIGKILL);
        while (!os::pidfdExited(fd->get())) ::usleep(1000);  // not our child: no wait
      }
    }
    ::umount2(config.dir.c_str(), MNT_DETACH);
    (void)os::removeTree(config.dir.substr(0, config.dir.rfind('/')));
  }
  pid_t ensure() {
    auto pid = isolation::proc::ensureLxcfs(config);
    EXPECT_TRUE(pid.ok()) << pid.error().message();
    if (!pid.ok()) return -1;
    started.push_back(pid.value());
    return pid.value();
  }
  std::string log() const { return readOrEmpty(config.dir + ".log"); }
  isolation::proc::LxcfsConfig config;
  std::vector<pid_t> started;
};

class Limits : public ::testing::Test {
 protected:
  void SetUp() override {
    MOAT_REQUIRE_ROOT();
    requireLxcfsInstalled();
    // The host-wide one serves these tests' environments: a failure to
    // have one says why here, rather than as a host value below.
    auto trees = isolation::proc::lxcfsProcTrees(isolation::proc::lxcfsConfigFromEnvironment());
    ASSERT_TRUE(trees.ok()) << trees.error().message() << "\n" << lxcfsState();
  }
  ProcessResult run(const std::vector<std::string>& flags, const std::string& script,
                    const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> args = {"run"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--", "sh", "-c", script});
    return runMoat(args, "", env);
  }
};

TEST_F(Limits, MemoryLimitIsTheMemoryInProcMeminfoAndFree) {
  auto r = run({"--memory", "512"}, "cat /proc/meminfo; echo ---; free -k");
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(meminfoKb(r.out, "MemTotal"), 512 * 1024) << r.out << lxcfsState();
  long available = meminfoKb(r.out, "MemAvailable");
  EXPECT_GT(available, 0);
  EXPECT_LE(available, 512 * 1024);
  // free(1) reads the same file: its total is the limit.
  auto at = r.out.find("\nMem:");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::istringstream freeLine(r.out.substr(at + 5));
  long total = 0;
  freeLine >> total;
  EXPECT_EQ(total, 512 * 1024) << r.out;
}

TEST_F(Limits, OneCpuIsOneCpuForNprocAndSchedGetaffinity) {
  if (hostCpus() < 2) GTEST_SKIP() << "a host with one CPU shows one either way";
  auto r = run({"--cpus", "1"}, "nproc; python3 -c 'import os; print(len(os.sched_getaffinity(0)))'");
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "1\n1\n");
  // 1.5 CPUs: two may run at once.
  if (hostCpus() > 2) {
    auto two = run({"--cpus", "1.5"}, "nproc");
    EXPECT_EQ(two.out, "2\n") << two.err;
  }
}

TEST_F(Limits, ProcStatLoadavgUptimeAndCpuinfoAreLxcfsViews) {
  auto r = run({"--cpus", "1"},
               "grep -c ^processor /proc/cpuinfo; grep -c '^cpu[0-9]' /proc/stat; cat /proc/loadavg; "
               "cat /proc/uptime; grep /proc/ /proc/self/mountinfo");
  ASSERT_EQ(r.exitCode, 0) << r.err;
  std::istringstream in(r.out);
  int processors = 0, statCpus = 0;
  in >> processors >> statCpus;
  EXPECT_GE(processors, 1);
  EXPECT_GE(statCpus, 1);
  // Each file is LXCFS's, bound read-only over procfs's.
  for (const char* file : {"/proc/meminfo", "/proc/cpuinfo", "/proc/stat", "/proc/loadavg", "/proc/uptime"}) {
    auto at = r.out.find(std::string(" ") + file + " ");
    ASSERT_NE(at, std::string::npos) << file << " is not a mount:\n" << r.out;
    std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(line.find(" ro,"), std::string::npos) << line;
    EXPECT_NE(line.find("fuse.lxcfs"), std::string::npos) << line;
  }
  // /proc/stat's first line is the all-CPU sum, as the kernel writes it.
  auto stat = run({"--cpus", "1"}, "head -1 /proc/stat");
  ASSERT_EQ(stat.exitCode, 0) << stat.err;
  std::istringstream cpuLine(stat.out);
  std::string cpu;
  long user = -1, nice = -1, system = -1;
  cpuLine >> cpu >> user >> nice >> system;
  EXPECT_EQ(cpu, "cpu");
  EXPECT_GE(user, 0);
  EXPECT_GE(system, 0);
}

TEST_F(Limits, OneCpuIsOneProcessorInCpuinfoAndOneCpuLineInStat) {
  if (hostCpus() < 2) GTEST_SKIP() << "a host with one CPU shows one either way";
  auto r = run({"--cpus", "1"}, "grep -c ^processor /proc/cpuinfo; grep -c '^cpu[0-9]' /proc/stat; head -1 /proc/stat");
  ASSERT_EQ(r.exitCode, 0) << r.err;
  std::istringstream in(r.out);
  int processors = 0, statCpus = 0;
  std::string cpu;
  long user = -1, nice = -1, system = -1;
  in >> processors >> statCpus >> cpu >> user >> nice >> system;
  EXPECT_EQ(processors, 1) << r.out;
  EXPECT_EQ(statCpus, 1) << r.out;
  EXPECT_LT(user + system, 1000) << "clock ticks of a fresh environment: " << r.out;
}

TEST_F(Limits, InsideNobodyCanUnmountRemountOrWriteTheLxcfsFiles) {
  auto r = run({"--memory", "256"},
               "umount /proc/meminfo 2>&1; umount -l /proc/meminfo 2>&1; "
               "mount -o remount,rw,bind /proc/meminfo 2>&1; "
               "echo x > /proc/meminfo 2>&1; echo x > /proc/loadavg 2>&1; "
               "grep MemTotal /proc/meminfo");
  EXPECT_EQ(countLinesStartingWith(r.out, "MemTotal:"), 1) << r.out;
  EXPECT_EQ(meminfoKb(r.out, "MemTotal"), 256 * 1024) << r.out;
  EXPECT_EQ(countLinesStartingWith(r.out, "umount:"), 2) << r.out;
  EXPECT_EQ(countLinesStartingWith(r.out, "mount:"), 1) << r.out;
  // The shell reports a failed redirection itself, on its stderr.
  EXPECT_EQ(countLinesStartingWith(r.err, "sh: 1: cannot create /proc/"), 2) << "both writes refused:\n" << r.err;
}

TEST_F(Limits, WithLxcfsOffTheEnvironmentStillStartsAndShowsTheHost) {
  auto r = run({"--memory", "512"}, "grep MemTotal /proc/meminfo; grep -c lxcfs /proc/self/mountinfo",
               {{"MOAT_LXCFS", "off"}});
  ASSERT_EQ(r.exitCode, 1) << "grep -c counts no lxcfs mount, and says so with 1: " << r.out << r.err;
  auto host = os::readFile("/proc/meminfo");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(meminfoKb(r.out, "MemTotal"), meminfoKb(host.value(), "MemTotal")) << r.out;
}

TEST_F(Limits, AMissingLxcfsBinaryStillStartsTheEnvironment) {
  char tmpl[] = "/tmp/moat-lxcfs-missing-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  auto r = run({"--memory", "512"}, "grep MemTotal /proc/meminfo",
               {{"MOAT_LXCFS", "/no/such/lxcfs"}, {"MOAT_LXCFS_DIR", dir + "/mnt"}});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  auto host = os::readFile("/proc/meminfo");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(meminfoKb(r.out, "MemTotal"), meminfoKb(host.value(), "MemTotal")) << r.out;
  EXPECT_EQ(r.err, "") << "moat run keeps its command's stderr to the command";
  (void)os::removeTree(dir);
}

// An lxcfs of the test's own, killed: the next environment gets a new one
// and reads its limits again.
TEST_F(Limits, ADeadLxcfsIsReplacedByTheNextCreate) {
  OwnLxcfs own;
  pid_t first = own.ensure();
  ASSERT_GT(first, 0);
  EXPECT_EQ(own.ensure(), first) << "a live one is used, not started twice";
  auto pidfd = os::pidfdOpen(first);
  ASSERT_TRUE(pidfd.ok());
  ASSERT_TRUE(os::pidfdSendSignal(pidfd->get(), SIGKILL).ok());
  while (!os::pidfdExited(pidfd->get())) ::usleep(1000);  // not our child: no wait
  // Its mount point answers from the cache for a moment, then fails even
  // stat (ENOTCONN), as after a crash long ago: the state to recover from.
  struct stat st;
  for (int i = 0; i < 10000 && ::stat(own.config.dir.c_str(), &st) == 0; ++i) ::usleep(1000);
  ASSERT_NE(::stat(own.config.dir.c_str(), &st), 0);
  ASSERT_EQ(errno, ENOTCONN);
  auto r = run({"--memory", "384"}, "grep MemTotal /proc/meminfo", {{"MOAT_LXCFS_DIR", own.config.dir}});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(meminfoKb(r.out, "MemTotal"), 384 * 1024) << r.out;
  pid_t second = own.ensure();
  EXPECT_NE(second, first);
}

// SIGUSR2 switches an lxcfs to the host's own values (lxcfs(8)): one in
// that mode is of no use to an environment, and the next create replaces it.
TEST_F(Limits, AnLxcfsThatServesTheHostsValuesIsReplaced) {
  OwnLxcfs own;
  pid_t first = own.ensure();
  ASSERT_GT(first, 0);
  auto pidfd = os::pidfdOpen(first);
  ASSERT_TRUE(pidfd.ok());
  ASSERT_TRUE(os::pidfdSendSignal(pidfd->get(), SIGUSR2).ok());
  for (int i = 0; i < 5000 && own.log().find("non-virtualization") == std::string::npos; ++i) ::usleep(1000);
  ASSERT_FALSE(isolation::proc::lxcfsLogSaysVirtualizing(own.log())) << own.log();
  auto r = run({"--memory", "384"}, "grep MemTotal /proc/meminfo", {{"MOAT_LXCFS_DIR", own.config.dir}});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(meminfoKb(r.out, "MemTotal"), 384 * 1024) << r.out;
  EXPECT_NE(own.ensure(), first);
  // Detached, not killed (environments bound to it keep reading): with
  // nothing bound to it, it ends by itself.
  for (int i = 0; i < 5000 && !os::pidfdExited(pidfd->get()); ++i) ::usleep(1000);
  EXPECT_TRUE(os::pidfdExited(pidfd->get())) << "the one that served the host's values ended once unmounted";
}

// A live mount whose pid file names no lxcfs (one of another pid
// namespace, a pid file lost): a new lxcfs takes the mount point.
TEST_F(Limits, AnLxcfsItsPidFileDoesNotNameIsReplaced) {
  OwnLxcfs own;
  pid_t first = own.ensure();
  ASSERT_GT(first, 0);
  ASSERT_TRUE(os::writeFile(own.config.dir + ".pid", "1\n").ok());
  pid_t second = own.ensure();
  EXPECT_GT(second, 0);
  EXPECT_NE(second, first);
  auto r = run({"--memory", "320"}, "grep MemTotal /proc/meminfo", {{"MOAT_LXCFS_DIR", own.config.dir}});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(meminfoKb(r.out, "MemTotal"), 320 * 1024) << r.out;
}

TEST(LxcfsLog, SaysWhetherItServesTheReadersLimits) {
  using isolation::proc::lxcfsLogSaysVirtualizing;
  EXPECT_TRUE(lxcfsLogSaysVirtualizing(""));
  EXPECT_TRUE(lxcfsLogSaysVirtualizing("Running constructor lxcfs_init to reload liblxcfs\nhierarchies:\n"));
  EXPECT_FALSE(lxcfsLogSaysVirtualizing(
      "Running constructor lxcfs_init to reload liblxcfs\nFailed to run constructor lxcfs_init to reload liblxcfs\n"));
  // A reload that worked after one that failed.
  EXPECT_TRUE(lxcfsLogSaysVirtualizing(
      "Running constructor lxcfs_init\nFailed to run constructor lxcfs_init\nRunning constructor lxcfs_init\n"));
  EXPECT_FALSE(lxcfsLogSaysVirtualizing("Switched into non-virtualization mode\n"));
  EXPECT_TRUE(lxcfsLogSaysVirtualizing("Switched into non-virtualization mode\nSwitched into virtualization mode\n"));
  EXPECT_FALSE(
      lxcfsLogSaysVirtualizing("Switched into non-virtualization mode\nSwitched into virtualization mode\n"
                               "Switched into non-virtualization mode\n"));
}

class LimitsMoatd : public MoatdFixture {};

TEST_F(LimitsMoatd, EnvironmentsShowTheirLimitsAcrossARestartAndLeaveNoMountBehind) {
  requireLxcfsInstalled();
  std::string id = createEnv({{"spec", {{"ram_mb", 512}, {"cpus", 1}}}});
  auto read = [&](const std::string& envId) {
    return exec(envId, {{"cmd", {"sh", "-c", "cat /proc/meminfo; nproc"}}})["stdout"].get<std::string>();
  };
  std::string before = read(id);
  EXPECT_EQ(meminfoKb(before, "MemTotal"), 512 * 1024) << before << lxcfsState();
  if (hostCpus() > 1) {
    EXPECT_NE(before.find("\n1\n"), std::string::npos) << before;
  }
  daemon_->kill9();
  daemon_->restart();
  EXPECT_EQ(meminfoKb(read(id), "MemTotal"), 512 * 1024);
  std::string other = createEnv({{"spec", {{"ram_mb", 256}}}});
  EXPECT_EQ(meminfoKb(read(other), "MemTotal"), 256 * 1024);
  // An environment without a CPU limit beyond the host's sees every CPU.
  std::string wide = createEnv({{"spec", {{"cpus", static_cast<double>(hostCpus())}}}});
  auto nproc = exec(wide, {{"cmd", {"nproc"}}})["stdout"].get<std::string>();
  EXPECT_EQ(nproc, std::to_string(hostCpus()) + "\n");
  // The binds live in the environments' mount namespaces only: the host's
  // mount table holds none of them before or after.
  for (const auto& envId : {id, other, wide}) call("DELETE", "/v1/environments/" + envId, nullptr, 204);
  auto mounts = os::readFile("/proc/self/mountinfo", 4 << 20);
  ASSERT_TRUE(mounts.ok());
  EXPECT_EQ(mounts->find(" /proc/meminfo "), std::string::npos);
  EXPECT_EQ(mounts->find("/proc/meminfo"), std::string::npos);
  EXPECT_EQ(daemon_->log().find("warning"), std::string::npos) << daemon_->log();
}

// moatd's environments (the exec gate's listener takes the statfs calls
// too): df shows storage_gb, across a restart of moatd, and under rules
// that judge every program.
TEST_F(LimitsMoatd, DfShowsTheStorageLimitThroughTheExecGateAndAcrossARestart) {
  std::string id = createEnv({{"spec", {{"storage_gb", 0.125}}}});
  auto df = [&](const std::string& envId) {
    return exec(envId, {{"cmd", {"sh", "-c", "df -B1 /workspace | tail -1; stat -f -c '%b %T' /proc"}}})["stdout"]
        .get<std::string>();
  };
  std::string before = df(id);
  EXPECT_NE(before.find(" 134217728 "), std::string::npos) << before;
  EXPECT_NE(before.find("\n0 proc\n"), std::string::npos) << before;
  daemon_->kill9();
  daemon_->restart();
  EXPECT_NE(df(id).find(" 134217728 "), std::string::npos);
  std::string judged = createEnv({{"spec", {{"storage_gb", 0.25}}},
                                  {"permissions",
                                   {{"run_command",
                                     {{{"match", {"sh", "*"}}, {"action", "allow"}},
                                      {{"match", {"df", "*"}}, {"action", "allow"}},
                                      {{"match", {"tail", "*"}}, {"action", "allow"}},
                                      {{"match", {"stat", "*"}}, {"action", "allow"}}}}}}});
  std::string out = df(judged);
  EXPECT_NE(out.find(" 268435456 "), std::string::npos) << out;
  for (const auto& envId : {id, judged}) call("DELETE", "/v1/environments/" + envId, nullptr, 204);
}

// A volume without a limit (one cleared from the host; moat makes every
// volume with one): df shows the pool, the real answer.
TEST_F(LimitsMoatd, AVolumeWithoutALimitShowsThePool) {
  std::string id = createEnv({{"spec", {{"storage_gb", 0.125}}}});
  auto df = [&] {
    return exec(id, {{"cmd", {"sh", "-c", "stat -f -c '%S %b' /workspace"}}})["stdout"].get<std::string>();
  };
  ASSERT_EQ(df(), "4096 32768\n");
  std::string volume = daemon_->stateDir() + "/storage/envs/" + id;
  auto cleared = runProcess({"/usr/bin/btrfs", "qgroup", "limit", "none", volume});
  ASSERT_EQ(cleared.exitCode, 0) << cleared.err;
  struct statfs pool;
  ASSERT_EQ(::statfs(volume.c_str(), &pool), 0);
  EXPECT_EQ(df(), std::to_string(pool.f_frsize) + " " + std::to_string(pool.f_blocks) + "\n");
  call("DELETE", "/v1/environments/" + id, nullptr, 204);
}

// Without lxcfs, moatd says why once, and its environments still start.
TEST(LimitsMoatdWithoutLxcfs, MoatdWarnsOnceAndEnvironmentsStillStart) {
  MOAT_REQUIRE_ROOT();
  char tmpl[] = "/tmp/moat-lxcfs-none-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  {
    Moatd daemon({}, {"MOAT_LXCFS=/no/such/lxcfs", "MOAT_LXCFS_DIR=" + dir + "/mnt"});
    for (int i = 0; i < 2; ++i) {
      auto created = daemon.request("POST", "/v1/environments", R"({"spec":{"ram_mb":512}})");
      ASSERT_EQ(created.status, 201) << created.body;
      std::string id = nlohmann::json::parse(created.body)["id"];
      auto ran = daemon.request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["cat","/proc/meminfo"]})");
      ASSERT_EQ(ran.status, 200) << ran.body;
      auto host = os::readFile("/proc/meminfo");
      ASSERT_TRUE(host.ok());
      EXPECT_EQ(meminfoKb(nlohmann::json::parse(ran.body)["stdout"], "MemTotal"), meminfoKb(host.value(), "MemTotal"));
    }
    std::string log = daemon.log();
    size_t first = log.find("moatd: warning: environments will show the host's memory");
    ASSERT_NE(first, std::string::npos) << log;
    EXPECT_NE(log.find("/no/such/lxcfs", first), std::string::npos) << "the warning names the reason: " << log;
    EXPECT_EQ(log.find("moatd: warning", first + 1), std::string::npos) << "once: " << log;
  }
  (void)os::removeTree(dir);
}

TEST(LimitsHostValues, AnEnvironmentWithoutLimitsBeyondTheHostSeesTheHostsCpus) {
  MOAT_REQUIRE_ROOT();
  auto r = runMoat({"run", "--cpus", std::to_string(hostCpus()), "--", "nproc"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, std::to_string(hostCpus()) + "\n");
}

// `stat -f -c '%S %b %f %a %T'`: block size, blocks, free, available, type.
struct FsNumbers {
  long long unit = -1, blocks = -1, freeBlocks = -1, avail = -1;
  std::string type;
};
// The line after `label` in the output.
FsNumbers fsNumbersAfter(const std::string& out, const std::string& label) {
  FsNumbers n;
  auto at = out.find(label + "\n");
  if (at == std::string::npos) return n;
  std::istringstream line(out.substr(at + label.size() + 1));
  line >> n.unit >> n.blocks >> n.freeBlocks >> n.avail >> n.type;
  return n;
}

constexpr long long kMiB = 1 << 20;

// df inside shows the environment's own disk (docs/SECURITY.md, "Limits
// inside"): its volume's qgroup limit and usage, answered by moat-init for
// statfs and fstatfs of the root; every other file system as it is. Both
// ways moat-init runs: exec'd (as moatd's environments) and in process.
class LimitsDisk : public Limits, public ::testing::WithParamInterface<const char*> {};

TEST_P(LimitsDisk, StorageLimitIsWhatDfAndStatFShowAndUsageGrowsWithAFile) {
  const std::string fmt = "stat -f -c '%S %b %f %a %T' ";
  auto r =
      run({"--storage", "0.125"},  // 128 MiB
          "df -B1 /workspace | tail -1; echo root; " + fmt + "/; echo ws; " + fmt +
              "/workspace; dd if=/dev/zero of=/workspace/f bs=1M count=20 status=none && sync; echo after; " + fmt +
              "/workspace; echo fd; python3 -c 'import os; s = os.statvfs(os.open(\"/workspace/f\", "
              "os.O_RDONLY)); print(s.f_frsize, s.f_blocks, s.f_bfree, s.f_bavail, \"x\")'; echo proc; " +
              fmt + "/proc; echo dev; " + fmt + "/dev",
          {{"MOAT_INIT_MODE", GetParam()}});
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  // df's line: "overlay 134217728 used avail use% /"
  std::istringstream df(r.out);
  std::string source;
  long long size = 0;
  df >> source >> size;
  EXPECT_EQ(size, 128 * kMiB) << r.out;
  auto root = fsNumbersAfter(r.out, "root");
  auto ws = fsNumbersAfter(r.out, "ws");
  auto after = fsNumbersAfter(r.out, "after");
  auto fd = fsNumbersAfter(r.out, "fd");
  ASSERT_GT(ws.unit, 0) << r.out;
  EXPECT_EQ(ws.blocks * ws.unit, 128 * kMiB) << r.out;
  EXPECT_EQ(root.blocks, ws.blocks) << "/ and /workspace are one volume: " << r.out;
  EXPECT_LE(ws.freeBlocks, ws.blocks) << r.out;
  EXPECT_LE(ws.avail, ws.freeBlocks) << r.out;
  // 20 MiB written and committed (sync): at least that much less free.
  EXPECT_EQ(after.blocks, ws.blocks) << r.out;
  EXPECT_LE(after.freeBlocks * after.unit, ws.freeBlocks * ws.unit - 20 * kMiB) << r.out;
  EXPECT_GT(after.freeBlocks * after.unit, ws.freeBlocks * ws.unit - 40 * kMiB) << r.out;
  // fstatfs on a descriptor of a file on the root: the same view.
  EXPECT_EQ(fd.blocks * fd.unit, 128 * kMiB) << r.out;
  EXPECT_EQ(fd.freeBlocks, after.freeBlocks) << r.out;
  // /proc and /dev: their own file systems, untouched.
  auto proc = fsNumbersAfter(r.out, "proc");
  EXPECT_EQ(proc.type, "proc") << r.out;
  EXPECT_EQ(proc.blocks, 0) << r.out;
  auto dev = fsNumbersAfter(r.out, "dev");
  EXPECT_NE(dev.type, root.type) << r.out;
  EXPECT_NE(dev.blocks * dev.unit, 128 * kMiB) << r.out;
}

// moat-init answers statfs for the caller with the caller's rights: a path
// under a directory another user may not search is EACCES for that user,
// as the kernel makes it, not an answer that says it exists (review
// finding L7); what the user may reach still shows the limit.
TEST_P(LimitsDisk, AStatfsReachesOnlyWhatItsCallerMayReach) {
  const std::string probe =
      "import os\n"
      "os.makedirs('/root/private/inside', exist_ok=True); os.chmod('/root/private', 0o700)\n"
      "print('root', os.statvfs('/root/private/inside').f_blocks * os.statvfs('/').f_frsize)\n"
      "r, w = os.pipe(); hold, held = os.pipe()\n"
      "child = os.fork()\n"
      "if child == 0:\n"
      "    os.close(held); os.chdir('/root/private/inside'); os.write(w, b'x'); os.read(hold, 1); os._exit(0)\n"
      "os.close(hold); os.read(r, 1)\n"
      "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
      "# root's process's cwd through /proc: the kernel refuses nobody that link\n"
      "for path in ('/root/private/inside', '/root/private/none', f'/proc/{child}/cwd'):\n"
      "    try:\n"
      "        os.statvfs(path); print('nobody', path, 'answered')\n"
      "    except OSError as e:\n"
      "        print('nobody', path, e.errno)\n"
      "print('nobody /workspace', os.statvfs('/workspace').f_blocks * os.statvfs('/workspace').f_frsize)\n";
  auto r = runMoat({"run", "--storage", "0.125", "--", "python3", "-c", probe}, "", {{"MOAT_INIT_MODE", GetParam()}});
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("root " + std::to_string(128 * kMiB) + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nobody /root/private/inside 13\n"), std::string::npos) << "EACCES: " << r.out;
  EXPECT_NE(r.out.find("nobody /root/private/none 13\n"), std::string::npos) << "the same for a missing one: " << r.out;
  EXPECT_NE(r.out.find("/cwd 13\n"), std::string::npos)
      << "not through moat-init's right to other processes' /proc links: " << r.out;
  EXPECT_NE(r.out.find("nobody /workspace " + std::to_string(128 * kMiB) + "\n"), std::string::npos) << r.out;
}

TEST_P(LimitsDisk, AHostDirectoryMountedInsideShowsTheHostsFileSystem) {
  char tmpl[] = "/tmp/moat-disk-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  struct statfs host;
  ASSERT_EQ(::statfs(dir.c_str(), &host), 0);
  auto r = run({"--storage", "0.125", "-v", dir + ":/mnt/host"}, "echo host; stat -f -c '%S %b %f %a %T' /mnt/host",
               {{"MOAT_INIT_MODE", GetParam()}});
  (void)os::removeTree(dir);
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  auto inside = fsNumbersAfter(r.out, "host");
  EXPECT_EQ(inside.unit, static_cast<long long>(host.f_frsize)) << r.out;
  EXPECT_EQ(inside.blocks, static_cast<long long>(host.f_blocks)) << r.out;
}

TEST_P(LimitsDisk, BadBuffersAndDescriptorsGetTheKernelsAnswers) {
  // A buffer nowhere, a path nowhere, descriptors not open, paths that are
  // not there: the kernel's own errors (EFAULT, EBADF, ENOENT), and
  // moat-init answers the calls after them.
  auto r = run({"--storage", "0.125"},
               "python3 -c '\n"
               "import ctypes, os\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               "buf = ctypes.create_string_buffer(256)\n"
               "def call(nr, a, b):\n"
               "    r = libc.syscall(nr, a, b)\n"
               "    return 0 if r == 0 else ctypes.get_errno()\n"
               "print(call(137, b\"/workspace\", ctypes.c_void_p(8)))\n"
               "print(call(137, ctypes.c_void_p(8), buf))\n"
               "print(call(138, 987, buf))\n"
               "print(call(138, -1, buf))\n"
               "print(call(137, b\"/no/such\", buf))\n"
               "print(call(137, b\"\", buf))\n"
               "print(call(137, b\"/workspace\", buf))\n"
               "'; df -B1 / | tail -1",
               {{"MOAT_INIT_MODE", GetParam()}});
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  EXPECT_EQ(r.out.substr(0, r.out.rfind("\n", r.out.size() - 2) + 1), "14\n14\n9\n9\n2\n2\n0\n") << r.out;
  EXPECT_NE(r.out.find(" 134217728 "), std::string::npos) << r.out;
}

TEST_P(LimitsDisk, AThreadRemappingTheBufferAndKilledCallersLeaveMoatInitServing) {
  // One thread unmaps and maps again the page another has statfs write to;
  // callers killed in the middle of their calls. Each call gets the answer
  // or EFAULT, and moat-init answers whatever comes after.
  auto r = run(
      {"--storage", "0.125"},
      "python3 -c '\n"
      "import ctypes, threading\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "libc.mmap.restype = ctypes.c_void_p\n"
      "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, "
      "ctypes.c_int, ctypes.c_long]\n"
      "libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]\n"
      "addr = libc.mmap(None, 4096, 3, 0x22, -1, 0)\n"
      "stop = []\n"
      "def flip():\n"
      "    while not stop:\n"
      "        libc.munmap(addr, 4096)\n"
      "        libc.mmap(addr, 4096, 3, 0x32, -1, 0)\n"
      "t = threading.Thread(target=flip)\n"
      "t.start()\n"
      "seen = set()\n"
      "for i in range(3000):\n"
      "    r = libc.syscall(137, b\"/workspace\", ctypes.c_void_p(addr))\n"
      "    seen.add(0 if r == 0 else ctypes.get_errno())\n"
      "stop.append(1)\n"
      "t.join()\n"
      "print(\"seen\", sorted(seen - {0, 14}))\n"
      "'\n"
      "for i in 1 2 3 4 5 6 7 8; do (while :; do stat -f / >/dev/null; done) & p=$!; "
      "stat -f /tmp >/dev/null; kill -9 $p; wait $p 2>/dev/null; done\n"
      "df -B1 / | tail -1; cat /proc/1/fd/7 /proc/1/fd/8 2>/dev/null && echo counters-readable; ls -l /proc/self/fd/",
      {{"MOAT_INIT_MODE", GetParam()}});
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("seen []\n"), std::string::npos) << "only the answer or EFAULT: " << r.out;
  EXPECT_NE(r.out.find(" 134217728 "), std::string::npos) << "moat-init still answers: " << r.out;
  EXPECT_EQ(r.out.find("counters-readable"), std::string::npos) << "pid 1's descriptors are its own: " << r.out;
  EXPECT_EQ(r.out.find("qgroups"), std::string::npos) << "the counters are moat-init's alone: " << r.out;
}

INSTANTIATE_TEST_SUITE_P(InitModes, LimitsDisk, ::testing::Values("exec", "inprocess"));

}  // namespace
}  // namespace moat::test
