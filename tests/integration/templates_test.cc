// Templates from OCI images: the importer against hostile images (what
// umoci does with them is checked here, not assumed), and moatd end to end
// (import, an environment from it with the image's defaults, delete).
// Images are written offline by tests/integration/oci_image.py.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/sanitizer.h"
#include "moatd_fixture.h"
#include "store/store.h"
#include "templates/importer.h"

namespace moat::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string tempDir() {
  char path[] = "/tmp/moat-templates-test-XXXXXX";
  return ::mkdtemp(path) ? path : "";
}

// Writes an image (oci_image.py's JSON description).
void writeImage(const json& spec) {
  std::string cmd = "python3 " MOAT_SOURCE_DIR "/tests/integration/oci_image.py '" + spec.dump() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd.substr(0, 400);
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The host files a shell needs inside: dash, cat and the C library.
json shellLayer() {
  json layer = json::array();
  for (const char* dir : {"bin", "lib", "lib/x86_64-linux-gnu", "lib64", "etc"}) {
    layer.push_back({{"name", dir}, {"type", "dir"}});
  }
  layer.push_back({{"name", "bin/sh"}, {"host", "/bin/dash"}});
  layer.push_back({{"name", "bin/cat"}, {"host", "/usr/bin/cat"}});
  for (const char* lib : {"lib/x86_64-linux-gnu/libc.so.6"})
    layer.push_back({{"name", lib}, {"host", std::string("/") + lib}});
  layer.push_back({{"name", "lib64/ld-linux-x86-64.so.2"}, {"host", "/lib64/ld-linux-x86-64.so.2"}});
#if MOAT_ASAN
  // moat-init of a sanitized build is linked dynamically (ASan has no static
  // runtime with glibc): the environments of these images need its libraries
  // too. A release build's moat-init is static.
  for (const char* lib :
       {"lib/x86_64-linux-gnu/libstdc++.so.6", "lib/x86_64-linux-gnu/libm.so.6", "lib/x86_64-linux-gnu/libgcc_s.so.1"})
    layer.push_back({{"name", lib}, {"host", std::string("/") + lib}});
#endif
  layer.push_back(
      {{"name", "etc/passwd"}, {"data", "root:x:0:0:root:/root:/bin/sh\napp:x:1234:2345:app:/home/app:/bin/sh\n"}});
  layer.push_back({{"name", "etc/group"}, {"data", "root:x:0:\napp:x:2345:\n"}});
  return layer;
}

class TemplateImport : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!isRoot()) GTEST_SKIP() << "needs root: umoci unpacks with the image's owners and device nodes";
    if (::access("/usr/bin/skopeo", X_OK) != 0 || ::access("/usr/bin/umoci", X_OK) != 0) {
      GTEST_SKIP() << "needs skopeo and umoci (scripts/install-deps.sh)";
    }
    dir_ = tempDir();
    ASSERT_FALSE(dir_.empty());
    fs::create_directories(dir_ + "/work");
    fs::create_directories(dir_ + "/outside");
    std::ofstream(dir_ + "/secret") << "host secret";
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  Result<templates::Imported> import(const json& layers, templates::ImportLimits limits = {},
                                     const json& config = json::object()) {
    writeImage({{"format", "oci"}, {"out", dir_ + "/image"}, {"layers", layers}, {"config", config}});
    templates::ImportJob job;
    job.source = templates::parseSource("oci:" + dir_ + "/image:latest").value();
    job.workDir = dir_ + "/work";
    job.limits = limits;
    return templates::importImage(job);
  }
  std::string dir_;
};

TEST_F(TemplateImport, HostileNamesAndLinksStayInsideTheTree) {
  const std::string outside = dir_ + "/outside";
  auto imported = import(json::array(
      {json::array({{{"name", "../../../escape-dotdot"}, {"data", "x"}},
                    {{"name", "/escape-absolute"}, {"data", "y"}},
                    {{"name", "evil"}, {"type", "symlink"}, {"target", outside}},
                    {{"name", "evil-relative"}, {"type", "symlink"}, {"target", "../../../../../../" + outside}},
                    {{"name", "hard"}, {"type", "hardlink"}, {"target", dir_ + "/secret"}},
                    {{"name", dir_.substr(1) + "/secret"}, {"data", "inner"}}}),
       // A later layer writes through the links a former one planted.
       json::array({{{"name", "evil/pwned"}, {"data", "z"}}, {{"name", "evil-relative/pwned2"}, {"data", "z"}}})}));
  // The hard link names a file the tree does not hold (yet: it comes after
  // it): umoci refuses rather than link the host's.
  ASSERT_FALSE(imported.ok());
  EXPECT_NE(imported.error().message().find("hard"), std::string::npos) << imported.error().message();
  EXPECT_TRUE(fs::is_empty(outside));
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u) << "the host's file gained a link";
  EXPECT_EQ(readText(dir_ + "/secret"), "host secret");

  // The same without the refused link: everything lands inside.
  fs::remove_all(dir_ + "/image");
  fs::remove_all(dir_ + "/work");
  fs::create_directories(dir_ + "/work");
  imported = import(json::array(
      {json::array({{{"name", "../../../escape-dotdot"}, {"data", "x"}},
                    {{"name", "/escape-absolute"}, {"data", "y"}},
                    {{"name", "evil"}, {"type", "symlink"}, {"target", outside}},
                    {{"name", "evil-relative"}, {"type", "symlink"}, {"target", "../../../../../../" + outside}},
                    {{"name", dir_.substr(1) + "/secret"}, {"data", "inner"}},
                    {{"name", "hard"}, {"type", "hardlink"}, {"target", dir_ + "/secret"}}}),
       json::array({{{"name", "evil/pwned"}, {"data", "z"}}, {{"name", "evil-relative/pwned2"}, {"data", "z"}}})}));
  ASSERT_TRUE(imported.ok()) << imported.error().message();
  const std::string root = imported->rootfs;
  EXPECT_TRUE(fs::is_empty(outside)) << "a write through a planted symlink left the tree";
  EXPECT_FALSE(fs::exists(dir_ + "/escape-dotdot"));
  EXPECT_FALSE(fs::exists("/escape-absolute"));
  EXPECT_EQ(readText(root + "/escape-dotdot"), "x");
  EXPECT_EQ(readText(root + "/escape-absolute"), "y");
  EXPECT_EQ(readText(root + outside + "/pwned"), "z");
  // The hard link is to the tree's own copy of the path, not the host's.
  EXPECT_EQ(readText(root + "/hard"), "inner");
  ASSERT_EQ(::stat((dir_ + "/secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_EQ(readText(dir_ + "/secret"), "host secret");
}

TEST_F(TemplateImport, DeviceNodesAreDroppedAndSetuidBitsKept) {
  auto imported =
      import(json::array({json::array({{{"name", "dev"}, {"type", "dir"}},
                                       {{"name", "dev/sda"}, {"type", "block"}, {"major", 8}, {"minor", 0}},
                                       {{"name", "mem"}, {"type", "char"}, {"major", 1}, {"minor", 1}},
                                       {{"name", "whiteout-like"}, {"type", "char"}, {"major", 0}, {"minor", 0}},
                                       {{"name", "fifo"}, {"type", "fifo"}},
                                       {{"name", "suid"}, {"data", "#!/bin/sh\n"}, {"mode", 04755}}})}));
  ASSERT_TRUE(imported.ok()) << imported.error().message();
  EXPECT_EQ(imported->devicesDropped, 3u);
  EXPECT_FALSE(fs::exists(fs::symlink_status(imported->rootfs + "/dev/sda")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(imported->rootfs + "/mem")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(imported->rootfs + "/whiteout-like")));
  EXPECT_TRUE(fs::is_fifo(imported->rootfs + "/fifo"));
  struct stat st;
  ASSERT_EQ(::stat((imported->rootfs + "/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u) << "kept: the template directory is root's 0700, environments run no_new_privs";
}

TEST_F(TemplateImport, ABombOfTinyFilesIsRefusedBeforeAnythingIsUnpacked) {
  templates::ImportLimits limits;
  limits.maxEntries = 1000;
  auto imported = import(json::array({json::array({{{"many", 200000}, {"prefix", "f"}}})}), limits);
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.error().code, Code::kTooLarge);
  EXPECT_NE(imported.error().message().find("more than 1000 files"), std::string::npos) << imported.error().message();
  EXPECT_FALSE(fs::exists(dir_ + "/work/rootfs")) << "refused before the unpack";
}

TEST_F(TemplateImport, ALayerOverTheByteLimitIsRefused) {
  templates::ImportLimits limits;
  limits.maxBytes = 16u << 20;
  auto imported = import(json::array({json::array({{{"name", "big"}, {"zeros", 64u << 20}}})}), limits);
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.error().code, Code::kTooLarge);
  EXPECT_NE(imported.error().message().find("16777216 bytes"), std::string::npos) << imported.error().message();
  EXPECT_FALSE(fs::exists(dir_ + "/work/rootfs"));
}

TEST_F(TemplateImport, AnImportPastItsDeadlineEndsWithATimeout) {
  templates::ImportLimits limits;
  limits.timeout = std::chrono::seconds(0);
  auto imported = import(json::array({shellLayer()}), limits);
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.error().code, Code::kTimeout) << imported.error().message();
  EXPECT_NE(imported.error().message().find("did not finish in time"), std::string::npos);
}

TEST_F(TemplateImport, TheImageUserIsResolvedInItsOwnPasswd) {
  auto imported = import(json::array({shellLayer()}), {},
                         {{"User", "app"}, {"Env", {"A=1"}}, {"WorkingDir", "/home/app"}, {"Cmd", {"sh"}}});
  ASSERT_TRUE(imported.ok()) << imported.error().message();
  EXPECT_EQ(imported->config.uid, 1234u);
  EXPECT_EQ(imported->config.gid, 2345u);
  EXPECT_EQ(imported->config.home, "/home/app");
  EXPECT_EQ(imported->config.workingDir, "/home/app");
  EXPECT_EQ(imported->config.env, std::vector<std::string>{"A=1"});
  EXPECT_EQ(imported->config.cmd, std::vector<std::string>{"sh"});
}

TEST_F(TemplateImport, AnUnknownUserFailsTheImportWithItsName) {
  auto imported = import(json::array({shellLayer()}), {}, {{"User", "nobody-here"}});
  ASSERT_FALSE(imported.ok());
  EXPECT_NE(imported.error().message().find("nobody-here"), std::string::npos) << imported.error().message();
}

class Templates : public MoatdFixture {
 protected:
  void SetUp() override {
    MoatdFixture::SetUp();
    if (IsSkipped()) return;
    if (::access("/usr/bin/skopeo", X_OK) != 0 || ::access("/usr/bin/umoci", X_OK) != 0) {
      GTEST_SKIP() << "needs skopeo and umoci (scripts/install-deps.sh)";
    }
    dir_ = tempDir();
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // Polls GET until the import ends (bounded).
  json waitForImport(const std::string& name) {
    json t;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    do {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the import runs in moatd; polled as the CLI does
      t = call("GET", "/v1/templates/" + name, nullptr, 200);
    } while ((t.value("state", "") == "importing" || t.value("state", "") == "building") &&
             std::chrono::steady_clock::now() < deadline);
    return t;
  }
  // The snapshots a built template keeps (listed to the master token, by name).
  json templateSnapshots(const std::string& name) {
    json out = json::array();
    const json list = call("GET", "/v1/snapshots", nullptr, 200);
    for (const auto& s : list["snapshots"]) {
      if (s["name"] == "template " + name) out.push_back(s);
    }
    return out;
  }
  // Environments of builds still there.
  size_t buildEnvironments() {
    size_t n = 0;
    const json list = call("GET", "/v1/environments", nullptr, 200);
    for (const auto& e : list["environments"]) {
      if (e["labels"].contains("moat.template_build") && e["state"] != "gone" && e["state"] != "failed") ++n;
    }
    return n;
  }
  std::string catFile(const std::string& id, const std::string& path) {
    return exec(id, {{"cmd", {"cat", path}}})["stdout"];
  }
  std::string imagesDir() { return daemon_->stateDir() + "/templates/images"; }
  std::string dir_;
};

TEST_F(Templates, AnImageBecomesATemplateWhoseEnvironmentsSeeItsFilesAndDefaults) {
  json layer = shellLayer();
  layer.push_back({{"name", "srv"}, {"type", "dir"}});
  layer.push_back({{"name", "srv/app"}, {"type", "dir"}, {"uid", 1234}, {"gid", 2345}});
  layer.push_back({{"name", "hello.txt"}, {"data", "from the image\n"}});
  writeImage({{"format", "docker-archive"},
              {"out", dir_ + "/image.tar"},
              {"layers", {layer}},
              {"config",
               {{"Env", {"PATH=/bin", "GREETING=hello", "OVERRIDDEN=image"}},
                {"WorkingDir", "/srv/app"},
                {"User", "app"},
                {"Entrypoint", {"/bin/sh", "-c"}},
                {"Cmd", {"echo default $GREETING from $PWD"}}}}});
  json started =
      call("POST", "/v1/templates", {{"name", "demo:1.0"}, {"source", "docker-archive:" + dir_ + "/image.tar"}}, 202);
  EXPECT_EQ(started["state"], "importing");
  EXPECT_EQ(started["name"], "demo:1.0");
  // The name is taken while it imports.
  call("POST", "/v1/templates", {{"name", "demo:1.0"}, {"source", "docker-archive:" + dir_ + "/image.tar"}}, 409);
  json t = waitForImport("demo:1.0");
  ASSERT_EQ(t["state"], "ready") << t.dump();
  EXPECT_GT(t["size_bytes"].get<uint64_t>(), 100000u);
  EXPECT_EQ(t["config"]["working_dir"], "/srv/app");
  EXPECT_EQ(t["config"]["user"], "app");
  EXPECT_EQ(t["config"]["entrypoint"], json({"/bin/sh", "-c"}));
  EXPECT_EQ(t["config"]["cmd"], json({"echo default $GREETING from $PWD"}));
  EXPECT_FALSE(t["config"].contains("uid")) << "internal";
  json list = call("GET", "/v1/templates", nullptr, 200);
  ASSERT_EQ(list["templates"].size(), 2u) << list.dump();
  EXPECT_EQ(list["templates"][0]["name"], "host");
  EXPECT_EQ(list["templates"][0]["source"], "builtin");
  // Private: the images directory is root's alone.
  struct stat st;
  ASSERT_EQ(::stat(imagesDir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, 0u);

  std::string id = createEnv({{"template", "demo:1.0"}, {"env", {{"OVERRIDDEN", "request"}}}});
  ASSERT_FALSE(id.empty());
  json r = exec(id, {{"cmd",
                      {"/bin/sh", "-c",
                       "echo $GREETING $OVERRIDDEN $HOME $USER; pwd; cat /hello.txt; "
                       "while read k v rest; do [ \"$k\" = Uid: ] && echo uid=$v; done < /proc/self/status; true"}}});
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  EXPECT_EQ(r["stdout"], "hello request /home/app app\n/srv/app\nfrom the image\nuid=1234\n") << r.dump();
  // No cmd: the image's Entrypoint then Cmd, as exec and as a process.
  r = exec(id, json::object());
  EXPECT_EQ(r["stdout"], "default hello from /srv/app\n") << r.dump();
  json process = call("POST", "/v1/environments/" + id + "/processes", json::object(), 201);
  EXPECT_EQ(process["cmd"], json({"/bin/sh", "-c", "echo default $GREETING from $PWD"})) << process.dump();
  // An environment of the host template has no default command: cmd is required, by name.
  std::string plain = createEnv(json::object());
  json noCmd = call("POST", "/v1/environments/" + plain + "/exec", json::object(), 400);
  EXPECT_EQ(noCmd["error"]["field"], "cmd") << noCmd.dump();
  call("DELETE", "/v1/environments/" + plain, nullptr, 204);
  // A cwd and variables the request names win.
  r = exec(id, {{"cmd", {"/bin/sh", "-c", "pwd; echo $GREETING"}}, {"cwd", "/"}, {"env", {{"GREETING", "hi"}}}});
  EXPECT_EQ(r["stdout"], "/\nhi\n") << r.dump();
  // The image's files are read-only to the environment's user, its own writes are its own.
  r = exec(id, {{"cmd", {"/bin/sh", "-c", "echo mine > /srv/app/f && cat /srv/app/f; echo x > /hello.txt"}}});
  EXPECT_EQ(r["stdout"], "mine\n") << r.dump();
  EXPECT_NE(r["exit_code"], 0) << "the image's user cannot write root's file";

  // In use: not deleted.
  json refused = call("DELETE", "/v1/templates/demo:1.0", nullptr, 409);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find(id), std::string::npos) << refused.dump();
  call("DELETE", "/v1/environments/" + id, nullptr, 204);
  call("DELETE", "/v1/templates/demo%3A1.0", nullptr, 204);
  call("GET", "/v1/templates/demo:1.0", nullptr, 404);
  EXPECT_FALSE(fs::exists(imagesDir() + "/demo:1.0"));
  EXPECT_TRUE(fs::is_empty(imagesDir())) << "no partial or deleted files left";
  json gone = call("POST", "/v1/environments", {{"template", "demo:1.0"}}, 404);
  EXPECT_NE(gone["error"]["message"].get<std::string>().find("unknown template"), std::string::npos) << gone.dump();
  std::string events = daemon_->request("GET", "/v1/events").body;
  EXPECT_NE(events.find("template.imported"), std::string::npos);
  EXPECT_NE(events.find("template.deleted"), std::string::npos);
}

TEST_F(Templates, AFailedImportSaysWhyAndLeavesNoFiles) {
  json started =
      call("POST", "/v1/templates", {{"name", "broken"}, {"source", "docker-archive:" + dir_ + "/none.tar"}}, 202);
  json t = waitForImport("broken");
  ASSERT_EQ(t["state"], "failed") << t.dump();
  EXPECT_NE(t["error"]["message"].get<std::string>().find("none.tar"), std::string::npos) << t.dump();
  EXPECT_TRUE(fs::is_empty(imagesDir()));
  json env = call("POST", "/v1/environments", {{"template", "broken"}}, 409);
  EXPECT_NE(env["error"]["message"].get<std::string>().find("failed"), std::string::npos) << env.dump();
  call("DELETE", "/v1/templates/broken", nullptr, 204);
}

TEST_F(Templates, BadRequestsAreClearErrors) {
  json e = call("POST", "/v1/templates", {{"name", "Upper"}, {"source", "docker://debian"}}, 400);
  EXPECT_EQ(e["error"]["field"], "name") << e.dump();
  e = call("POST", "/v1/templates", {{"name", "host"}, {"source", "docker://debian"}}, 400);
  e = call("POST", "/v1/templates", {{"name", "ok"}, {"source", "ftp://x"}}, 400);
  EXPECT_EQ(e["error"]["field"], "source") << e.dump();
  e = call("POST", "/v1/templates", {{"name", "ok"}, {"source", "oci:relative/dir"}}, 400);
  e = call("POST", "/v1/templates", {{"name", "ok"}}, 400);
  e = call("POST", "/v1/templates", {{"name", "ok"}, {"source", "docker://x"}, {"extra", 1}}, 400);
  call("GET", "/v1/templates/none", nullptr, 404);
  call("DELETE", "/v1/templates/none", nullptr, 404);
  call("DELETE", "/v1/templates/host", nullptr, 409);
  e = call("POST", "/v1/environments", {{"template", "Not A Name"}}, 400);
  EXPECT_EQ(e["error"]["field"], "template") << e.dump();
}

TEST_F(Templates, KeysNeedTheScopeAndMayNotNameHostPaths) {
  json key = call("POST", "/v1/keys", {{"scopes", {"templates", "read"}}}, 201);
  json reader = call("POST", "/v1/keys", {{"scopes", {"read"}}}, 201);
  auto as = [&](const json& k, const std::string& method, const std::string& target, const json& body) {
    return daemon_->request(method, target, body.is_null() ? "" : body.dump(), false,
                            {{"Authorization", "Bearer " + k["token"].get<std::string>()}});
  };
  auto r = as(key, "POST", "/v1/templates", {{"name", "k1"}, {"source", "docker-archive:/etc/passwd"}});
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("source"), std::string::npos) << r.body;
  r = as(reader, "POST", "/v1/templates", {{"name", "k1"}, {"source", "docker://localhost:1/x"}});
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("templates"), std::string::npos) << r.body;
  r = as(reader, "GET", "/v1/templates", nullptr);
  EXPECT_EQ(r.status, 200) << r.body;
  // A build makes an environment and runs commands: templates alone is not enough.
  r = as(key, "POST", "/v1/templates", {{"name", "k2"}, {"build", {{"base", "host"}, {"run", {"true"}}}}});
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("'create' and 'exec' scopes"), std::string::npos) << r.body;
  // A host path, and what a tool said of it, are the master's to see.
  call("POST", "/v1/templates", {{"name", "hostpath"}, {"source", "docker-archive:" + dir_ + "/secret-name.tar"}}, 202);
  EXPECT_EQ(waitForImport("hostpath")["state"], "failed");
  for (const std::string target : {"/v1/templates", "/v1/templates/hostpath"}) {
    r = as(reader, "GET", target, nullptr);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body.find("secret-name"), std::string::npos) << r.body;
    EXPECT_EQ(r.body.find(dir_), std::string::npos) << r.body;
    EXPECT_NE(r.body.find("\"docker-archive:\""), std::string::npos) << r.body;
  }
  EXPECT_NE(call("GET", "/v1/templates/hostpath", nullptr, 200).dump().find("secret-name.tar"), std::string::npos);
}

TEST_F(Templates, TheCliImportsListsAndRemoves) {
  writeImage(
      {{"format", "oci"}, {"out", dir_ + "/layout"}, {"layers", {shellLayer()}}, {"config", {{"Env", {"X=1"}}}}});
  auto moat = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {std::string(MOAT_BIN_DIR) + "/moat"};
    argv.insert(argv.end(), args.begin(), args.end());
    return runProcess(argv, "", {{"MOAT_STATE", daemon_->stateDir()}});
  };
  auto r = moat({"template", "import", "oci:" + dir_ + "/layout:latest", "--name", "cli-made"});
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("cli-made  ready"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("importing"), std::string::npos) << "progress while importing: " << r.err;
  r = moat({"template", "ls"});
  EXPECT_NE(r.out.find("host"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cli-made"), std::string::npos) << r.out;
  r = moat({"template", "import", "oci:" + dir_ + "/none", "--name", "cli-failed"});
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.err.find("cli-failed failed"), std::string::npos) << r.err;
  r = moat({"template", "import", "oci:" + dir_ + "/layout"});
  EXPECT_EQ(r.exitCode, 2) << "--name is required: " << r.err;
  r = moat({"template", "rm", "cli-made", "cli-failed"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(call("GET", "/v1/templates", nullptr, 200)["templates"].size(), 1u);
}

TEST_F(Templates, AnImportCutByARestartEndsFailedAndItsFilesGo) {
  daemon_->stop();
  {
    auto store = store::openSqliteStore(daemon_->stateDir() + "/moat.db");
    ASSERT_TRUE(store.ok()) << store.error().message();
    store::TemplateRecord r;
    r.name = "cut";
    r.source = "docker://example.org/x";
    r.state = store::TemplateState::kImporting;
    r.config = "{}";
    r.owner = "master";
    r.createdAtMs = 1;
    ASSERT_TRUE(store.value()->insertTemplate(r).ok());
  }
  fs::create_directories(imagesDir() + "/.partial-cut-0123456789ab/rootfs/usr");
  daemon_->restart();
  json t = call("GET", "/v1/templates/cut", nullptr, 200);
  EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_EQ(t["error"]["code"], "interrupted");
  EXPECT_NE(t["error"]["message"].get<std::string>().find("restarted"), std::string::npos) << t.dump();
  EXPECT_TRUE(fs::is_empty(imagesDir())) << "the partial files are gone";
}

// Recipes (docs/TEMPLATES.md, "Recipes").

TEST_F(Templates, ARecipeOnHostBecomesATemplateWhoseEnvironmentsAreIndependentForks) {
  json started = call("POST", "/v1/templates",
                      {{"name", "tools:1"},
                       {"build",
                        {{"base", "host"},
                         {"run", {"mkdir -p /opt && echo one > /opt/x", "echo \"$EXTRA\" >> /opt/x"}},
                         {"env", {{"EXTRA", "two"}}}}}},
                      202);
  EXPECT_EQ(started["state"], "building") << started.dump();
  EXPECT_EQ(started["source"], "build:host");
  EXPECT_TRUE(started.contains("progress")) << started.dump();
  json t = waitForImport("tools:1");
  ASSERT_EQ(t["state"], "ready") << t.dump();
  EXPECT_EQ(buildEnvironments(), 0u) << "the build's environment is destroyed";
  json snaps = templateSnapshots("tools:1");
  ASSERT_EQ(snaps.size(), 1u) << call("GET", "/v1/snapshots", nullptr, 200).dump();
  EXPECT_EQ(snaps[0]["template"], "host");

  std::string a = createEnv({{"template", "tools:1"}});
  std::string b = createEnv({{"template", "tools:1"}});
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(catFile(a, "/opt/x"), "one\ntwo\n");
  json r = exec(a, {{"cmd", {"/bin/sh", "-c", "echo three >> /opt/x && echo mine > /opt/y && cat /opt/x /opt/y"}}});
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  EXPECT_EQ(r["stdout"], "one\ntwo\nthree\nmine\n") << r.dump();
  // b is its own fork: a's writes are not in it.
  EXPECT_EQ(catFile(b, "/opt/x"), "one\ntwo\n");
  r = exec(b, {{"cmd", {"/bin/sh", "-c", "test -e /opt/y"}}});
  EXPECT_NE(r["exit_code"], 0) << "a's file shows in b";
  // The build's variables were for the build only.
  r = exec(b, {{"cmd", {"/bin/sh", "-c", "echo \"[$EXTRA]\""}}});
  EXPECT_EQ(r["stdout"], "[]\n") << r.dump();

  // The snapshot is the template's: neither the master nor a key deletes it
  // through /v1/snapshots, a key does not even see it.
  const std::string snap = snaps[0]["id"];
  json refused = call("DELETE", "/v1/snapshots/" + snap, nullptr, 409);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("tools:1"), std::string::npos) << refused.dump();
  json key = call("POST", "/v1/keys", {{"scopes", {"templates", "read", "create", "exec", "snapshots"}}}, 201);
  auto as = [&](const std::string& method, const std::string& target, const json& body) {
    return daemon_->request(method, target, body.is_null() ? "" : body.dump(), false,
                            {{"Authorization", "Bearer " + key["token"].get<std::string>()}});
  };
  EXPECT_EQ(as("DELETE", "/v1/snapshots/" + snap, nullptr).status, 404);
  EXPECT_EQ(as("GET", "/v1/snapshots", nullptr).body.find(snap), std::string::npos);
  EXPECT_EQ(as("POST", "/v1/environments", {{"snapshot", snap}}).status, 404) << "not through its id";
  // Through the template's name, a key's environment is made like any.
  auto keyed = as("POST", "/v1/environments", {{"template", "tools:1"}});
  ASSERT_EQ(keyed.status, 201) << keyed.body;
  std::string c = json::parse(keyed.body)["id"];
  EXPECT_EQ(catFile(c, "/opt/x"), "one\ntwo\n");

  // Deleting the template takes its snapshot; the environments keep their copies.
  call("DELETE", "/v1/templates/tools:1", nullptr, 204);
  EXPECT_TRUE(templateSnapshots("tools:1").empty());
  call("GET", "/v1/snapshots/" + snap, nullptr, 404);
  EXPECT_EQ(catFile(a, "/opt/x"), "one\ntwo\nthree\n");
  call("POST", "/v1/environments", {{"template", "tools:1"}}, 404);
  std::string events = daemon_->request("GET", "/v1/events").body;
  EXPECT_NE(events.find("template.built"), std::string::npos);
  EXPECT_NE(events.find("moat.template_build"), std::string::npos) << "the build's environment is in the log";
}

TEST_F(Templates, AFailingStepFailsTheBuildNamingItsStepAndExitCode) {
  call("POST", "/v1/templates",
       {{"name", "broken-build"},
        {"build", {{"base", "host"}, {"run", {"echo before", "echo oops >&2; exit 3", "touch /never"}}}}},
       202);
  json t = waitForImport("broken-build");
  ASSERT_EQ(t["state"], "failed") << t.dump();
  const std::string message = t["error"]["message"];
  EXPECT_NE(message.find("step 2/3"), std::string::npos) << message;
  EXPECT_NE(message.find("exited with code 3"), std::string::npos) << message;
  EXPECT_NE(message.find("oops"), std::string::npos) << "the tail of its output: " << message;
  EXPECT_EQ(buildEnvironments(), 0u);
  EXPECT_TRUE(templateSnapshots("broken-build").empty());
  json env = call("POST", "/v1/environments", {{"template", "broken-build"}}, 409);
  call("DELETE", "/v1/templates/broken-build", nullptr, 204);
}

TEST_F(Templates, ARecipeOnAnImageInheritsItsDefaultsAndKeepsItFromBeingDeleted) {
  json layer = shellLayer();
  layer.push_back({{"name", "srv"}, {"type", "dir"}});
  layer.push_back({{"name", "srv/app"}, {"type", "dir"}, {"uid", 1234}, {"gid", 2345}});
  writeImage({{"format", "docker-archive"},
              {"out", dir_ + "/image.tar"},
              {"layers", {layer}},
              {"config", {{"Env", {"PATH=/bin", "GREETING=hello"}}, {"WorkingDir", "/srv/app"}, {"User", "app"}}}});
  call("POST", "/v1/templates", {{"name", "base-img"}, {"source", "docker-archive:" + dir_ + "/image.tar"}}, 202);
  ASSERT_EQ(waitForImport("base-img")["state"], "ready");
  call("POST", "/v1/templates",
       {{"name", "built-img"},
        {"build", {{"base", "base-img"}, {"run", {"pwd > where; echo $GREETING $B >> where"}}, {"env", {{"B", "b"}}}}}},
       202);
  json t = waitForImport("built-img");
  ASSERT_EQ(t["state"], "ready") << t.dump();
  EXPECT_EQ(t["source"], "build:base-img");
  EXPECT_EQ(t["config"]["working_dir"], "/srv/app");
  EXPECT_EQ(t["config"]["user"], "app");
  std::string id = createEnv({{"template", "built-img"}});
  ASSERT_FALSE(id.empty());
  json r = exec(id, {{"cmd", {"/bin/sh", "-c", "cat where; pwd; echo $GREETING; echo mine > own && cat own"}}});
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  // The step ran as the image's user in its WorkingDir with its variables
  // and the recipe's; the environment gets the image's defaults again.
  EXPECT_EQ(r["stdout"], "/srv/app\nhello b\n/srv/app\nhello\nmine\n") << r.dump();
  call("DELETE", "/v1/environments/" + id, nullptr, 204);
  // The built template's snapshot sits on the image: it stays.
  json refused = call("DELETE", "/v1/templates/base-img", nullptr, 409);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("snapshot"), std::string::npos) << refused.dump();
  call("DELETE", "/v1/templates/built-img", nullptr, 204);
  call("DELETE", "/v1/templates/base-img", nullptr, 204);
}

TEST_F(Templates, BadRecipesAreClearErrors) {
  auto field = [&](const json& build, int status) {
    json e = call("POST", "/v1/templates", {{"name", "r"}, {"build", build}}, status);
    return e["error"].value("field", "");
  };
  EXPECT_EQ(field("echo", 400), "build");
  EXPECT_EQ(field(json{{"run", {"true"}}}, 400), "build.base");
  EXPECT_EQ(field(json{{"base", "host"}}, 400), "build.run");
  EXPECT_EQ(field(json{{"base", "host"}, {"run", json::array()}}, 400), "build.run");
  EXPECT_EQ(field(json{{"base", "host"}, {"run", {1}}}, 400), "build.run");
  EXPECT_EQ(field(json{{"base", "Bad Base"}, {"run", {"true"}}}, 400), "build.base");
  EXPECT_EQ(field(json{{"base", "nosuch"}, {"run", {"true"}}}, 404), "build.base");
  EXPECT_EQ(field(json{{"base", "host"}, {"run", {"true"}}, {"extra", 1}}, 400), "build.extra");
  EXPECT_EQ(field(json{{"base", "host"}, {"run", {"true"}}, {"env", {{"1BAD", "x"}}}}, 400).rfind("build.env", 0), 0u);
  call("POST", "/v1/templates", {{"name", "r"}, {"source", "docker://x"}, {"build", {{"base", "host"}}}}, 400);
  call("GET", "/v1/templates/r", nullptr, 404);
}

TEST_F(Templates, ABuildRunsUnderTheCallersCeiling) {
  // A key that may make templates, but whose ceiling denies commands.
  json key =
      call("POST", "/v1/keys",
           {{"scopes", {"templates", "read", "create", "exec"}}, {"permissions", {{"run_command", "deny"}}}}, 201);
  auto as = [&](const std::string& method, const std::string& target, const json& body) {
    return daemon_->request(method, target, body.is_null() ? "" : body.dump(), false,
                            {{"Authorization", "Bearer " + key["token"].get<std::string>()}});
  };
  auto r = as("POST", "/v1/templates", {{"name", "sneaky"}, {"build", {{"base", "host"}, {"run", {"touch /x"}}}}});
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("denied_by_policy"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("ceiling"), std::string::npos) << r.body;
  call("GET", "/v1/templates/sneaky", nullptr, 404);
  EXPECT_EQ(buildEnvironments(), 0u);
  // Only rm denied: a build of other commands is made, one with rm refused.
  json narrow =
      call("POST", "/v1/keys",
           {{"scopes", {"templates", "read", "create", "exec"}},
            {"permissions",
             {{"run_command", {{{"match", {"/bin/sh", "-c", "rm *"}}, {"action", "deny"}}, {{"action", "allow"}}}}}}},
           201);
  auto asNarrow = [&](const json& body) {
    return daemon_->request("POST", "/v1/templates", body.dump(), false,
                            {{"Authorization", "Bearer " + narrow["token"].get<std::string>()}});
  };
  r = asNarrow({{"name", "narrow-bad"}, {"build", {{"base", "host"}, {"run", {"true", "rm -rf /opt"}}}}});
  EXPECT_EQ(r.status, 403) << r.body;
  r = asNarrow({{"name", "narrow-ok"}, {"build", {{"base", "host"}, {"run", {"echo ok > /ok"}}}}});
  ASSERT_EQ(r.status, 202) << r.body;
  json t = waitForImport("narrow-ok");
  EXPECT_EQ(t["state"], "ready") << t.dump();
  // And a directory base is the master's.
  r = asNarrow({{"name", "dir-base"}, {"build", {{"base", "/"}, {"run", {"true"}}}}});
  EXPECT_EQ(r.status, 403) << r.body;
}

TEST_F(Templates, TheCliBuildsFromFlagsAndARecipeFile) {
  auto moat = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {std::string(MOAT_BIN_DIR) + "/moat"};
    argv.insert(argv.end(), args.begin(), args.end());
    return runProcess(argv, "", {{"MOAT_STATE", daemon_->stateDir()}});
  };
  auto r = moat({"template", "build", "--name", "cli-built", "--base", "host", "--run", "echo \"$A\" > /hi", "--run",
                 "echo there >> /hi", "--env", "A=hello"});
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("cli-built  ready"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("building"), std::string::npos) << "progress while building: " << r.err;
  std::string id = createEnv({{"template", "cli-built"}});
  EXPECT_EQ(catFile(id, "/hi"), "hello\nthere\n");
  call("DELETE", "/v1/environments/" + id, nullptr, 204);
  std::ofstream(dir_ + "/recipe.json") << R"({"base": "cli-built", "run": ["echo more >> /hi"]})";
  r = moat({"template", "build", "--name", "cli-file", "-f", dir_ + "/recipe.json", "--run", "exit 7"});
  EXPECT_EQ(r.exitCode, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("cli-file failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step 2/2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("code 7"), std::string::npos) << r.err;
  r = moat({"template", "build", "--name", "x", "--run", "true"});
  EXPECT_EQ(r.exitCode, 2) << "--base is required: " << r.err;
  r = moat({"template", "rm", "cli-file", "cli-built"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
}

TEST_F(Templates, ARevokedKeysBuildEndsAtItsNextStep) {
  json key = call("POST", "/v1/keys", {{"scopes", {"templates", "read", "create", "exec"}}}, 201);
  auto r = daemon_->request(
      "POST", "/v1/templates",
      json{{"name", "revoked-build"},
           {"build", {{"base", "host"}, {"run", {"while [ ! -e /tmp/go ]; do sleep 0.1; done", "touch /after"}}}}}
          .dump(),
      false, {{"Authorization", "Bearer " + key["token"].get<std::string>()}});
  ASSERT_EQ(r.status, 202) << r.body;
  // The build's environment is the key's (its ceiling rules it); the test
  // lets step 1 end once the key is revoked.
  std::string id;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (id.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polled as the CLI does
    const json list = call("GET", "/v1/environments", nullptr, 200);
    for (const auto& e : list["environments"]) {
      if (e["labels"].value("moat.template_build", "") == "revoked-build" && e["state"] == "running") id = e["id"];
    }
  }
  ASSERT_FALSE(id.empty());
  call("DELETE", "/v1/keys/" + key["id"].get<std::string>(), nullptr, 204);
  exec(id, {{"cmd", {"touch", "/tmp/go"}}});
  json t = waitForImport("revoked-build");
  EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_NE(t["error"]["message"].get<std::string>().find("revoked before step 2/2"), std::string::npos) << t.dump();
  EXPECT_EQ(buildEnvironments(), 0u);
}

TEST_F(Templates, ABuildCutByARestartEndsFailedAndLeavesNothing) {
  call("POST", "/v1/templates", {{"name", "cut-build"}, {"build", {{"base", "host"}, {"run", {"sleep 120"}}}}}, 202);
  json t;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polled as the CLI does
    t = call("GET", "/v1/templates/cut-build", nullptr, 200);
  } while (t["progress"].value("stage", "").find("step 1/1") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline);
  ASSERT_NE(t["progress"].value("stage", "").find("step 1/1: sleep 120"), std::string::npos) << t.dump();
  EXPECT_EQ(buildEnvironments(), 1u);
  daemon_->kill9();
  daemon_->restart();
  t = call("GET", "/v1/templates/cut-build", nullptr, 200);
  EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_EQ(t["error"]["code"], "interrupted");
  EXPECT_NE(t["error"]["message"].get<std::string>().find("build"), std::string::npos) << t.dump();
  EXPECT_EQ(buildEnvironments(), 0u) << "its environment is destroyed";
  EXPECT_TRUE(templateSnapshots("cut-build").empty());
  call("DELETE", "/v1/templates/cut-build", nullptr, 204);

  // A stop (SIGTERM) during a step: the build ends interrupted at once.
  call("POST", "/v1/templates", {{"name", "stopped-build"}, {"build", {{"base", "host"}, {"run", {"sleep 120"}}}}},
       202);
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polled as the CLI does
    t = call("GET", "/v1/templates/stopped-build", nullptr, 200);
  } while (t["progress"].value("stage", "").find("step 1/1") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline);
  auto stopping = std::chrono::steady_clock::now();
  daemon_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(60)) << "the step held moatd up";
  daemon_->restart();
  t = call("GET", "/v1/templates/stopped-build", nullptr, 200);
  EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_EQ(t["error"]["code"], "interrupted") << t.dump();
  EXPECT_EQ(buildEnvironments(), 0u);
  EXPECT_TRUE(templateSnapshots("stopped-build").empty());
}

}  // namespace
}  // namespace moat::test
