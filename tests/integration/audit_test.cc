// The audit log through a real moatd: what is recorded and by whom, who may
// read it, the live stream and its resumption, verify after tampering.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "api/keys.h"
#include "moat_process.h"
#include "moatd_fixture.h"
#include "moatd_process.h"
#include "os/file.h"

namespace moat::test {
namespace {

using json = nlohmann::json;

// The events of an SSE body ("id: N\nevent: T\ndata: {...}\n\n").
std::vector<json> parseSse(const std::string& body) {
  std::vector<json> events;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find('\n', at);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(at, end - at);
    if (line.rfind("data: ", 0) == 0) events.push_back(json::parse(line.substr(6)));
    at = end + 1;
  }
  return events;
}

// The next event of a followed stream (heartbeat comments skipped); false
// when the stream ends or nothing comes within timeoutMs.
bool nextEvent(EventStream& s, json& event, int timeoutMs = 20000) {
  std::string line;
  json pending;
  std::string id, type;
  while (s.nextLine(line, timeoutMs)) {
    if (line.rfind("id: ", 0) == 0) id = line.substr(4);
    if (line.rfind("event: ", 0) == 0) type = line.substr(7);
    if (line.rfind("data: ", 0) == 0) pending = json::parse(line.substr(6));
    if (line.empty() && !pending.is_null()) {
      // The frame's own fields agree with the event they carry.
      EXPECT_EQ(id, std::to_string(pending["id"].get<uint64_t>()));
      EXPECT_EQ(type, pending["type"]);
      event = pending;
      return true;
    }
  }
  return false;
}

std::vector<std::string> typesOf(const std::vector<json>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e["type"]);
  return out;
}

class Audit : public MoatdFixture {
 protected:
  HttpResult as(const std::string& token, const std::string& method, const std::string& target,
                const std::string& body = "") {
    return daemon_->request(method, target, body, false, {{"Authorization", "Bearer " + token}});
  }

  // {"id", "token"} of a new key.
  json createKey(const std::vector<std::string>& scopes) { return call("POST", "/v1/keys", {{"scopes", scopes}}, 201); }

  std::vector<json> events(const std::string& query = "", const std::string& token = "") {
    auto r = token.empty() ? daemon_->request("GET", "/v1/events" + query) : as(token, "GET", "/v1/events" + query);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.contentType, "text/event-stream");
    return parseSse(r.body);
  }

  ProcessResult moatCli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {binDir() + "/moat"};
    argv.insert(argv.end(), args.begin(), args.end());
    return runProcess(argv, "", {{"MOAT_STATE", daemon_->stateDir()}});
  }

  // Changes moat.db behind moatd's back, as someone with write access to
  // the state directory could.
  void tamper(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open_v2((daemon_->stateDir() + "/moat.db").c_str(), &db, SQLITE_OPEN_READWRITE, nullptr),
              SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    for (const std::string& statement : {std::string("DROP TRIGGER IF EXISTS events_append_only"), sql}) {
      EXPECT_EQ(sqlite3_exec(db, statement.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
          << statement << ": " << sqlite3_errmsg(db);
    }
    EXPECT_EQ(sqlite3_changes(db), 1);
    sqlite3_close_v2(db);
  }
};

TEST_F(Audit, AKeysActionsAreRecordedWithTheKeyAsActor) {
  json key = createKey({"create", "exec", "files", "destroy"});
  const std::string token = key["token"], keyId = key["id"];
  auto created = as(token, "POST", "/v1/environments", R"({"spec":{"ram_mb":256}})");
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string id = json::parse(created.body)["id"];
  EXPECT_EQ(as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["sh","-c","exit 3"]})").status, 200);
  EXPECT_EQ(as(token, "PUT", "/v1/environments/" + id + "/files?path=/workspace/a.txt", "audit me").status, 200);
  EXPECT_EQ(as(token, "GET", "/v1/environments/" + id + "/files?path=/workspace/a.txt").status, 200);
  EXPECT_EQ(as(token, "DELETE", "/v1/environments/" + id).status, 204);

  // Without follow the answer holds what happened before the request.
  auto mine = events("?environment=" + id);
  EXPECT_EQ(typesOf(mine), (std::vector<std::string>{"environment.created", "exec.started", "exec.ended",
                                                     "file.written", "file.read", "environment.destroyed"}));
  for (const auto& e : mine) {
    EXPECT_EQ(e["actor"], keyId) << e.dump();
    EXPECT_EQ(e["environment"], id);
  }
  ASSERT_EQ(mine.size(), 6u);
  EXPECT_EQ(mine[0]["data"]["spec"]["ram_mb"], 256);
  EXPECT_EQ(mine[2]["data"]["argv"], json({"sh", "-c", "exit 3"}));
  EXPECT_EQ(mine[2]["data"]["exit_code"], 3);
  EXPECT_EQ(mine[2]["data"]["state"], "exited");
  EXPECT_TRUE(mine[2]["data"].contains("duration_ms"));
  EXPECT_EQ(mine[3]["data"]["path"], "/workspace/a.txt");
  EXPECT_EQ(mine[3]["data"]["size"], 8);
  EXPECT_EQ(mine[3]["data"]["sha256"], api::sha256Hex("audit me"));
  EXPECT_EQ(mine[4]["data"]["size"], 8);
  EXPECT_EQ(mine[5]["data"]["reason"], "destroyed");
  EXPECT_EQ(mine[5]["data"]["state"], "gone");

  auto keys = events("?type=key.");
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys[0]["type"], "key.created");
  EXPECT_EQ(keys[0]["actor"], "master");
  EXPECT_EQ(keys[0]["data"]["key"], keyId);
  EXPECT_EQ(keys[0]["data"].dump().find(token), std::string::npos) << "never the token";
}

TEST_F(Audit, AKeyReadsOnlyTheEventsOfItsOwnEnvironments) {
  json a = createKey({"create", "exec", "audit"});
  json b = createKey({"create", "audit"});
  auto envA = as(a["token"], "POST", "/v1/environments", R"({"spec":{"ram_mb":256}})");
  auto envB = as(b["token"], "POST", "/v1/environments", R"({"spec":{"ram_mb":256}})");
  ASSERT_EQ(envA.status, 201);
  ASSERT_EQ(envB.status, 201);
  const std::string idA = json::parse(envA.body)["id"], idB = json::parse(envB.body)["id"];
  EXPECT_EQ(as(a["token"], "POST", "/v1/environments/" + idA + "/exec", R"({"cmd":["true"]})").status, 200);
  std::string idM = createEnv({{"spec", {{"ram_mb", 256}}}});
  exec(idM, {{"cmd", {"true"}}});
  // The master token sees all of it, a's work included.
  EXPECT_GE(events("?environment=" + idA).size(), 3u);
  EXPECT_GE(events("?environment=" + idM).size(), 3u);

  auto seenByA = events("", a["token"]);
  EXPECT_EQ(typesOf(seenByA), (std::vector<std::string>{"environment.created", "exec.started", "exec.ended"}));
  for (const auto& e : seenByA) EXPECT_EQ(e["environment"], idA) << e.dump();
  auto seenByB = events("", b["token"]);
  ASSERT_EQ(seenByB.size(), 1u);
  EXPECT_EQ(seenByB[0]["environment"], idB);
  EXPECT_TRUE(events("?environment=" + idM, a["token"]).empty());
  EXPECT_TRUE(events("?type=key.", a["token"]).empty());

  json reader = createKey({"read"});
  auto refused = as(reader["token"], "GET", "/v1/events");
  EXPECT_EQ(refused.status, 403);
  EXPECT_NE(refused.body.find("'audit'"), std::string::npos) << refused.body;
  EXPECT_EQ(as(a["token"], "GET", "/v1/audit/verify").status, 403);
  // The refusal is itself recorded, with the refused key as actor.
  auto denied = events("?type=auth.denied");
  ASSERT_FALSE(denied.empty());
  EXPECT_EQ(denied.back()["actor"], a["id"]);
}

TEST_F(Audit, TheStreamResumesAfterADisconnectWithoutGapsOrDuplicates) {
  std::string id = createEnv({{"spec", {{"ram_mb", 256}}}});
  std::vector<uint64_t> ids;
  {
    auto s = daemon_->stream("/v1/events?follow=1");
    ASSERT_EQ(s.status(), 200);
    for (int i = 0; i < 3; ++i) exec(id, {{"cmd", {"echo", std::to_string(i)}}});
    int ended = 0;
    json e;
    while (ended < 3 && nextEvent(s, e)) {
      ids.push_back(e["id"]);
      if (e["type"] == "exec.ended") ++ended;
    }
    ASSERT_EQ(ended, 3);
    s.close();  // the client goes away
  }
  // Meanwhile, more happens.
  for (int i = 0; i < 3; ++i) exec(id, {{"cmd", {"echo", "offline " + std::to_string(i)}}});
  call("PUT", "/v1/environments/" + id + "/files?path=/workspace/last", nullptr, 200);
  // Reconnect the way EventSource does: the same URL (since=0) and the last
  // id seen in Last-Event-ID, which wins.
  auto s = daemon_->stream("/v1/events?follow=1&since=0", {{"Last-Event-ID", std::to_string(ids.back())}});
  ASSERT_EQ(s.status(), 200);
  json e;
  bool first = true;
  while (nextEvent(s, e)) {
    if (first) {
      EXPECT_EQ(e["id"].get<uint64_t>(), ids.back() + 1) << "resumes right after the last id seen";
    }
    first = false;
    ids.push_back(e["id"]);
    if (e["type"] == "file.written") break;
  }
  ASSERT_EQ(e["type"], "file.written");
  // Every id from the first once, in order: nothing lost, nothing twice.
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], i + 1) << "at " << i;
  EXPECT_GE(ids.size(), 1u + 6 + 6 + 1);
}

TEST_F(Audit, AFilteredStreamWaitsForWhatMatches) {
  std::string id = createEnv({{"spec", {{"ram_mb", 256}}}});
  auto s = daemon_->stream("/v1/events?follow=1&type=process.&environment=" + id);
  ASSERT_EQ(s.status(), 200);
  exec(id, {{"cmd", {"true"}}});  // not a match
  json p = call("POST", "/v1/environments/" + id + "/processes", {{"cmd", {"sh", "-c", "exit 4"}}}, 201);
  json started, ended;
  ASSERT_TRUE(nextEvent(s, started));
  ASSERT_TRUE(nextEvent(s, ended));
  EXPECT_EQ(started["type"], "process.started");
  EXPECT_EQ(started["data"]["process"], p["id"]);
  EXPECT_EQ(started["data"]["argv"], json({"sh", "-c", "exit 4"}));
  EXPECT_EQ(ended["type"], "process.ended");
  EXPECT_EQ(ended["actor"], "master");
  EXPECT_EQ(ended["data"]["exit_code"], 4);
  EXPECT_EQ(ended["data"]["kind"], "process");
  EXPECT_GT(ended["id"].get<uint64_t>(), started["id"].get<uint64_t>());
}

TEST_F(Audit, AnEditedRowMakesVerifyFailAndNameIt) {
  std::string id = createEnv({{"spec", {{"ram_mb", 256}}}});
  exec(id, {{"cmd", {"rm", "-rf", "/workspace/evidence"}}});
  auto ok = moatCli({"audit", "verify"});
  EXPECT_EQ(ok.exitCode, 0) << ok.out << ok.err;
  EXPECT_EQ(ok.out.rfind("ok: ", 0), 0u) << ok.out;
  auto started = events("?type=exec.started&environment=" + id);
  ASSERT_EQ(started.size(), 1u);
  const std::string k = std::to_string(started[0]["id"].get<uint64_t>());
  tamper(
      "UPDATE events SET data = '{\"argv\":[\"true\"],\"cwd\":\"/workspace\",\"process\":1}' WHERE "
      "id = " +
      k);
  auto broken = moatCli({"audit", "verify"});
  EXPECT_EQ(broken.exitCode, 1) << broken.out << broken.err;
  EXPECT_NE(broken.out.find("broken at event " + k + ": edited"), std::string::npos) << broken.out;
  json r = call("GET", "/v1/audit/verify", nullptr, 200);
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(std::to_string(r["first_broken"]["id"].get<uint64_t>()), k);
}

TEST_F(Audit, ADeletedRowMakesVerifyFailAndNameIt) {
  std::string id = createEnv({{"spec", {{"ram_mb", 256}}}});
  exec(id, {{"cmd", {"true"}}});
  auto ended = events("?type=exec.ended&environment=" + id);
  ASSERT_EQ(ended.size(), 1u);
  const std::string k = std::to_string(ended[0]["id"].get<uint64_t>());
  call("DELETE", "/v1/environments/" + id, nullptr, 204);  // so the deleted row is not the last
  tamper("DELETE FROM events WHERE id = " + k);
  auto broken = moatCli({"audit", "verify"});
  EXPECT_EQ(broken.exitCode, 1) << broken.out << broken.err;
  EXPECT_NE(broken.out.find("broken at event " + k + ": deleted"), std::string::npos) << broken.out;
}

TEST_F(Audit, AuthFailuresAreRecordedWithoutTheToken) {
  const std::string secret(64, 'e');
  auto wrong =
      daemon_->request("GET", "/v1/environments", "", false, {{"Authorization", "Bearer moat_0123456789ab_" + secret}});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/abc", "", false).status, 401);
  auto failed = events("?type=auth.failed");
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_EQ(failed[0]["actor"], "anonymous");
  EXPECT_EQ(failed[0]["data"]["reason"], "invalid token");
  EXPECT_EQ(failed[0]["data"]["key"], "0123456789ab");
  EXPECT_EQ(failed[0]["data"]["path"], "/v1/environments");
  EXPECT_EQ(failed[0]["data"]["remote"],
            "unix pid=" + std::to_string(::getpid()) + " uid=" + std::to_string(::getuid()));
  EXPECT_EQ(failed[0].dump().find(secret), std::string::npos) << "never the token";
  EXPECT_EQ(failed[1]["data"]["method"], "DELETE");
  EXPECT_NE(failed[1]["data"]["reason"].get<std::string>().find("missing"), std::string::npos);
}

TEST_F(Audit, ExpiryIsRecordedAsMoatdsAction) {
  std::string id = createEnv({{"ttl_s", 1}, {"spec", {{"ram_mb", 256}}}});
  auto s = daemon_->stream("/v1/events?follow=1&type=environment.destroyed&environment=" + id);
  json e;
  ASSERT_TRUE(nextEvent(s, e));
  EXPECT_EQ(e["actor"], "moatd");
  EXPECT_EQ(e["data"]["reason"], "expired");
}

TEST_F(Audit, AnExportVerifiesWithoutMoatd) {
  if (!os::exists("/usr/bin/python3")) GTEST_SKIP() << "needs /usr/bin/python3 for scripts/audit-verify.py";
  std::string id = createEnv({{"spec", {{"ram_mb", 256}}}});
  exec(id, {{"cmd", {"echo", "caf\xc3\xa9 \"quoted\"\n\ttab"}}});
  call("PUT", "/v1/environments/" + id + "/files?path=/workspace/" + std::string("%C3%BC%20x"), nullptr, 200);
  auto exported = moatCli({"audit", "export", "--format", "jsonl"});
  ASSERT_EQ(exported.exitCode, 0) << exported.err;
  const std::string script = std::string(MOAT_SOURCE_DIR) + "/scripts/audit-verify.py";
  auto checked = runProcess({"/usr/bin/python3", script}, exported.out);
  EXPECT_EQ(checked.exitCode, 0) << checked.out << checked.err;
  EXPECT_EQ(checked.out.rfind("ok: ", 0), 0u) << checked.out;
  json r = call("GET", "/v1/audit/verify", nullptr, 200);
  EXPECT_NE(checked.out.find(r["last"]["hash"].get<std::string>()), std::string::npos)
      << "moatd and the script end at the same hash";

  std::string forged = exported.out;
  auto at = forged.find("caf\xc3\xa9");
  ASSERT_NE(at, std::string::npos);
  forged.replace(at, 3, "tea");
  auto refused = runProcess({"/usr/bin/python3", script}, forged);
  EXPECT_EQ(refused.exitCode, 1) << refused.out;
  EXPECT_NE(refused.out.find("edited"), std::string::npos) << refused.out;
}

TEST_F(Audit, MoatEventsPrintsOneLinePerEvent) {
  std::string id = createEnv({{"spec", {{"ram_mb", 256}}}});
  exec(id, {{"cmd", {"sh", "-c", "exit 2"}}});
  auto r = moatCli({"events", "--env", id, "--type", "exec."});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  std::vector<std::string> lines;
  for (size_t at = 0, end; (end = r.out.find('\n', at)) != std::string::npos; at = end + 1) {
    lines.push_back(r.out.substr(at, end - at));
  }
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_NE(lines[0].find("exec.started"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(id), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("master"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("exit 2"), std::string::npos) << lines[1];
  auto asJson = moatCli({"events", "--env", id, "--json", "--since", "1"});
  ASSERT_EQ(asJson.exitCode, 0);
  for (size_t at = 0, end; (end = asJson.out.find('\n', at)) != std::string::npos; at = end + 1) {
    json e = json::parse(asJson.out.substr(at, end - at));
    EXPECT_GT(e["id"].get<uint64_t>(), 1u);
    EXPECT_EQ(e["hash"].get<std::string>().size(), 64u);
  }
  EXPECT_EQ(moatCli({"events", "--bogus"}).exitCode, 2);
}

// Unauthenticated requests are recorded one event each: a flood of them
// must not grow the log (and the disk) without bound. Past
// --audit-max-events the oldest go, and the chain still verifies.
TEST(AuditSize, AFloodOfEventsKeepsTheLogWithinItsCap) {
  if (!isRoot()) GTEST_SKIP() << "needs root: moatd";
  Moatd daemon({"--audit-max-events", "1000"});
  const int requests = 1200;
  std::unique_ptr<HttpConnection> connection;
  for (int i = 0; i < requests; ++i) {
    if (!connection) connection = std::make_unique<HttpConnection>(daemon.socketPath());
    auto r = connection->request("GET", "/v1/environments", "moat_0123456789ab_" + std::string(64, 'f'));
    ASSERT_EQ(r.status, 401) << r.body;
    if (!r.keepAlive) connection.reset();
  }
  // The writer prunes after the batch that passed the cap.
  auto s = daemon.stream("/v1/events?type=audit.checkpoint&follow=1");
  json checkpoint;
  ASSERT_TRUE(nextEvent(s, checkpoint)) << "nothing was pruned after " << requests << " events";
  EXPECT_EQ(checkpoint["data"]["max_events"], 1000);
  // Within the cap once the writer has caught up: it prunes right after
  // the batch that passed it, so the last batch may still be over.
  json v;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);;) {
    auto verified = daemon.request("GET", "/v1/audit/verify");
    ASSERT_EQ(verified.status, 200);
    v = json::parse(verified.body);
    if (v["checked"].get<uint64_t>() <= 1000u || std::chrono::steady_clock::now() > deadline) break;
  }
  EXPECT_EQ(v["ok"], true) << v.dump();
  EXPECT_LE(v["checked"].get<uint64_t>(), 1000u) << v.dump();
  EXPECT_GE(v["last"]["id"].get<uint64_t>(), static_cast<uint64_t>(requests)) << "none lost from the end";
  // moatd serves on, and records on.
  EXPECT_EQ(daemon.request("GET", "/v1/environments").status, 200);
}

TEST(AuditFlags, ABadMaxEventsIsRefusedAtStart) {
  if (!isRoot()) GTEST_SKIP() << "needs root: moatd";
  for (const char* bad : {"12", "lots", "-1", "5000000000"}) {
    try {
      Moatd daemon({"--audit-max-events", bad});
      ADD_FAILURE() << "moatd started with --audit-max-events " << bad;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("--audit-max-events needs"), std::string::npos) << e.what();
    }
  }
}

TEST(AuditFlags, ABadRetentionIsRefusedAtStart) {
  if (!isRoot()) GTEST_SKIP() << "needs root: moatd";
  try {
    Moatd daemon({"--audit-retention-days", "forever"});
    ADD_FAILURE() << "moatd started";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--audit-retention-days"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moat::test
