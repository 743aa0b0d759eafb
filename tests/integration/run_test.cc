// moat run end to end, as root on the real kernel: what a user sees.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "isolation/cgroup/layout.h"
#include "moat_process.h"
#include "os/file.h"
#include "os/file_lock.h"
#include "os/mount.h"
#include "os/netlink.h"

namespace moat::test {
namespace {

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::set<std::string> lines(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.insert(l);
  return out;
}

// What an environment may leave on the host: cgroup directories, mounts,
// volumes, lock files, processes running as an environment's host uid.
// Cgroups and processes are host-wide: these tests run serially (RUN_SERIAL),
// so no other test's environments come and go meanwhile.
struct HostTraces {
  std::set<std::string> cgroups;
  std::set<std::string> mounts;  // this test's state dir and any overlay (other tests run concurrently)
  std::set<std::string> volumes;
  std::set<std::string> locks;
  std::set<std::string> envProcesses;

  static HostTraces take() {
    HostTraces t;
    auto layout = isolation::cgroup::detectHostLayout();
    std::vector<std::string> parents;
    if (layout.ok()) {
      if (layout->version == isolation::cgroup::Version::kV2) parents.push_back(layout->v2Parent);
      for (const auto& [c, p] : layout->v1Parents) parents.push_back(p);
    }
    for (const auto& p : parents) {
      auto names = os::listDir(p);
      if (!names.ok()) continue;
      for (const auto& n : names.value()) {
        if (n.rfind("moat-", 0) == 0) t.cgroups.insert(p + "/" + n);
      }
    }
    for (const auto& l : lines(os::readFile("/proc/self/mountinfo", 1 << 22).value())) {
      if (l.find(testStateDir()) != std::string::npos || l.find(" - overlay ") != std::string::npos) {
        t.mounts.insert(l.substr(l.find(' ') + 1));  // without the mount id
      }
    }
    auto vols = os::listDir(testStateDir() + "/storage/envs");
    if (vols.ok()) t.volumes.insert(vols->begin(), vols->end());
    auto locks = os::listDir(testStateDir() + "/run");
    if (locks.ok()) t.locks.insert(locks->begin(), locks->end());
    auto pids = os::listDir("/proc");
    for (const auto& pid : pids.value()) {
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      struct stat st;
      if (::stat(("/proc/" + pid).c_str(), &st) == 0 && st.st_uid >= 0x40000000u) {
        t.envProcesses.insert(pid);
      }
    }
    return t;
  }
};

void expectNoTraces(const HostTraces& before) {
  HostTraces after = HostTraces::take();
  EXPECT_EQ(after.cgroups, before.cgroups);
  EXPECT_EQ(after.mounts, before.mounts);
  EXPECT_EQ(after.volumes, before.volumes);
  EXPECT_EQ(after.locks, before.locks);
  EXPECT_EQ(after.envProcesses, before.envProcesses);
}

// Waits (bounded) until `condition` holds; returns whether it did.
template <class F>
bool waitFor(F condition, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

// Starts moat in the background with this test's state directory and
// stdout on `stdoutFd` (-1: inherited); returns its pid.
pid_t startMoat(const std::vector<std::string>& args, int stdoutFd) {
  std::vector<std::string> argv = {binDir() + "/moat"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env = {"MOAT_STATE=" + testStateDir(), "MOAT_STORAGE_GB=8"};
  pid_t pid = ::fork();
  if (pid == 0) {
    if (stdoutFd >= 0) ::dup2(stdoutFd, 1);
    std::vector<char*> a, e;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    for (auto& s : env) e.push_back(s.data());
    e.push_back(nullptr);
    ::execve(a[0], a.data(), e.data());
    ::_exit(127);
  }
  return pid;
}

class Run : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!isRoot()) GTEST_SKIP() << "needs root: creates namespaces, cgroups and mounts (CI runs as root)";
    // The first run creates the state directory's storage pool.
    ASSERT_EQ(runMoat({"run", "true"}).exitCode, 0);
  }
};

TEST_F(Run, PrintsAndExitsZero) {
  auto r = runMoat({"run", "--", "python3", "-c", "print('hi')"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "hi\n");
  EXPECT_EQ(r.err, "");
}

TEST_F(Run, ExitCodeIsTheCommands) {
  EXPECT_EQ(runMoat({"run", "--", "sh", "-c", "exit 3"}).exitCode, 3);
  EXPECT_EQ(runMoat({"run", "--", "false"}).exitCode, 1);
}

TEST_F(Run, KilledBySignalGives128PlusN) {
  EXPECT_EQ(runMoat({"run", "--", "sh", "-c", "kill -TERM $$"}).exitCode, 128 + SIGTERM);
  EXPECT_EQ(runMoat({"run", "--", "sh", "-c", "kill -KILL $$"}).exitCode, 128 + SIGKILL);
}

TEST_F(Run, StdoutAndStderrAreSeparateStreams) {
  auto r = runMoat({"run", "--", "sh", "-c", "echo out; echo err >&2"});
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
}

TEST_F(Run, InteractiveStdinReachesTheCommand) {
  auto r = runMoat({"run", "-i", "--", "python3"}, "print(1+1)\n");
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "2\n");
  std::string big(300000, 'x');
  auto c = runMoat({"run", "-i", "--", "wc", "-c"}, big);
  EXPECT_EQ(trim(c.out), "300000");
}

TEST_F(Run, WithoutInteractiveStdinIsEmpty) {
  auto r = runMoat({"run", "--", "cat"}, "this must not arrive\n");
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_EQ(r.out, "");
}

TEST_F(Run, LargeOutputArrivesWhole) {
  auto r = runMoat({"run", "--", "sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' a"});
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_EQ(r.out.size(), 5000000u);
  EXPECT_EQ(r.out.find_first_not_of('a'), std::string::npos);
}

TEST_F(Run, AClosedOutputPipeStopsTheCommandLikeAPipeWould) {
  // moat run yes | head: when head exits, yes must get SIGPIPE (141), not run forever.
  auto r = runProcess(
      {"/bin/bash", "-c", "timeout 20 " + binDir() + "/moat run -- yes | head -c 6; echo \" ${PIPESTATUS[0]}\""}, "",
      {{"MOAT_STATE", testStateDir()}, {"MOAT_STORAGE_GB", "8"}});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "y\ny\ny\n 141\n");
}

TEST_F(Run, TimeoutKillsTheWholeGroupWith124) {
  auto start = std::chrono::steady_clock::now();
  auto r = runMoat({"run", "--timeout", "0.5", "--", "sh", "-c", "sleep 60 & sleep 60"});
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.exitCode, 124);
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << r.err;
  EXPECT_LT(elapsed, std::chrono::seconds(30));
}

TEST_F(Run, CommandNotFoundIs127) {
  auto r = runMoat({"run", "--", "no-such-command-anywhere"});
  EXPECT_EQ(r.exitCode, 127);
  EXPECT_NE(r.err.find("command not found"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no-such-command-anywhere"), std::string::npos);
}

TEST_F(Run, NotExecutableIs126) {
  auto r = runMoat({"run", "--", "/etc/hostname"});
  EXPECT_EQ(r.exitCode, 126);
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
}

TEST_F(Run, MissingWorkdirIs126) {
  auto r = runMoat({"run", "-w", "/nope", "--", "true"});
  EXPECT_EQ(r.exitCode, 126);
  EXPECT_NE(r.err.find("/nope"), std::string::npos) << r.err;
}

TEST_F(Run, BadUsageIsOneLineAndExit2AndLeavesNothing) {
  HostTraces before = HostTraces::take();
  const std::vector<std::vector<std::string>> cases = {
      {"run", "--bogus", "--", "true"},       {"run"},
      {"run", "--memory", "0", "--", "true"}, {"run", "--pids", "0", "--", "true"},
      {"run", "--cpus", "100000", "true"},    {"run", "--storage", "0", "true"},
      {"run", "--timeout", "0", "true"},      {"run", "-v", "/nonexistent:/x", "true"},
      {"run", "-v", "/tmp:/proc", "true"},    {"run", "--memory", "99999999", "true"},
  };
  for (const auto& args : cases) {
    auto r = runMoat(args);
    EXPECT_EQ(r.exitCode, 2) << args[1];
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("moat run: ", 0), 0u) << r.err;
  }
  expectNoTraces(before);
}

TEST_F(Run, NonexistentTemplateIs125AndLeavesNothing) {
  HostTraces before = HostTraces::take();
  auto r = runMoat({"run", "--template", "/no/such/rootfs", "--", "true"});
  EXPECT_EQ(r.exitCode, 125);
  EXPECT_NE(r.err.find("/no/such/rootfs"), std::string::npos) << r.err;
  auto named = runMoat({"run", "--template", "ubuntu", "--", "true"});
  EXPECT_EQ(named.exitCode, 125);
  EXPECT_NE(named.err.find("unknown template"), std::string::npos) << named.err;
  expectNoTraces(before);
}

TEST_F(Run, FailureInsideSetupLeavesNothing) {
  HostTraces before = HostTraces::take();
  // A file cannot be mounted over the /usr directory: the child fails late,
  // after the volume, cgroup and namespaces exist.
  auto r = runMoat({"run", "-v", "/etc/hostname:/usr", "--", "true"});
  EXPECT_EQ(r.exitCode, 125);
  EXPECT_NE(r.err.find("environment setup failed"), std::string::npos) << r.err;
  expectNoTraces(before);
}

TEST_F(Run, DestroyLeavesNothingEvenWithBackgroundProcesses) {
  HostTraces before = HostTraces::take();
  auto r = runMoat({"run", "--", "sh", "-c", "sleep 300 & sleep 300 & echo started"});
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_EQ(r.out, "started\n");
  expectNoTraces(before);
}

TEST_F(Run, KilledClientTakesTheEnvironmentWithItAndTheNextRunCollectsTheRest) {
  HostTraces before = HostTraces::take();
  pid_t pid = startMoat({"run", "sleep", "300"}, -1);
  // Wait until the environment's processes exist, then kill the client.
  ASSERT_TRUE(waitFor([&] { return HostTraces::take().envProcesses.size() > before.envProcesses.size(); }));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(waitFor([&] { return HostTraces::take().envProcesses == before.envProcesses; }))
      << "processes of the environment outlived its client";
  ASSERT_EQ(runMoat({"run", "true"}).exitCode, 0);
  expectNoTraces(before);
}

// A lock file is made under a temporary name and renamed; one whose creator
// died in between is removed by a later run once it is a minute old and
// nobody holds it. A fresh one (a creator between its open and its lock) and
// a held one stay.
TEST_F(Run, AnOrphanedUnrenamedLockFileIsCollected) {
  const std::string run = testStateDir() + "/run/";
  const std::string tag = std::to_string(::getpid());
  auto make = [&](const std::string& name, bool old) {
    std::ofstream(run + name).put('\0');
    if (old) {
      struct timespec times[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
      ASSERT_EQ(::utimensat(AT_FDCWD, (run + name).c_str(), times, 0), 0);
    }
  };
  make(".orphan-" + tag, true);
  make(".fresh-" + tag, false);
  make(".held-" + tag, true);
  int held = ::open((run + ".held-" + tag).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  ASSERT_EQ(runMoat({"run", "true"}).exitCode, 0);
  EXPECT_NE(::access((run + ".orphan-" + tag).c_str(), F_OK), 0) << "the orphan is still there";
  EXPECT_EQ(::access((run + ".fresh-" + tag).c_str(), F_OK), 0) << "a fresh one was taken";
  EXPECT_EQ(::access((run + ".held-" + tag).c_str(), F_OK), 0) << "a held one was taken";
  ::close(held);
  ::unlink((run + ".fresh-" + tag).c_str());
  ::unlink((run + ".held-" + tag).c_str());
}

TEST_F(Run, InterruptIsForwardedToTheCommand) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t pid = startMoat(
      {"run", "--", "sh", "-c", "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done"}, out[1]);
  ::close(out[1]);
  std::string got;
  char buf[256];
  ssize_t n;
  while (got.find("ready\n") == std::string::npos && (n = ::read(out[0], buf, sizeof buf)) > 0) {
    got.append(buf, static_cast<size_t>(n));
  }
  ::kill(pid, SIGINT);
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  EXPECT_NE(got.find("got-int"), std::string::npos) << got;
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 5);
}

TEST_F(Run, ExecModeInitBehavesTheSame) {
  // moatd will exec the moat-init binary instead of running it in process.
  const std::map<std::string, std::string> exec = {{"MOAT_INIT_MODE", "exec"}};
  auto r = runMoat({"run", "-i", "--", "sh", "-c", "cat /proc/1/comm; read x; echo got $x; exit 4"}, "line\n", exec);
  EXPECT_EQ(r.exitCode, 4) << r.err;
  EXPECT_EQ(r.out, "moat-init\ngot line\n");
  EXPECT_EQ(runMoat({"run", "--timeout", "0.2", "--", "sleep", "30"}, "", exec).exitCode, 124);
  EXPECT_EQ(runMoat({"run", "--", "no-such-command"}, "", exec).exitCode, 127);
}

TEST_F(Run, HostnameIsTheEnvironmentId) {
  auto a = runMoat({"run", "--", "sh", "-c", "hostname; cat /etc/hostname"});
  auto b = runMoat({"run", "--", "hostname"});
  std::istringstream in(a.out);
  std::string name, file;
  in >> name >> file;
  EXPECT_TRUE(std::regex_match(name, std::regex("[0-9a-f]{12}"))) << name;
  EXPECT_EQ(name, file);
  EXPECT_NE(trim(b.out), name);
}

// The network namespace a run's environment gets: "net:[inode]" as its
// /proc/self/ns/net reads, and whether only a loopback that is up is in it.
std::pair<std::string, bool> networkOfARun() {
  auto r = runMoat({"run", "--", "sh", "-c",
                    "readlink /proc/self/ns/net; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
                    "python3 -c 'import socket; s = socket.create_server((\"127.0.0.1\", 0)); "
                    "socket.create_connection(s.getsockname(), timeout=5); print(\"up\")'"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  std::istringstream in(r.out);
  std::string ns, rest;
  std::getline(in, ns);
  std::getline(in, rest, '\0');
  return {ns, rest == "lo\nup\n"};
}

// What the ready network namespace slot holds: "net:[inode]", or "".
std::string readyNetwork() {
  struct stat st;
  if (::stat("/run/moat/netns/ready", &st) != 0 || st.st_size != 0 || !S_ISREG(st.st_mode)) return "";
  auto target = os::readFile("/proc/self/mountinfo", 1 << 22);
  if (!target.ok() || target->find(" /run/moat/netns/ready ") == std::string::npos) return "";
  return "net:[" + std::to_string(st.st_ino) + "]";
}

// Keeps the namespace at the slot alive (its inode number is not given to
// another namespace while the test compares numbers).
UniqueFd holdReadyNetwork() {
  auto fd = os::openNetworkNamespace("/run/moat/netns/ready");
  return fd.ok() ? std::move(fd.value()) : UniqueFd();
}

TEST_F(Run, EachRunGetsANetworkNamespaceNobodyElseHadAndTheNextIsMadeAhead) {
  std::set<std::string> seen;
  std::vector<UniqueFd> held;
  auto host = os::readLink("/proc/self/ns/net");
  ASSERT_TRUE(host.ok());
  seen.insert(host.value());
  for (int i = 0; i < 3; ++i) {
    std::string ready = readyNetwork();
    ASSERT_FALSE(ready.empty()) << "the run before made none ahead";
    held.push_back(holdReadyNetwork());
    EXPECT_EQ(seen.count(ready), 0u) << ready << " was someone's already";
    auto [ns, onlyLoopbackUp] = networkOfARun();
    EXPECT_EQ(ns, ready) << "the run took the one made ahead";
    EXPECT_TRUE(onlyLoopbackUp);
    EXPECT_TRUE(seen.insert(ns).second) << ns << " served twice";
  }
  EXPECT_EQ(seen.count(readyNetwork()), 0u) << "the one made ahead is fresh";
}

TEST_F(Run, ABusyOrForeignReadyNetworkSlotIsLeftAlone) {
  // Another run at the slot: this one makes its own namespace (in its
  // clone) and neither takes nor replaces the ready one.
  std::string ready = readyNetwork();
  ASSERT_FALSE(ready.empty());
  {
    auto held = os::FileLock::tryAcquire("/run/moat/netns/ready.lock");
    ASSERT_TRUE(held.ok()) << held.error().message();
    auto [ns, onlyLoopbackUp] = networkOfARun();
    EXPECT_NE(ns, ready);
    EXPECT_TRUE(onlyLoopbackUp);
    EXPECT_EQ(readyNetwork(), ready);
  }
  // The slot holds a plain file, not a namespace (nothing ready): not
  // joined; the run makes the next one.
  UniqueFd keep = holdReadyNetwork();
  ASSERT_TRUE(keep.valid());
  ASSERT_TRUE(os::unmount("/run/moat/netns/ready", MNT_DETACH).ok());
  EXPECT_EQ(readyNetwork(), "");
  auto [ns, onlyLoopbackUp] = networkOfARun();
  EXPECT_TRUE(onlyLoopbackUp);
  EXPECT_NE(ns, ready);
  std::string next = readyNetwork();
  EXPECT_FALSE(next.empty());
  EXPECT_NE(next, ns);
}

TEST_F(Run, AReadyNetworkNamespaceTakenElsewhereIsNotHandedOutAgain) {
  // A mount made in one mount namespace can show in another (propagation,
  // or a copy when one is made), and unmounting it there leaves it here. A
  // run in such a namespace takes the ready one; simulated: the namespace
  // at the slot is not the one its maker named (here the test's own).
  auto mine = os::newNetworkNamespace();
  ASSERT_TRUE(mine.ok());
  std::string foreign = "net:[" + std::to_string([&] {
                          struct stat st;
                          ::fstat(mine->get(), &st);
                          return st.st_ino;
                        }()) +
                        "]";
  (void)os::unmount("/run/moat/netns/ready", MNT_DETACH);
  ASSERT_TRUE(os::bindMount("/proc/self/fd/" + std::to_string(mine->get()), "/run/moat/netns/ready").ok());
  ASSERT_EQ(readyNetwork(), foreign);
  auto [ns, onlyLoopbackUp] = networkOfARun();
  EXPECT_NE(ns, foreign) << "a namespace its maker did not name was handed out";
  EXPECT_TRUE(onlyLoopbackUp);
  std::string next = readyNetwork();
  EXPECT_FALSE(next.empty());
  EXPECT_NE(next, foreign) << "the foreign one was not replaced";
  // And the next run takes the one that was made for it.
  UniqueFd keep = holdReadyNetwork();
  EXPECT_EQ(networkOfARun().first, next);
}

TEST_F(Run, EnvironmentIsCleanPlusExplicitVariables) {
  auto r = runMoat({"run", "-e", "FOO=bar baz", "-e", "HOSTVAR", "--", "env"}, "",
                   {{"HOSTVAR", "passed-on-purpose"}, {"LEAKY", "must-not-appear"}});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  std::set<std::string> keys;
  for (const auto& l : lines(r.out)) keys.insert(l.substr(0, l.find('=')));
  EXPECT_EQ(keys, (std::set<std::string>{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "HOSTNAME", "PWD",
                                         "FOO", "HOSTVAR"}));
  EXPECT_NE(r.out.find("FOO=bar baz\n"), std::string::npos);
  EXPECT_NE(r.out.find("HOSTVAR=passed-on-purpose\n"), std::string::npos);
  EXPECT_EQ(r.out.find("must-not-appear"), std::string::npos);
}

TEST_F(Run, WorkspaceIsTheDefaultWritableWorkdir) {
  auto r = runMoat({"run", "--", "sh", "-c", "pwd; echo data > f; cat f; touch /tmp/t /newdir-ok"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "/workspace\ndata\n");
}

// The host's /usr is bound without an id mapping: its owners (host root)
// are not mapped into the environment's user namespace, so they show as
// nobody and root inside gets only what any unprivileged host user gets
// (security.Escape.UsrShowsOnlyWhatUnprivilegedHostUsersRead). The
// template's own files (/etc, /root) are root's inside.
TEST_F(Run, RootInsideOwnsTheTemplateFilesButGetsNoMoreOfUsrThanAHostUser) {
  auto r = runMoat({"run", "--", "sh", "-c",
                    "stat -c %U /usr/bin/python3 /etc/passwd /root; id -u; python3 -c 'print(6*7)'; touch /usr/x"});
  EXPECT_NE(r.exitCode, 0);
  EXPECT_EQ(r.out, "nobody\nroot\nroot\n0\n42\n");
  EXPECT_NE(r.err.find("Read-only file system"), std::string::npos) << r.err;
}

// The host template's /etc shares the host's inodes where only root could
// change them (hard links, os::CopyMode::kLinkRootOwned). Whatever root in
// the environment does to those files must stay in its own upper layer:
// each change below goes to a file not copied up before (a chmod, chown or
// touch copies up metadata only).
TEST_F(Run, TheHostFilesTheTemplateSharesCannotBeChangedFromInside) {
  std::string etc = testStateDir() + "/templates/host-v2/etc";
  struct stat hostEtc, stateDir;
  ASSERT_EQ(::stat("/etc", &hostEtc), 0);
  ASSERT_EQ(::stat(testStateDir().c_str(), &stateDir), 0);
  if (hostEtc.st_dev != stateDir.st_dev)
    GTEST_SKIP() << "the test state directory is on another file system than /etc: nothing is linked";
  std::vector<std::string> files;  // shared regular files
  for (const char* name :
       {"inputrc", "debian_version", "ld.so.conf", "shells", "protocols", "services", "gai.conf", "host.conf",
        "networks", "bash.bashrc", "profile", "mime.types", "ssl/certs/ca-certificates.crt"}) {
    struct stat st;
    if (::lstat((etc + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink > 1) files.push_back(name);
  }
  std::string link;  // a shared symlink
  auto alternatives = os::listDir(etc + "/alternatives");
  for (const auto& n : alternatives.ok() ? alternatives.value() : std::vector<std::string>{}) {
    struct stat st;
    if (::lstat((etc + "/alternatives/" + n).c_str(), &st) == 0 && S_ISLNK(st.st_mode) && st.st_nlink > 1) {
      link = "/etc/alternatives/" + n;
      break;
    }
  }
  ASSERT_GE(files.size(), 6u) << "too few /etc files of the template are shared with the host";
  ASSERT_FALSE(link.empty()) << "no /etc/alternatives link of the template is shared with the host";
  struct Before {
    std::string path, content;
    struct stat st;
  };
  std::vector<Before> before;
  for (const auto& f : files) {
    Before b{"/etc/" + f, os::readFile("/etc/" + f, 8 << 20).value(), {}};
    ASSERT_EQ(::lstat(b.path.c_str(), &b.st), 0);
    before.push_back(b);
  }
  auto target = os::readLink(link);
  ASSERT_TRUE(target.ok());
  const std::vector<std::string> changes = {
      "echo hostile >> " + before[0].path,
      "chmod 4777 " + before[1].path,
      "chown 123:456 " + before[2].path,
      "touch -d 2001-01-01 " + before[3].path,
      "ln -f " + before[4].path + " /workspace/hard && echo more >> /workspace/hard",
      "rm " + before[5].path,
      "ln -sfn /bin/hostile " + link};
  std::string script;
  for (const auto& c : changes) script += c + " && ";
  auto r = runMoat({"run", "--", "sh", "-c", script + "echo done"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "done\n");

  for (const auto& b : before) {
    struct stat after;
    ASSERT_EQ(::lstat(b.path.c_str(), &after), 0) << b.path;
    EXPECT_EQ(os::readFile(b.path, 8 << 20).value(), b.content) << b.path;
    EXPECT_EQ(after.st_mode, b.st.st_mode) << b.path;
    EXPECT_EQ(after.st_uid, b.st.st_uid) << b.path;
    EXPECT_EQ(after.st_gid, b.st.st_gid) << b.path;
    EXPECT_EQ(after.st_mtim.tv_sec, b.st.st_mtim.tv_sec) << b.path;
    EXPECT_EQ(after.st_ino, b.st.st_ino) << b.path;
  }
  EXPECT_EQ(os::readLink(link).value(), target.value());
  // The next environment sees the template as it was.
  auto next = runMoat({"run", "--", "sh", "-c",
                       "tail -c 100 " + before[0].path + "; stat -c %a " + before[1].path + "; readlink " + link});
  EXPECT_EQ(next.exitCode, 0) << next.err;
  EXPECT_EQ(next.out.find("hostile"), std::string::npos) << next.out;
  EXPECT_EQ(next.out.find("4777"), std::string::npos) << next.out;
}

TEST_F(Run, WritesDoNotCarryOverBetweenEnvironments) {
  ASSERT_EQ(runMoat({"run", "--", "sh", "-c", "echo secret > /etc/leftover; echo x > /workspace/y"}).exitCode, 0);
  auto r = runMoat({"run", "--", "sh", "-c", "ls /etc/leftover /workspace/y"});
  EXPECT_NE(r.exitCode, 0);
  EXPECT_EQ(r.out, "");
}

TEST_F(Run, VolumesAreExplicitAndHonourReadOnly) {
  std::string dir = testStateDir() + "/vol-" + std::to_string(::getpid());
  ASSERT_TRUE(os::makeDirs(dir).ok());
  ASSERT_TRUE(os::writeFile(dir + "/in.txt", "from host\n").ok());
  auto rw = runMoat({"run", "-v", dir + ":/workspace", "--", "sh", "-c", "cat in.txt; echo back > out.txt"});
  EXPECT_EQ(rw.exitCode, 0) << rw.err;
  EXPECT_EQ(rw.out, "from host\n");
  EXPECT_EQ(os::readFile(dir + "/out.txt").value(), "back\n");
  auto ro = runMoat({"run", "-v", dir + ":/data:ro", "--", "sh", "-c", "cat /data/in.txt; echo x > /data/z"});
  EXPECT_NE(ro.exitCode, 0);
  EXPECT_EQ(ro.out, "from host\n");
  EXPECT_FALSE(os::exists(dir + "/z"));
  (void)os::removeTree(dir);
}

TEST_F(Run, TemplateDirectoryIsTheWholeRoot) {
  // A minimal root file system: dash and the C library, nothing else.
  // Outside the state directory: moat refuses templates that overlap it.
  std::string root = "/tmp/moat-test-rootfs-" + std::to_string(::getpid());
  for (const std::string f : {"/usr/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}) {
    ASSERT_TRUE(os::makeDirs(root + f.substr(0, f.rfind('/'))).ok());
    ASSERT_TRUE(os::copyTree(os::realPath(f).value(), root + f).ok()) << f;
    ::chmod((root + f).c_str(), 0755);
  }
  ASSERT_TRUE(os::makeDirs(root + "/bin").ok());
  ASSERT_TRUE(os::symlink("/usr/bin/dash", root + "/bin/sh").ok());
  auto r = runMoat({"run", "--template", root, "--", "/bin/sh", "-c",
                    "echo $((6*7)); echo hi > /bin/new; test -e /usr/bin/python3 || echo no-python; pwd"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "42\nno-python\n/workspace\n");
  EXPECT_FALSE(os::exists(root + "/bin/new")) << "the template must stay read-only";
  (void)os::removeTree(root);
}

TEST_F(Run, MemoryLimitKillsTheHogWithAClearMessage) {
  auto r =
      runMoat({"run", "--memory", "64", "--", "python3", "-c", "x = bytearray(256 * 1024 * 1024); print('allocated')"});
  EXPECT_EQ(r.exitCode, 128 + SIGKILL);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("out of memory"), std::string::npos) << r.err;
}

TEST_F(Run, PidsLimitStopsAForkBomb) {
  auto r = runMoat({"run", "--pids", "32", "--", "python3", "-c", R"(
import os, time
n = 0
try:
    for i in range(200):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print('fork failed after', n)
)"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("fork failed after (\\d+)"))) << r.out;
  EXPECT_LT(std::stoi(m[1]), 32);
  // Near the limit, not far below it for some other reason: 32 less
  // moat-init and python itself.
  EXPECT_GE(std::stoi(m[1]), 24) << r.out;
}

TEST_F(Run, StorageLimitStopsADiskFill) {
  auto r = runMoat({"run", "--storage", "0.05", "--", "sh", "-c",
                    "dd if=/dev/zero of=/workspace/fill bs=1M count=200 2>&1; stat -c %s /workspace/fill"});
  EXPECT_NE(r.out.find("Disk quota exceeded"), std::string::npos) << r.out;
  std::istringstream in(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
  uint64_t size = 0;
  in >> size;
  EXPECT_GT(size, 0u);
  EXPECT_LE(size, 52u << 20);
}

TEST_F(Run, CpuLimitThrottles) {
  auto r = runMoat({"run", "--cpus", "0.2", "--", "python3", "-c", R"(
import time
w = time.monotonic(); c = time.process_time()
while time.monotonic() - w < 1.0: pass
print(round((time.process_time() - c) / (time.monotonic() - w), 3))
)"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  double share = std::stod(r.out);
  EXPECT_LT(share, 0.35) << "a 0.2 CPU limit let the loop use " << share;
  EXPECT_GT(share, 0.05);
}

}  // namespace
}  // namespace moat::test
