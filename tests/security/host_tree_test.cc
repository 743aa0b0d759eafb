// Host-side code never follows what an environment left in its files.
//
// moatd and the spawner run as host root; forks, restores, creates from a
// snapshot, snapshots, destroys and templates all work on a tree that code
// inside an environment wrote (or, for a directory template, that someone
// other than moat may have). Each test plants symlinks or hard links where
// moat works (/etc and the files it writes there, /tmp, /workspace, mount
// points), runs every lifecycle operation over them, and checks a host
// canary: a root-owned 0700 directory whose files (named like the ones moat
// writes) keep their content, owner and mode, with nothing added.
// docs/SECURITY.md, "Host-side code over an environment's files".
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "moat_process.h"
#include "moatd_fixture.h"
#include "os/file.h"

namespace moat::test {
namespace {

// A directory only host root may enter, holding files named like those
// moat writes into an environment's /etc, each 0600.
class HostCanary {
 public:
  HostCanary() : dir_("/var/tmp/moat-canary-" + std::to_string(::getpid())) {
    (void)os::removeTree(dir_);
    EXPECT_TRUE(os::makeDir(dir_, 0700).ok());
    ::chmod(dir_.c_str(), 0700);
    for (const char* name : {"hosts", "hostname", "secret"}) {
      EXPECT_TRUE(os::writeFile(dir_ + "/" + name, std::string("host ") + name + "\n", 0600).ok());
    }
    before_ = state();
  }
  ~HostCanary() { (void)os::removeTree(dir_); }
  const std::string& dir() const { return dir_; }
  // Every entry with its content, owner and mode; the directory's own as ".".
  std::map<std::string, std::string> state() const {
    std::map<std::string, std::string> out;
    auto describe = [](const std::string& path) {
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0) return std::string("missing");
      std::string d =
          std::to_string(st.st_uid) + ":" + std::to_string(st.st_gid) + " " + std::to_string(st.st_mode & 07777);
      if (S_ISREG(st.st_mode)) {
        auto content = os::readFile(path);
        d += " " + (content.ok() ? content.value() : "?");
      }
      return d;
    };
    out["."] = describe(dir_);
    auto names = os::listDir(dir_);
    for (const auto& name : names.ok() ? names.value() : std::vector<std::string>{}) {
      out[name] = describe(dir_ + "/" + name);
    }
    return out;
  }
  void expectUntouched(const std::string& after) const {
    auto now = state();
    EXPECT_EQ(now, before_) << "the host canary " << dir_ << " changed after " << after;
  }

 private:
  std::string dir_;
  std::map<std::string, std::string> before_;
};

// From a path inside an environment's upper layer
// (<state>/storage/envs/<id>/upper/...) up to the host's root, whatever
// the state directory: more ".." than any of these paths has components.
std::string up() {
  std::string s;
  for (int i = 0; i < 24; ++i) s += "../";
  return s;
}

class HostTree : public MoatdFixture {
 protected:
  json run(const std::string& id, const std::string& script, int expectExit = 0) {
    json r = exec(id, {{"cmd", {"/bin/sh", "-c", script}}, {"cwd", "/"}});
    EXPECT_EQ(r["exit_code"], expectExit) << script << ": " << r.dump();
    return r;
  }
  std::string snapshot(const std::string& id) {
    return call("POST", "/v1/environments/" + id + "/snapshots", json::object(), 201).value("id", "");
  }
  // Every operation that works on the planted tree, the canary checked
  // after each: a snapshot, a fork, a create from the snapshot, a restore
  // and destroys. What an environment made from the tree must run, and
  // pass `check` (the environment's own files as they were, say).
  void everyOperation(const std::string& id, const HostCanary& canary, const std::string& plant,
                      const json& createBody = json::object(),
                      const std::function<void(const std::string&, const std::string&)>& check = {}) {
    auto verify = [&](const std::string& env, const std::string& what) {
      if (env.empty()) return;
      run(env, "true");
      if (check) check(env, plant + ", then " + what);
    };
    std::string sid = snapshot(id);
    canary.expectUntouched(plant + ", then a snapshot");
    json fork = call("POST", "/v1/environments/" + id + "/fork", json::object(), 201);
    canary.expectUntouched(plant + ", then a fork");
    std::string forked = fork.value("id", "");
    verify(forked, "a fork");
    json fromSnapshot = createBody;
    fromSnapshot["snapshot"] = sid;
    std::string created = createEnv(fromSnapshot);
    canary.expectUntouched(plant + ", then a create from its snapshot");
    verify(created, "a create from its snapshot");
    call("POST", "/v1/environments/" + id + "/restore", {{"snapshot", sid}}, 200);
    canary.expectUntouched(plant + ", then a restore");
    verify(id, "a restore");
    for (const auto& e : {id, forked, created}) {
      if (!e.empty()) call("DELETE", "/v1/environments/" + e, nullptr, 204);
    }
    call("DELETE", "/v1/snapshots/" + sid, nullptr, 204);
    canary.expectUntouched(plant + ", then the destroys");
  }
};

// /etc replaced by a link out of the tree: moat used to write hostname and
// hosts through it (as host root, then chowned them to the environment).
TEST_F(HostTree, EtcAsAnAbsoluteSymlinkLeadsNowhere) {
  HostCanary canary;
  std::string id = createEnv();
  std::string plant = "/etc -> " + canary.dir();
  run(id, "rm -rf /etc && ln -s " + canary.dir() + " /etc");
  everyOperation(id, canary, plant);
}

TEST_F(HostTree, EtcAsARelativeSymlinkLeadsNowhere) {
  HostCanary canary;
  std::string id = createEnv();
  std::string plant = "/etc -> " + up() + canary.dir();
  run(id, "rm -rf /etc && ln -s " + up() + canary.dir().substr(1) + " /etc");
  everyOperation(id, canary, plant);
}

// The files moat writes replaced by links: to the host, and (hard links)
// to a file of the environment's own, which must not change either.
TEST_F(HostTree, TheFilesMoatWritesAsLinksLeadNowhere) {
  HostCanary canary;
  std::string id = createEnv();
  run(id, "ln -sf " + canary.dir() + "/hosts /etc/hosts && ln -sf " + up() + canary.dir().substr(1) +
              "/hostname /etc/hostname");
  everyOperation(id, canary, "/etc/hosts and /etc/hostname -> the canary", json::object(),
                 [this](const std::string& env, const std::string& what) {
                   EXPECT_EQ(run(env, "cat /etc/hostname")["stdout"], env + "\n") << what;
                 });
  std::string other = createEnv();
  run(other, "echo mine > /workspace/keep && ln -f /workspace/keep /etc/hosts && ln -f /workspace/keep /etc/hostname");
  everyOperation(other, canary, "/etc/hosts and /etc/hostname hard links to /workspace/keep", json::object(),
                 [this](const std::string& env, const std::string& what) {
                   EXPECT_EQ(run(env, "cat /workspace/keep")["stdout"], "mine\n")
                       << "moat wrote through a hard link: " << what;
                   EXPECT_EQ(run(env, "cat /etc/hostname")["stdout"], env + "\n") << what;
                 });
}

// A warm pool's environments are made ahead and claimed by a create: the
// claim touches no file host-side; links planted after it meet the same
// operations, and the pool made again after the destroys is clean.
TEST_F(HostTree, AClaimedWarmEnvironmentLeadsNowhereEither) {
  daemon_.reset();
  daemon_ = std::make_unique<Moatd>(std::vector<std::string>{"--warm-pool", "1"});
  auto poolReady = [this] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (daemon_->request("GET", "/metrics").body.find("\nmoat_warm_pool_ready 1\n") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a poll of a gauge: nothing to wait on
    }
    return false;
  };
  HostCanary canary;
  ASSERT_TRUE(poolReady());
  std::string id = createEnv();
  run(id, "rm -rf /etc && ln -s " + canary.dir() + " /etc");
  everyOperation(id, canary, "a claimed environment's /etc -> " + canary.dir());
  ASSERT_TRUE(poolReady());
  std::string next = createEnv();
  canary.expectUntouched("a second claim");
  EXPECT_EQ(run(next, "cat /etc/hostname")["stdout"], next + "\n");
  std::string stats = daemon_->request("GET", "/metrics").body;
  EXPECT_NE(stats.find("moat_warm_pool_claims_total 2"), std::string::npos) << "both creates were claims: " << stats;
}

// While the environment swaps its /etc between a directory and a link out
// as fast as it can, snapshots, forks and creates from the snapshots go on:
// nothing host-side walks the tree, so no moment of the swap leads out.
TEST_F(HostTree, EtcSwappedForALinkDuringSnapshotsAndForksLeadsNowhere) {
  HostCanary canary;
  std::string id = createEnv();
  // An /etc made in the writable layer: overlayfs renames only those
  // (a directory of the template's would need redirect_dir).
  run(id, "cp -a /etc /etc.new && rm -rf /etc && mv /etc.new /etc");
  json swapper = call("POST", "/v1/environments/" + id + "/processes",
                      {{"cmd",
                        {"python3", "-c",
                         "import os\n"
                         "os.symlink('" +
                             canary.dir() +
                             "', '/etc.link')\n"
                             "print('swapping', flush=True)\n"
                             "while True:\n"
                             "  os.rename('/etc', '/etc.dir'); os.rename('/etc.link', '/etc')\n"
                             "  os.rename('/etc', '/etc.link'); os.rename('/etc.dir', '/etc')\n"}}},
                      201);
  std::string pid = std::to_string(swapper.value("id", 0));
  auto started = daemon_->stream("/v1/environments/" + id + "/processes/" + pid + "/output?follow=1");
  std::string line;
  ASSERT_TRUE(started.nextLine(line)) << "no output from the swapping process";
  ASSERT_NE(line.find("swapping"), std::string::npos) << line;
  int sawLink = 0;
  for (int round = 0; round < 8; ++round) {
    std::string sid = snapshot(id);
    json fork = call("POST", "/v1/environments/" + id + "/fork", json::object(), 201);
    std::string created = createEnv({{"snapshot", sid}});
    canary.expectUntouched("round " + std::to_string(round) + " of snapshots and forks during the swap");
    for (const std::string& env : {fork.value("id", ""), created}) {
      if (env.empty()) continue;
      if (run(env, "test -L /etc && echo link; true")["stdout"] == "link\n") ++sawLink;
      call("DELETE", "/v1/environments/" + env, nullptr, 204);
    }
    call("DELETE", "/v1/snapshots/" + sid, nullptr, 204);
  }
  std::printf("copies taken while /etc was the link: %d of 16\n", sawLink);
  EXPECT_EQ(call("GET", "/v1/environments/" + id + "/processes/" + pid, nullptr, 200)["state"], "running")
      << "the swap ran throughout";
}

// A root file system directory without /tmp and /workspace: moat makes them
// (and made /tmp 01777). Here they are links out of the tree, first in the
// environment's files, then in the template itself.
class HostTreeTemplate : public HostTree {
 protected:
  void SetUp() override {
    HostTree::SetUp();
    if (IsSkipped()) return;
    root_ = "/var/tmp/moat-test-rootfs-" + std::to_string(::getpid());
    (void)os::removeTree(root_);
    for (const std::string f : {"/usr/bin/dash", "/usr/bin/ln", "/usr/bin/rm", "/usr/bin/cat",
                                "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}) {
      ASSERT_TRUE(os::makeDirs(root_ + f.substr(0, f.rfind('/'))).ok());
      ASSERT_TRUE(os::copyTree(os::realPath(f).value(), root_ + f).ok()) << f;
      ::chmod((root_ + f).c_str(), 0755);
    }
    // What moat-init itself needs to start there (nothing in a static
    // build; the C++ runtime in a sanitized one).
    auto libs = runProcess({"/usr/bin/ldd", binDir() + "/moat-init"});
    std::istringstream lines(libs.out);
    for (std::string line; std::getline(lines, line);) {
      auto arrow = line.find("=> /");
      if (arrow == std::string::npos) continue;
      std::string lib = line.substr(arrow + 3, line.find(' ', arrow + 3) - arrow - 3);
      ASSERT_TRUE(os::makeDirs(root_ + lib.substr(0, lib.rfind('/'))).ok());
      if (!os::exists(root_ + lib)) {
        ASSERT_TRUE(os::copyTree(os::realPath(lib).value(), root_ + lib).ok()) << lib;
      }
    }
    ASSERT_TRUE(os::makeDirs(root_ + "/bin").ok());
    ASSERT_TRUE(os::symlink("/usr/bin/dash", root_ + "/bin/sh").ok());
  }
  void TearDown() override {
    if (!root_.empty()) (void)os::removeTree(root_);
  }
  json templateBody() const { return {{"template", root_}}; }
  std::string root_;
};

TEST_F(HostTreeTemplate, TmpAndWorkspaceAsSymlinksLeadNowhere) {
  HostCanary canary;
  for (const std::string& target : {canary.dir(), up() + canary.dir().substr(1)}) {
    std::string id = createEnv(templateBody());
    run(id, "/usr/bin/rm -rf /tmp /workspace && /usr/bin/ln -s " + target + " /tmp && /usr/bin/ln -s " + target +
                " /workspace");
    everyOperation(id, canary, "/tmp and /workspace -> " + target);
  }
}

TEST_F(HostTreeTemplate, LinksInTheTemplateItselfLeadNowhere) {
  HostCanary canary;
  ASSERT_TRUE(os::symlink(canary.dir(), root_ + "/tmp").ok());
  ASSERT_TRUE(os::symlink(up() + canary.dir().substr(1), root_ + "/workspace").ok());
  ASSERT_TRUE(os::symlink(canary.dir(), root_ + "/etc").ok());
  std::string id = createEnv(templateBody());
  canary.expectUntouched("a create from a template whose /etc, /tmp and /workspace are links");
  ASSERT_FALSE(id.empty());
  run(id, "true");
  call("DELETE", "/v1/environments/" + id, nullptr, 204);
  canary.expectUntouched("a destroy");
}

// Mount points moat makes in a template (/proc, /dev) as links: the create
// is refused with the reason, and nothing is mounted or made on the host.
TEST_F(HostTreeTemplate, MountPointsAsLinksAreRefused) {
  HostCanary canary;
  for (const char* point : {"proc", "dev"}) {
    std::string link = root_ + "/" + point;
    (void)os::removeTree(link);
    ASSERT_TRUE(os::symlink(canary.dir(), link).ok());
    auto r = daemon_->request("POST", "/v1/environments", templateBody().dump());
    EXPECT_GE(r.status, 400) << r.body;
    EXPECT_NE(r.body.find(std::string("mount point /") + point + " in the environment is or passes through a symlink"),
              std::string::npos)
        << r.body;
    canary.expectUntouched(std::string("a create from a template whose /") + point + " is a link");
    ::unlink(link.c_str());
  }
}

// --- volumes: a host directory an environment writes into --------------------

// A host directory shared with environments (root's, 0755), removed after.
class SharedDirectory {
 public:
  SharedDirectory() : dir_("/var/tmp/moat-shared-" + std::to_string(::getpid())) {
    (void)os::removeTree(dir_);
    EXPECT_TRUE(os::makeDir(dir_, 0755).ok());
  }
  ~SharedDirectory() { (void)os::removeTree(dir_); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

std::string describeResult(const ProcessResult& r) {
  return "exit " + std::to_string(r.exitCode) + "\n--- stdout ---\n" + r.out + "--- stderr ---\n" + r.err;
}

// A first run plants links in a directory it was given; a second run names
// a path through them. moat followed them (as host root) and mounted the
// root-only directory they led to, read-write and id-mapped: root inside
// read its files and left a set-uid binary there. A volume's source now
// follows no symlink at all.
TEST(HostVolumes, ALinkAnEnvironmentPlantedIsNotFollowedByALaterBind) {
  MOAT_REQUIRE_ROOT();
  HostCanary canary;
  SharedDirectory shared;
  auto plant = runMoat({"run", "-v", shared.dir() + ":/data", "--", "sh", "-c",
                        "ln -s " + canary.dir() + " /data/results && ln -s " + up() + canary.dir().substr(1) +
                            " /data/relative && mkdir /data/real && echo env > /data/real/mark && ln -s real "
                            "/data/to-real"});
  ASSERT_EQ(plant.exitCode, 0) << describeResult(plant);
  for (const char* source : {"/results", "/relative", "/results/secret", "/to-real"}) {
    auto r = runMoat({"run", "-v", shared.dir() + source + ":/mnt/x", "--", "sh", "-c",
                      "cat /mnt/x/secret /mnt/x 2>&1; echo planted > /mnt/x/planted"});
    EXPECT_EQ(r.exitCode, 2) << source << ": " << describeResult(r);
    EXPECT_NE(r.err.find("is a symlink (to "), std::string::npos) << source << ": " << describeResult(r);
    EXPECT_EQ(r.out.find("host secret"), std::string::npos) << source << ": " << describeResult(r);
    canary.expectUntouched("a run binding " + shared.dir() + source);
  }
  // What the environment made that is no link is its to share.
  auto real = runMoat({"run", "-v", shared.dir() + "/real:/mnt/x", "--", "cat", "/mnt/x/mark"});
  EXPECT_EQ(real.exitCode, 0) << describeResult(real);
  EXPECT_EQ(real.out, "env\n");
  // A link the environment made through its id-mapped bind is host root's
  // on disk, like one an admin made: no link is followed, and the error
  // says where it leads.
  struct stat st;
  ASSERT_EQ(::lstat((shared.dir() + "/results").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u) << "the planted link is host root's";
  std::string rootLink = shared.dir() + "-link";
  ASSERT_TRUE(os::symlink(shared.dir() + "/real", rootLink).ok());
  auto viaRoot = runMoat({"run", "-v", rootLink + ":/mnt/x", "--", "cat", "/mnt/x/mark"});
  ::unlink(rootLink.c_str());
  EXPECT_EQ(viaRoot.exitCode, 2) << describeResult(viaRoot);
  EXPECT_NE(viaRoot.err.find(rootLink + " is a symlink (to " + shared.dir() + "/real)"), std::string::npos)
      << describeResult(viaRoot);
}

// The same while an environment swaps the directory for a link out as fast
// as it can: every bind is either refused or of the real directory.
TEST(HostVolumes, ADirectorySwappedForALinkDuringBindsLeadsNowhere) {
  MOAT_REQUIRE_ROOT();
  HostCanary canary;
  SharedDirectory shared;
  // Renames in a tight loop: /data/x is the real directory, nothing, a
  // link to the canary, nothing, and again.
  const std::string swap =
      "import os, sys\n"
      "os.mkdir('/data/d'); open('/data/d/mark', 'w').write('env\\n')\n"
      "os.symlink('" +
      canary.dir() +
      "', '/data/l')\n"
      "print('swapping', flush=True)\n"
      "while True:\n"
      "  os.rename('/data/d', '/data/x'); os.rename('/data/x', '/data/d')\n"
      "  os.rename('/data/l', '/data/x'); os.rename('/data/x', '/data/l')\n";
  RunningProcess swapper({binDir() + "/moat", "run", "-v", shared.dir() + ":/data", "--", "python3", "-c", swap},
                         {{"MOAT_STATE", testStateDir()}, {"MOAT_STORAGE_GB", "8"}});
  ASSERT_EQ(swapper.readLine(), "swapping\n");
  // Until both outcomes were seen a few times (the race is live), at most
  // 300 binds: each one made shows the real directory, none shows the
  // canary. Refusals come at any step: the path missing or a link when the
  // CLI checks it (2), or when the environment is made, or the directory
  // removed between its open and its mount (125).
  int refused = 0, bound = 0;
  for (int i = 0; i < 300 && (bound < 5 || refused < 5); ++i) {
    auto r = runMoat({"run", "-v", shared.dir() + "/x:/mnt/x", "--", "sh", "-c", "cat /mnt/x/* 2>/dev/null; true"});
    EXPECT_EQ(r.out.find("host"), std::string::npos) << describeResult(r);
    EXPECT_TRUE(r.exitCode == 0 || r.exitCode == 2 || r.exitCode == 125) << describeResult(r);
    if (r.exitCode == 0) {
      EXPECT_TRUE(r.out == "env\n" || r.out.empty()) << describeResult(r);
      ++bound;
    } else {
      ++refused;
    }
  }
  ::kill(swapper.pid(), SIGTERM);
  swapper.wait();
  canary.expectUntouched("binds of a directory swapped for a link");
  std::printf("binds: %d made, %d refused\n", bound, refused);
  EXPECT_GT(bound, 0) << "no bind was made: the race was not run";
  EXPECT_GT(refused, 0) << "no bind was refused: the race was not run";
}

// --- the file API over files the kernel makes up ------------------------------

// A link to /proc/self/pagemap under a harmless name: reading it through
// the file API streamed moat-init's page tables without end (300 MB before
// the client was cut; stat said 18 bytes, the link's size).
TEST_F(HostTree, FilesTheKernelMakesUpAreRefusedByTheFileApi) {
  std::string id = createEnv();
  run(id, "ln -sf /proc/self/pagemap /workspace/result.txt && mkfifo /workspace/fifo");
  for (const std::string& path :
       std::vector<std::string>{"/workspace/result.txt", "/proc/self/pagemap", "/proc/self/status"}) {
    auto r = daemon_->request("GET", "/v1/environments/" + id + "/files?path=" + path);
    EXPECT_EQ(r.status, 400) << path << ": " << r.body.substr(0, 300);
    EXPECT_NE(r.body.find("procfs"), std::string::npos) << path << ": " << r.body.substr(0, 300);
  }
  auto fifo = daemon_->request("GET", "/v1/environments/" + id + "/files?path=/workspace/fifo");
  EXPECT_EQ(fifo.status, 400) << fifo.body;
  EXPECT_NE(fifo.body.find("not a regular file"), std::string::npos) << fifo.body;
  auto cp = runMoat({"cp", id + ":/workspace/result.txt", "-"}, "", {{"MOAT_STATE", daemon_->stateDir()}});
  EXPECT_NE(cp.exitCode, 0);
  EXPECT_EQ(cp.out, "");
  EXPECT_NE(cp.err.find("procfs"), std::string::npos) << cp.err;
  // Regular files still read, and the environment is as it was.
  run(id, "echo fine > /workspace/ok");
  auto ok = daemon_->request("GET", "/v1/environments/" + id + "/files?path=/workspace/ok");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "fine\n");
}

// moat-init is pid 1: its /proc/self/fd holds the pipes of other clients'
// commands and /proc/self/exe is its host binary. Through the file API a
// key that may write files wrote into another command's stdin (a gate that
// asks for run_command, passed) and read moat-init's binary.
TEST_F(HostTree, TheFileApiFollowsNoProcMagicLink) {
  std::string id = createEnv();
  json reader = call("POST", "/v1/environments/" + id + "/processes",
                     {{"cmd", {"sh", "-c", "read line; echo GOT: $line"}}, {"stdin", true}}, 201);
  std::string pid = std::to_string(reader.value("id", 0));
  for (int fd = 0; fd < 24; ++fd) {
    std::string path = "/proc/self/fd/" + std::to_string(fd);
    auto put = daemon_->request("PUT", "/v1/environments/" + id + "/files?path=" + path, "INJECTED\n");
    // 400 "does not follow" for an open descriptor, 404 for a number not open.
    EXPECT_TRUE(put.status == 400 || put.status == 404) << path << ": " << put.body;
    if (put.status == 400) {
      EXPECT_NE(put.body.find("does not follow"), std::string::npos) << put.body;
    }
    auto get = daemon_->request("GET", "/v1/environments/" + id + "/files?path=" + path);
    EXPECT_NE(get.status, 200) << path;
  }
  for (const char* path : {"/proc/self/exe", "/proc/1/exe", "/proc/self/root/etc/hostname"}) {
    auto get = daemon_->request("GET", "/v1/environments/" + id + "/files?path=" + path);
    EXPECT_EQ(get.status, 400) << path << ": " << get.body.substr(0, 200);
    EXPECT_NE(get.body.find("does not follow"), std::string::npos) << path << ": " << get.body.substr(0, 200);
  }
  // The reader got nothing of it: what it reads now is what its own stdin says.
  call("POST", "/v1/environments/" + id + "/processes/" + pid + "/stdin", {{"data", "mine\n"}, {"close", true}}, 204);
  auto out = daemon_->stream("/v1/environments/" + id + "/processes/" + pid + "/output?follow=1");
  std::string all, line;
  while (out.nextLine(line)) all += line;
  EXPECT_NE(all.find("GOT: mine"), std::string::npos) << all;
  EXPECT_EQ(all.find("INJECTED"), std::string::npos) << all;
  // Ordinary links still resolve inside, as for any process there.
  run(id, "echo fine > /workspace/real && ln -s /workspace/real /workspace/link");
  auto viaLink = daemon_->request("GET", "/v1/environments/" + id + "/files?path=/workspace/link");
  EXPECT_EQ(viaLink.status, 200);
  EXPECT_EQ(viaLink.body, "fine\n");
}

// moat cp's host side: an environment given a directory (moat run -v) plants
// links there; a root operator copying to or from that directory must not
// write or read through them. And a sparse file of the environment's takes
// no more of the host's disk than it did of the environment's.
TEST_F(HostTree, MoatCpFollowsNoHostLinkAndKeepsHoles) {
  HostCanary canary;
  SharedDirectory shared;
  auto plant = runMoat({"run", "-v", shared.dir() + ":/data", "--", "sh", "-c",
                        "ln -s " + canary.dir() + "/secret /data/report.txt && ln -s " + canary.dir() +
                            "/hosts /data/input.txt && ln -s " + canary.dir() + " /data/dir"});
  ASSERT_EQ(plant.exitCode, 0) << describeResult(plant);
  std::string id = createEnv();
  run(id, "echo attacker > /workspace/report.txt && truncate -s 2G /workspace/sparse && echo end >> /workspace/sparse");
  std::map<std::string, std::string> env = {{"MOAT_STATE", daemon_->stateDir()}};
  for (const std::string& target : {shared.dir() + "/report.txt", shared.dir() + "/dir/hostname"}) {
    auto down = runMoat({"cp", "--no-progress", id + ":/workspace/report.txt", target}, "", env);
    EXPECT_NE(down.exitCode, 0) << target << ": " << describeResult(down);
    EXPECT_NE(down.err.find("is a symlink"), std::string::npos) << describeResult(down);
  }
  auto up = runMoat({"cp", "--no-progress", shared.dir() + "/input.txt", id + ":/workspace/stolen"}, "", env);
  EXPECT_NE(up.exitCode, 0) << describeResult(up);
  EXPECT_NE(up.err.find("is a symlink"), std::string::npos) << describeResult(up);
  EXPECT_NE(run(id, "cat /workspace/stolen 2>&1; true")["stdout"].get<std::string>().find("No such file"),
            std::string::npos);
  canary.expectUntouched("moat cp through links planted in a shared directory");
  // Holes: 2 GiB, 4 bytes of data at its end.
  std::string sparse = shared.dir() + "/sparse";
  auto holes = runMoat({"cp", "--no-progress", id + ":/workspace/sparse", sparse}, "", env);
  ASSERT_EQ(holes.exitCode, 0) << describeResult(holes);
  struct stat st;
  ASSERT_EQ(::stat(sparse.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, (2LL << 30) + 4);
  EXPECT_LT(st.st_blocks * 512, 1 << 20) << "the copy filled the host's disk with zeros";
  EXPECT_EQ(os::readFile(sparse, 1 << 20).ok(), true);
  // To a pipe (stdout), the holes are zeros: the same bytes as a cat.
  run(id, "truncate -s 3M /workspace/small && echo mid | dd of=/workspace/small bs=1M seek=1 conv=notrunc 2>/dev/null");
  auto piped = runMoat({"cp", "--no-progress", id + ":/workspace/small", "-"}, "", env);
  ASSERT_EQ(piped.exitCode, 0) << describeResult(piped);
  EXPECT_EQ(piped.out, std::string(1 << 20, '\0') + "mid\n" + std::string((2 << 20) - 4, '\0'));
}

// A volume nested in another whose host directory lacks the mount point:
// moat made it, as host root, inside that host directory. Refused now.
TEST(HostVolumes, AMountPointIsNeverMadeInsideAnotherBind) {
  MOAT_REQUIRE_ROOT();
  SharedDirectory outer;
  std::string inner = outer.dir() + "-inner";
  ASSERT_TRUE(os::makeDir(inner, 0755).ok());
  auto r = runMoat({"run", "-v", outer.dir() + ":/data", "-v", inner + ":/data/sub", "--", "true"});
  EXPECT_NE(r.exitCode, 0) << describeResult(r);
  EXPECT_NE(r.err.find("would have to be made inside another mount"), std::string::npos) << describeResult(r);
  EXPECT_FALSE(os::exists(outer.dir() + "/sub")) << "made in the host directory";
  // Where the host directory has it, the nested volume is fine.
  ASSERT_TRUE(os::makeDir(outer.dir() + "/sub", 0755).ok());
  ASSERT_TRUE(os::writeFile(inner + "/mark", "inner\n").ok());
  auto ok = runMoat({"run", "-v", outer.dir() + ":/data", "-v", inner + ":/data/sub", "--", "cat", "/data/sub/mark"});
  EXPECT_EQ(ok.out, "inner\n") << describeResult(ok);
  (void)os::removeTree(inner);
}

}  // namespace
}  // namespace moat::test
