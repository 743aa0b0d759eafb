// Snapshots, forks and restores through moatd's API: files come back as they
// were, processes do not, ownership follows the environment, keys see only
// their own, and a moatd killed mid-way leaves nothing half made.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "moatd_fixture.h"
#include "os/block.h"
#include "store/store.h"

namespace moat::test {
namespace {

class Snapshots : public MoatdFixture {
 protected:
  std::string sh(const std::string& id, const std::string& script, int expectExit = 0) {
    json r = exec(id, {{"cmd", {"sh", "-c", script}}});
    EXPECT_EQ(r["exit_code"], expectExit) << script << ": " << r.dump();
    return r.value("stdout", "");
  }
  json snapshot(const std::string& id, const json& body = json::object()) {
    return call("POST", "/v1/environments/" + id + "/snapshots", body, 201);
  }
  std::vector<std::string> poolSnapshots() {
    std::vector<std::string> names;
    std::string dir = daemon_->stateDir() + "/storage/snapshots";
    if (!std::filesystem::exists(dir)) return names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename());
    return names;
  }
};

TEST_F(Snapshots, RestorePutsTheFilesBackAndEndsTheProcesses) {
  std::string id = createEnv();
  sh(id, "mkdir -p /workspace/app && echo v1 > /workspace/app/state && echo etc1 > /etc/moat-test");
  json snap = snapshot(id, {{"name", "before the change"}});
  std::string sid = snap["id"];
  EXPECT_EQ(sid.rfind("snap-", 0), 0u);
  EXPECT_EQ(snap["environment_id"], id);
  EXPECT_EQ(snap["name"], "before the change");
  // What happens after the snapshot: changed, new and deleted files, and a
  // process that would still be running.
  sh(id, "echo v2 > /workspace/app/state && echo new > /workspace/new && rm /etc/moat-test");
  call("POST", "/v1/environments/" + id + "/processes", {{"cmd", {"sleep", "600"}}}, 201);
  ASSERT_TRUE(waitForProcess(id, "sleep"));

  json restored = call("POST", "/v1/environments/" + id + "/restore", {{"snapshot", sid}}, 200);
  EXPECT_EQ(restored["id"], id);
  EXPECT_EQ(restored["state"], "running");
  EXPECT_EQ(sh(id, "cat /workspace/app/state /etc/moat-test"), "v1\netc1\n");
  sh(id, "test ! -e /workspace/new");
  EXPECT_EQ(exec(id, {{"cmd", {"pgrep", "sleep"}}})["exit_code"], 1) << "processes do not survive a restore";
  // Files still belong to root inside, and the environment works as before.
  EXPECT_EQ(sh(id, "stat -c %u:%g /workspace/app/state"), "0:0\n");
  sh(id, "echo v3 > /workspace/app/state");
  // A snapshot can be restored again and again.
  call("POST", "/v1/environments/" + id + "/restore", {{"snapshot", sid}}, 200);
  EXPECT_EQ(sh(id, "cat /workspace/app/state"), "v1\n");
  std::string events = daemon_->request("GET", "/v1/events?environment=" + id).body;
  EXPECT_NE(events.find("environment.restored"), std::string::npos) << events;
  EXPECT_NE(events.find("snapshot.created"), std::string::npos) << events;
  // The old pid 1's end was not taken for the environment's.
  EXPECT_EQ(events.find("environment.destroyed"), std::string::npos) << events;
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "running");
}

TEST_F(Snapshots, ARestoredEnvironmentKeepsItsNetworkPolicyAndLink) {
  std::string id = createEnv({{"network", {{"mode", "allowlist"}, {"allow", {"example.org"}}}}});
  json before = call("GET", "/v1/environments/" + id + "/network", nullptr, 200);
  ASSERT_TRUE(before.contains("link")) << before.dump();
  std::string sid = snapshot(id)["id"];
  call("POST", "/v1/environments/" + id + "/restore", {{"snapshot", sid}}, 200);
  json after = call("GET", "/v1/environments/" + id + "/network", nullptr, 200);
  EXPECT_EQ(after["network"], before["network"]);
  ASSERT_TRUE(after.contains("link")) << after.dump();
  // The new namespace has its link and the proxy variables point at it.
  std::string proxy = sh(id, "echo $HTTPS_PROXY");
  EXPECT_EQ(proxy, after["link"]["proxy"].get<std::string>() + "\n");
  EXPECT_EQ(sh(id, "tail -n +3 /proc/net/dev | wc -l"), "2\n") << "lo and the egress link";
}

TEST_F(Snapshots, ANetworkChangeDuringARestoreLosesNeitherTheEnvironmentNorTheChange) {
  // A restore drops the old namespace's link and attaches a new one; a PUT
  // .../network between the two found no link and attached its own, and
  // the restore's then failed: the environment was destroyed. Raced a few
  // times, the change a little later each round.
  std::string id = createEnv({{"network", {{"mode", "allowlist"}, {"allow", {"example.org"}}}}});
  std::string sid = snapshot(id)["id"];
  for (int round = 0; round < 10; ++round) {
    const std::string host = "round" + std::to_string(round) + ".example.org";
    // Either request may find moatd gone (it crashed on this before): an
    // exception is an answer of status 0 here, so that the thread is joined.
    auto request = [&](const std::string& method, const std::string& target, const std::string& body) {
      try {
        return daemon_->request(method, target, body);
      } catch (const std::exception& e) {
        return HttpResult{0, e.what()};
      }
    };
    HttpResult restore;
    std::thread restorer(
        [&] { restore = request("POST", "/v1/environments/" + id + "/restore", R"({"snapshot":")" + sid + "\"}"); });
    // Not a wait for anything: it varies where the change falls.
    std::this_thread::sleep_for(std::chrono::microseconds(round * 300));
    auto changed = request("PUT", "/v1/environments/" + id + "/network",
                           json{{"network", {{"mode", "allowlist"}, {"allow", {host}}}}}.dump());
    restorer.join();
    ASSERT_EQ(changed.status, 200) << "round " << round << ": " << changed.body;
    ASSERT_EQ(restore.status, 200) << "round " << round << ": " << restore.body;
    json now = call("GET", "/v1/environments/" + id, nullptr, 200);
    ASSERT_EQ(now["state"], "running") << "round " << round << ": " << now.dump();
    json network = call("GET", "/v1/environments/" + id + "/network", nullptr, 200);
    EXPECT_EQ(network["network"]["allow"], json::array({host})) << "round " << round << ": the change holds";
    ASSERT_TRUE(network.contains("link")) << network.dump();
    EXPECT_EQ(sh(id, "echo $HTTPS_PROXY"), network["link"]["proxy"].get<std::string>() + "\n");
  }
}

TEST_F(Snapshots, AForkHasTheFilesAndSettingsButIsItsOwnEnvironment) {
  std::string id = createEnv(
      {{"env", {{"PROJECT", "moat"}}}, {"labels", {{"team", "a"}}}, {"spec", {{"ram_mb", 256}, {"pids", 200}}}});
  sh(id, "echo original > /workspace/f && cp /bin/true /workspace/suid && chmod 4755 /workspace/suid");
  json fork = call("POST", "/v1/environments/" + id + "/fork", {{"task_id", "branch"}}, 201);
  std::string forked = fork["id"];
  ASSERT_NE(forked, id);
  EXPECT_EQ(fork["task_id"], "branch");
  EXPECT_EQ(fork["labels"]["team"], "a");
  EXPECT_EQ(fork["spec"]["ram_mb"], 256);
  EXPECT_EQ(sh(forked, "cat /workspace/f; echo $PROJECT"), "original\nmoat\n");
  // Owned by root inside the fork (its files were re-owned to its own host
  // range), the set-uid bit kept.
  EXPECT_EQ(sh(forked, "stat -c '%u:%g %a' /workspace/f /workspace/suid"), "0:0 644\n0:0 4755\n");
  EXPECT_NE(sh(forked, "cat /proc/self/uid_map"), sh(id, "cat /proc/self/uid_map"));
  EXPECT_EQ(sh(forked, "cat /etc/hostname"), forked + "\n");
  // The two go their own ways.
  sh(forked, "echo changed > /workspace/f");
  EXPECT_EQ(sh(id, "cat /workspace/f"), "original\n");
  sh(id, "rm /workspace/f");
  EXPECT_EQ(sh(forked, "cat /workspace/f"), "changed\n");
  // The snapshot a fork goes through is not kept.
  EXPECT_TRUE(poolSnapshots().empty());
  EXPECT_EQ(call("GET", "/v1/snapshots", nullptr, 200)["snapshots"].size(), 0u);

  // A new environment from a kept snapshot: POST /v1/environments with it.
  std::string sid = snapshot(forked)["id"];
  json fromSnap = call("POST", "/v1/environments", {{"snapshot", sid}, {"spec", {{"ram_mb", 128}}}}, 201);
  EXPECT_EQ(sh(fromSnap["id"], "cat /workspace/f"), "changed\n");
  EXPECT_EQ(fromSnap["spec"]["ram_mb"], 128);
  // Snapshots outlive their environment.
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + forked).status, 204);
  json again = call("POST", "/v1/environments", {{"snapshot", sid}}, 201);
  EXPECT_EQ(sh(again["id"], "cat /workspace/f"), "changed\n");
  EXPECT_EQ(daemon_->request("DELETE", "/v1/snapshots/" + sid).status, 204);
  EXPECT_TRUE(poolSnapshots().empty());
  EXPECT_EQ(daemon_->request("GET", "/v1/snapshots/" + sid).status, 404);
}

TEST_F(Snapshots, BadSnapshotRequestsGetClearErrors) {
  std::string id = createEnv();
  std::string sid = snapshot(id)["id"];
  struct Case {
    std::string method, target, body;
    int status;
    std::string needle;
  } cases[] = {
      {"POST", "/v1/environments/" + id + "/snapshots", R"({"label":"x"})", 400, "label"},
      {"POST", "/v1/environments/" + id + "/snapshots", R"({"name":7})", 400, "name"},
      {"POST", "/v1/environments/" + id + "/snapshots", "{not json", 400, "JSON"},
      {"POST", "/v1/environments/" + id + "/restore", "{}", 400, "snapshot"},
      {"POST", "/v1/environments/" + id + "/restore", R"({"snapshot":"../../envs/x"})", 400, "snapshot id"},
      {"POST", "/v1/environments/" + id + "/restore", R"({"snapshot":"snap-000000000000"})", 404, "no snapshot"},
      {"POST", "/v1/environments", R"({"snapshot":"snap-../../../etc"})", 400, "snapshot id"},
      {"POST", "/v1/environments", R"({"snapshot":")" + sid + R"(","template":"/"})", 400, "template"},
      {"GET", "/v1/snapshots/..%2f..%2fenvs", "", 404, "not_found"},
      {"GET", "/v1/snapshots/snap-..", "", 404, "no snapshot"},
      {"DELETE", "/v1/snapshots/snap-%2e%2e%2fenvs", "", 404, "not_found"},
      {"PUT", "/v1/snapshots/" + sid, "", 405, "GET or DELETE"},
      {"POST", "/v1/environments/" + id + "/fork", R"({"spec":{}})", 400, "spec"},
      {"POST", "/v1/environments/000000000000/snapshots", "{}", 404, "000000000000"},
  };
  for (const auto& c : cases) {
    auto r = daemon_->request(c.method, c.target, c.body);
    EXPECT_EQ(r.status, c.status) << c.method << " " << c.target << " " << c.body << " -> " << r.body;
    EXPECT_NE(r.body.find(c.needle), std::string::npos) << r.body;
  }
  // A gone environment has nothing to snapshot or restore; its snapshot stays usable.
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204);
  EXPECT_EQ(daemon_->request("POST", "/v1/environments/" + id + "/snapshots", "{}").status, 409);
  EXPECT_EQ(daemon_->request("POST", "/v1/environments/" + id + "/restore", R"({"snapshot":")" + sid + "\"}").status,
            409);
  EXPECT_EQ(daemon_->request("GET", "/healthz", "", false).status, 200);
}

TEST_F(Snapshots, KeysSeeAndUseOnlyTheirOwnSnapshots) {
  json agent = call("POST", "/v1/keys", {{"name", "agent"}, {"scopes", {"create", "read", "exec", "snapshots"}}}, 201);
  json noScope = call("POST", "/v1/keys", {{"name", "plain"}, {"scopes", {"create", "read", "exec"}}}, 201);
  auto as = [&](const json& key, const std::string& method, const std::string& target, const std::string& body = "") {
    return daemon_->request(method, target, body, false,
                            {{"Authorization", "Bearer " + key["token"].get<std::string>()}});
  };
  std::string masters = createEnv();
  sh(masters, "echo master-secret > /workspace/secret");
  std::string masterSnap = snapshot(masters)["id"];

  auto created = as(agent, "POST", "/v1/environments", "{}");
  ASSERT_EQ(created.status, 201);
  std::string mine = json::parse(created.body)["id"];
  // The master's snapshot does not exist for the key: not to read, fork,
  // restore into its own environment or delete.
  EXPECT_EQ(as(agent, "GET", "/v1/snapshots/" + masterSnap).status, 404);
  EXPECT_EQ(as(agent, "POST", "/v1/environments", R"({"snapshot":")" + masterSnap + "\"}").status, 404);
  EXPECT_EQ(as(agent, "POST", "/v1/environments/" + mine + "/restore", R"({"snapshot":")" + masterSnap + "\"}").status,
            404);
  EXPECT_EQ(as(agent, "DELETE", "/v1/snapshots/" + masterSnap).status, 404);
  EXPECT_EQ(as(agent, "POST", "/v1/environments/" + masters + "/snapshots", "{}").status, 404);
  EXPECT_EQ(as(agent, "POST", "/v1/environments/" + masters + "/fork", "{}").status, 404);
  EXPECT_EQ(json::parse(as(agent, "GET", "/v1/snapshots").body)["snapshots"].size(), 0u);
  // Its own work fine; a key without the scope cannot.
  auto own = as(agent, "POST", "/v1/environments/" + mine + "/snapshots", "{}");
  ASSERT_EQ(own.status, 201) << own.body;
  EXPECT_EQ(json::parse(as(agent, "GET", "/v1/snapshots").body)["snapshots"].size(), 1u);
  auto plainEnv = as(noScope, "POST", "/v1/environments", "{}");
  ASSERT_EQ(plainEnv.status, 201);
  std::string plainId = json::parse(plainEnv.body)["id"];
  EXPECT_EQ(as(noScope, "POST", "/v1/environments/" + plainId + "/snapshots", "{}").status, 403);
  EXPECT_EQ(as(noScope, "GET", "/v1/snapshots").status, 403);
  // The master's secret never showed up anywhere the key could read.
  EXPECT_EQ(json::parse(as(agent, "POST", "/v1/environments/" + mine + "/exec",
                           R"({"cmd":["sh","-c","cat /workspace/secret || true"]})")
                            .body)["stdout"],
            "");
}

TEST_F(Snapshots, RestoreIsAWriteTheGateDecides) {
  std::string id = createEnv({{"permissions", {{"write_file", "deny"}}}});
  std::string sid = snapshot(id)["id"];
  auto r = daemon_->request("POST", "/v1/environments/" + id + "/restore", R"({"snapshot":")" + sid + "\"}");
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("write_file"), std::string::npos) << r.body;
}

TEST_F(Snapshots, ADeletionDuringARestoreFromItLosesNeitherTheEnvironmentNorTheRestore) {
  // A restore reads the snapshot, ends the environment's processes and old
  // files, then copies the snapshot: a deletion in between left nothing to
  // copy, and the environment failed with its files gone. Raced a number of
  // times, the deletion a little later each round: each restore is whole (200, the snapshot's files) or never began
  // (404, the snapshot was gone first), and the environment keeps running.
  std::string id = createEnv();
  int restored = 0, refused = 0;
  for (int round = 0; round < 15; ++round) {
    sh(id, "echo " + std::to_string(round) + " > /workspace/round");
    std::string sid = snapshot(id)["id"];
    sh(id, "echo after > /workspace/round");
    HttpResult restore;
    std::thread restorer([&] {
      restore = daemon_->request("POST", "/v1/environments/" + id + "/restore", R"({"snapshot":")" + sid + "\"}");
    });
    // Not a wait for anything: the deletion starts a little later each round,
    // so that some rounds find the restore before its copy and some after.
    std::this_thread::sleep_for(std::chrono::microseconds(round * 250));
    auto deleted = daemon_->request("DELETE", "/v1/snapshots/" + sid);
    restorer.join();
    EXPECT_EQ(deleted.status, 204) << deleted.body;
    ASSERT_TRUE(restore.status == 200 || restore.status == 404)
        << "round " << round << ": " << restore.status << " " << restore.body;
    ASSERT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "running") << "round " << round;
    std::string expect = restore.status == 200 ? std::to_string(round) + "\n" : "after\n";
    EXPECT_EQ(sh(id, "cat /workspace/round"), expect) << "round " << round;
    (restore.status == 200 ? restored : refused)++;
  }
  EXPECT_EQ(poolSnapshots(), std::vector<std::string>{});
  std::printf("restored %d, snapshot gone first %d\n", restored, refused);
  EXPECT_GT(restored, 0) << "no round had the restore first: the race this test is about never happened";
}

TEST_F(Snapshots, AKilledMoatdLeavesNoHalfMadeSnapshot) {
  std::string id = createEnv();
  sh(id, "echo kept > /workspace/f");
  std::string sid = snapshot(id)["id"];
  // What a moatd killed halfway leaves: a record still "creating" with its
  // volume; a volume nobody recorded; a fork's "transient" snapshot (killed
  // before the fork removed it); a deletion killed after the volume went
  // and one killed before it did.
  daemon_->kill9();
  std::string storage = daemon_->stateDir() + "/storage";
  for (const char* name : {"snap-00000000000a", "snap-00000000000b", "snap-00000000000c", "snap-00000000000e"}) {
    ASSERT_TRUE(os::snapshotSubvolume(storage + "/envs/" + id, storage + "/snapshots", name, true).ok());
  }
  {
    auto store = store::openSqliteStore(daemon_->stateDir() + "/moat.db");
    ASSERT_TRUE(store.ok()) << store.error().message();
    for (auto [name, state] : {std::pair{"snap-00000000000a", store::SnapshotState::kCreating},
                               {"snap-00000000000c", store::SnapshotState::kTransient},
                               {"snap-00000000000d", store::SnapshotState::kDeleting},
                               {"snap-00000000000e", store::SnapshotState::kDeleting}}) {
      store::SnapshotRecord half;
      half.id = name;
      half.environment = id;
      half.owner = "master";
      half.templateName = "host";
      half.storageGb = 4;
      half.state = state;
      half.createdAtMs = 1;
      ASSERT_TRUE((*store)->insertSnapshot(half).ok());
    }
  }
  daemon_->restart();
  EXPECT_EQ(poolSnapshots(), std::vector<std::string>{sid});
  auto listed = nlohmann::json::parse(daemon_->request("GET", "/v1/snapshots").body)["snapshots"];
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0]["id"], sid);
  for (const char* gone : {"snap-00000000000a", "snap-00000000000c", "snap-00000000000d"}) {
    EXPECT_EQ(daemon_->request("GET", std::string("/v1/snapshots/") + gone).status, 404) << gone;
  }
  std::string events = daemon_->request("GET", "/v1/events?environment=" + id).body;
  EXPECT_NE(events.find("snapshot.failed"), std::string::npos) << events;
  EXPECT_NE(events.find("moatd stopped while deleting it"), std::string::npos) << events;
  // The finished one is there and works.
  call("POST", "/v1/environments/" + id + "/restore", {{"snapshot", sid}}, 200);
  EXPECT_EQ(sh(id, "cat /workspace/f"), "kept\n");
}

// The changes a person reviews: against the template, against a snapshot,
// never through what the environment planted.
TEST_F(Snapshots, ChangesShowWhatTheEnvironmentChangedSinceItsTemplateOrASnapshot) {
  std::string id = createEnv();
  json none = call("GET", "/v1/environments/" + id + "/changes", nullptr, 200);
  EXPECT_EQ(none["changes"], json::array())
      << "moat's own /etc/hosts and /etc/hostname are not the environment's doing";
  EXPECT_EQ(none["against"], "template");
  sh(id, "echo one > /workspace/notes.txt; echo extra >> /etc/profile");
  json snap = snapshot(id);
  sh(id,
     "echo two >> /workspace/notes.txt; ln -s /etc/shadow /workspace/evil; ln /workspace/notes.txt /workspace/hard;"
     "mkdir /workspace/d; head -c 100 /dev/urandom > /workspace/d/blob");
  json all = call("GET", "/v1/environments/" + id + "/changes?against=template", nullptr, 200);
  // A review reads every changed file: it is recorded as a read.
  const std::string log = eventsUntil("?type=file.read&environment=" + id, "\"changes\"");
  EXPECT_NE(log.find("\"op\":\"changes\""), std::string::npos) << log;
  std::map<std::string, json> byPath;
  for (const auto& c : all["changes"]) byPath[c["path"]] = c;
  EXPECT_EQ(byPath["/etc/profile"]["change"], "modified");
  EXPECT_NE(byPath["/etc/profile"]["diff"].get<std::string>().find("+extra\n"), std::string::npos);
  EXPECT_EQ(byPath["/workspace/notes.txt"]["diff"], "@@ -0,0 +1,2 @@\n+one\n+two\n");
  EXPECT_EQ(byPath["/workspace/evil"]["type"], "symlink");
  EXPECT_EQ(byPath["/workspace/evil"]["target"], "/etc/shadow");
  EXPECT_FALSE(byPath["/workspace/evil"].contains("diff")) << "the host's /etc/shadow is never read";
  EXPECT_EQ(byPath["/workspace/hard"]["diff"], "@@ -0,0 +1,2 @@\n+one\n+two\n") << "a hard link is its own file";
  EXPECT_EQ(byPath["/workspace/d"]["type"], "directory");
  EXPECT_EQ(byPath["/workspace/d/blob"]["size"], 100);
  EXPECT_EQ(all.dump().find("root:"), std::string::npos) << "nothing of the host's files";
  // Since the snapshot: only the second command's doing.
  json since =
      call("GET", "/v1/environments/" + id + "/changes?against=" + snap["id"].get<std::string>(), nullptr, 200);
  byPath.clear();
  for (const auto& c : since["changes"]) byPath[c["path"]] = c;
  EXPECT_EQ(byPath.count("/etc/profile"), 0u) << since.dump();
  EXPECT_EQ(byPath["/workspace/notes.txt"]["diff"], "@@ -1 +1,2 @@\n one\n+two\n");
  EXPECT_EQ(byPath["/workspace/notes.txt"]["size_before"], 4);
  EXPECT_EQ(byPath.size(), 5u) << since.dump();  // notes.txt, evil, hard, d, d/blob
  // diff=0: paths and sizes only.
  json bare = call("GET", "/v1/environments/" + id + "/changes?diff=0", nullptr, 200);
  EXPECT_EQ(bare.dump().find("\"diff\""), std::string::npos);
  // Bad requests name what is wrong.
  EXPECT_EQ(call("GET", "/v1/environments/" + id + "/changes?against=../../etc", nullptr, 400)["error"]["field"],
            "against");
  EXPECT_EQ(
      call("GET", "/v1/environments/" + id + "/changes?against=snap-000000000000", nullptr, 404)["error"]["field"],
      "against");
  EXPECT_EQ(call("GET", "/v1/environments/" + id + "/changes?diff=2", nullptr, 400)["error"]["field"], "diff");
  EXPECT_EQ(call("POST", "/v1/environments/" + id + "/changes", nullptr, 405)["error"]["code"], "method_not_allowed");
}

TEST_F(Snapshots, ChangesAreReadsOfTheWholeTreeForTheGateAndAKeysOwn) {
  std::string id = createEnv({{"permissions", {{"read_file", {{{"path", "/etc/**"}, {"action", "deny"}}}}}}});
  json r = call("GET", "/v1/environments/" + id + "/changes", nullptr, 403);
  EXPECT_EQ(r["error"]["code"], "denied_by_policy");
  json key = call("POST", "/v1/keys", {{"name", "reviewer"}, {"scopes", {"read", "files"}}}, 201);
  std::string master = createEnv();
  auto theirs = daemon_->request("GET", "/v1/environments/" + master + "/changes", "", false,
                                 {{"Authorization", "Bearer " + key["token"].get<std::string>()}});
  EXPECT_EQ(theirs.status, 404) << theirs.body;
  json noFiles = call("POST", "/v1/keys", {{"name", "reader"}, {"scopes", {"read"}}}, 201);
  auto scoped = daemon_->request("GET", "/v1/environments/" + master + "/changes", "", false,
                                 {{"Authorization", "Bearer " + noFiles["token"].get<std::string>()}});
  EXPECT_EQ(scoped.status, 403) << scoped.body;
}

}  // namespace
}  // namespace moat::test
