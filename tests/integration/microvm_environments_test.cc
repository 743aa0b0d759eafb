// moatd's microVM environments (spec.isolation "microvm", docs/MICROVM.md):
// the same API as a namespace environment's, each a QEMU of its own with
// moat-init as the guest's pid 1; what they cannot do yet is refused by
// name. TCG here: a create boots a guest (seconds).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "backend/microvm/guest_kernel.h"
#include "moatd_fixture.h"
#include "os/file.h"

namespace moat::test {
namespace {

// The processes that hold a file under `dir` open.
std::vector<std::string> holdersOf(const std::string& dir) {
  std::vector<std::string> found;
  DIR* procs = ::opendir("/proc");
  while (dirent* p = procs ? ::readdir(procs) : nullptr) {
    if (p->d_name[0] < '1' || p->d_name[0] > '9') continue;
    const std::string fds = std::string("/proc/") + p->d_name + "/fd";
    DIR* d = ::opendir(fds.c_str());
    while (dirent* e = d ? ::readdir(d) : nullptr) {
      char target[4096];
      ssize_t n = ::readlink((fds + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n > 0 && std::string(target, static_cast<size_t>(n)).rfind(dir, 0) == 0) found.push_back(p->d_name);
    }
    if (d) ::closedir(d);
  }
  if (procs) ::closedir(procs);
  return found;
}

class MicroVmEnvironments : public MoatdFixture {
 protected:
  void SetUp() override {
    MoatdFixture::SetUp();
    if (IsSkipped()) return;
    auto kernel = backend::microvm::findGuestKernel();
    ASSERT_TRUE(kernel.ok()) << kernel.error().message() << " (make deps installs it)";
    kernelVersion_ = kernel->version;
    // A root file system of one program: root's, writable by root alone.
    char tmpl[] = "/tmp/moat-vm-tree-XXXXXX";
    tree_ = ::mkdtemp(tmpl);
    ASSERT_EQ(::chmod(tree_.c_str(), 0755), 0);
    ASSERT_TRUE(os::makeDirs(tree_ + "/bin", 0755).ok());
    auto tool = os::readFile(binDir() + "/moat-guest-tool", 64 << 20);
    ASSERT_TRUE(tool.ok()) << tool.error().message();
    ASSERT_TRUE(os::writeFile(tree_ + "/bin/tool", tool.value(), 0755).ok());
  }
  void TearDown() override {
    daemon_.reset();
    if (!tree_.empty()) (void)os::removeTree(tree_);
  }
  json vmBody(json extra = json::object()) {
    json body = {{"template", tree_}, {"spec", {{"isolation", "microvm"}, {"ram_mb", 256}}}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return body;
  }
  std::string tree_, kernelVersion_;
};

TEST_F(MicroVmEnvironments, RunCommandsAndHoldFilesOnTheirOwnKernelAndLeaveNothingBehind) {
  json health = call("GET", "/healthz", nullptr, 200);
  EXPECT_EQ(health["microvm"]["available"], true) << health.dump();
  EXPECT_EQ(health["microvm"]["accel"], "tcg");
  json env = call("POST", "/v1/environments", vmBody(), 201);
  ASSERT_EQ(env["state"], "running") << env.dump();
  const std::string id = env["id"];
  EXPECT_EQ(env["spec"]["isolation"], "microvm");
  EXPECT_EQ(env["accel"], "tcg");
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["spec"]["isolation"], "microvm");
  // The guest's kernel, not the host's.
  json uname = exec(id, {{"cmd", {"/bin/tool", "uname"}}});
  EXPECT_EQ(uname["exit_code"], 0) << uname.dump();
  EXPECT_EQ(uname["stdout"], kernelVersion_ + "\n");
  // Files through the API land in the guest and come back.
  const std::string files = "/v1/environments/" + id + "/files";
  auto put = daemon_->request("PUT", files + "?path=/workspace/note", "from the host");
  EXPECT_EQ(put.status, 200) << put.body;
  json cat = exec(id, {{"cmd", {"/bin/tool", "cat", "/workspace/note"}}});
  EXPECT_EQ(cat["stdout"], "from the host") << cat.dump();
  EXPECT_EQ(exec(id, {{"cmd", {"/bin/tool", "write", "/workspace/made", "in the guest"}}})["exit_code"], 0);
  EXPECT_EQ(daemon_->request("GET", files + "?path=/workspace/made").body, "in the guest");
  EXPECT_EQ(daemon_->request("GET", files + "?path=/../../etc/shadow").status / 100, 4);
  // Its usage is QEMU's, as the host counts it.
  json stats = call("GET", "/v1/environments/" + id + "/stats", nullptr, 200);
  EXPECT_GT(stats["memory_bytes"].get<uint64_t>(), 16u << 20) << stats.dump();
  // Destroyed: QEMU is gone and nothing holds or keeps its files.
  const std::string vmDir = daemon_->stateDir() + "/microvm/vms/" + id;
  struct stat st;
  ASSERT_EQ(::stat(vmDir.c_str(), &st), 0) << "its directory, while it runs";
  EXPECT_FALSE(holdersOf(vmDir).empty()) << "QEMU holds its console log";
  call("DELETE", "/v1/environments/" + id, nullptr, 204);
  for (int i = 0; i < 200 && call("GET", "/v1/environments/" + id, nullptr, 200)["state"] != "gone"; ++i) {
    ::usleep(50000);  // destroy is asynchronous: bounded polling of its state
  }
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "gone");
  EXPECT_NE(::stat(vmDir.c_str(), &st), 0) << "its directory went with it";
  EXPECT_TRUE(holdersOf(vmDir).empty()) << "no process of it is left";
}

TEST_F(MicroVmEnvironments, WhatTheyCannotDoYetIsRefusedByName) {
  auto bad =
      daemon_->request("POST", "/v1/environments", json{{"template", tree_}, {"spec", {{"isolation", "vm"}}}}.dump());
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("spec.isolation"), std::string::npos) << bad.body;
  // The host's own tree is not made into an image.
  auto host = daemon_->request("POST", "/v1/environments", json{{"spec", {{"isolation", "microvm"}}}}.dump());
  EXPECT_EQ(host.status, 400);
  EXPECT_NE(host.body.find("needs a root file system"), std::string::npos) << host.body;
  // No network device yet: refused before a guest boots.
  auto net = daemon_->request("POST", "/v1/environments",
                              vmBody({{"network", {{"mode", "allowlist"}, {"allow", {"example.com"}}}}}).dump());
  EXPECT_EQ(net.status, 400);
  EXPECT_NE(net.body.find("no network yet"), std::string::npos) << net.body;
  auto small = daemon_->request("POST", "/v1/environments",
                                json{{"template", tree_}, {"spec", {{"isolation", "microvm"}, {"ram_mb", 64}}}}.dump());
  EXPECT_EQ(small.status, 400);
  EXPECT_NE(small.body.find("at least 128 MB"), std::string::npos) << small.body;
  json env = call("POST", "/v1/environments", vmBody(), 201);
  const std::string id = env["id"];
  for (auto [method, path, body, word] : std::vector<std::tuple<std::string, std::string, json, std::string>>{
           {"POST", "/snapshots", json{{"name", "s"}}, "a snapshot"},
           {"POST", "/fork", json::object(), "a fork"},
           {"GET", "/changes", nullptr, "a review of changed files"}}) {
    auto r = daemon_->request(method, "/v1/environments/" + id + path, body.is_null() ? "" : body.dump());
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_NE(r.body.find(word + " is not available for microvm environments yet"), std::string::npos)
        << path << ": " << r.body;
  }
  // It still serves.
  EXPECT_EQ(exec(id, {{"cmd", {"/bin/tool", "uname"}}})["stdout"], kernelVersion_ + "\n");
}

// Its QEMUs die with moatd (however it ends), and the next moatd says so.
TEST_F(MicroVmEnvironments, EndWithTheMoatdThatRanThemAndTheNextOneSaysSo) {
  json env = call("POST", "/v1/environments", vmBody(), 201);
  const std::string id = env["id"];
  const std::string vmDir = daemon_->stateDir() + "/microvm/vms/" + id;
  ASSERT_FALSE(holdersOf(vmDir).empty()) << "QEMU runs";
  daemon_->kill9();
  for (int i = 0; i < 200 && !holdersOf(vmDir).empty(); ++i) ::usleep(50000);  // bounded: SIGKILL is on its way
  EXPECT_TRUE(holdersOf(vmDir).empty()) << "QEMU died with moatd";
  daemon_->restart();
  json after = call("GET", "/v1/environments/" + id, nullptr, 200);
  EXPECT_EQ(after["state"], "failed");
  EXPECT_NE(after.value("reason", "").find("a microVM environment ends with the moatd that ran it"), std::string::npos)
      << after.dump();
  struct stat st;
  EXPECT_NE(::stat(vmDir.c_str(), &st), 0) << "the next moatd cleared what the last one left";
}

}  // namespace
}  // namespace moat::test
