// Pauses through moatd (docs/PAUSE.md): a paused environment's processes
// stop where they are and go on after the resume, file reads still answer
// while commands and file changes are refused by name, the pause holds
// across a moatd restart, its time to live stops (or runs, when asked),
// and a paused environment's destroy leaves nothing behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <thread>

#include "isolation/cgroup/cgroup.h"
#include "moatd_fixture.h"
#include "os/file.h"

namespace moat::test {
namespace {

using Clock = std::chrono::steady_clock;

// Counts in /workspace/n; each step forks (/bin/echo), so a pause must
// also catch processes that are being born.
const char kCounter[] =
    "i=0; while :; do i=$((i+1)); /bin/echo $i > /workspace/n.tmp; mv /workspace/n.tmp "
    "/workspace/n; done";

class Pause : public MoatdFixture {
 protected:
  HttpResult as(const std::string& token, const std::string& method, const std::string& target,
                const std::string& body = "") {
    return daemon_->request(method, target, body, false, {{"Authorization", "Bearer " + token}});
  }

  std::string counting(const json& body = json::object()) {
    std::string id = createEnv(body);
    call("POST", "/v1/environments/" + id + "/processes", {{"cmd", {"sh", "-c", kCounter}}}, 201);
    EXPECT_TRUE(counts(id, 0)) << "the counter never counted";
    return id;
  }

  // No cgroup of environment `id` under any of the layout's parents (the
  // freezer's included).
  static void noCgroupLeft(const isolation::cgroup::Layout& layout, const std::string& id) {
    std::vector<std::string> parents;
    if (layout.version == isolation::cgroup::Version::kV2) parents.push_back(layout.v2Parent);
    for (const auto& [controller, parent] : layout.v1Parents) parents.push_back(parent);
    for (const auto& parent : parents) {
      EXPECT_FALSE(os::exists(parent + "/moat-" + id)) << parent << ": its cgroup stayed";
    }
  }

  static int64_t ms(const json& timestampField) {
    // "2026-12-06T15:04:05.123Z" -> milliseconds of the day (enough to compare within a test)
    const std::string t = timestampField.get<std::string>();
    int h = 0, m = 0, s = 0, milli = 0;
    std::sscanf(t.c_str() + 11, "%d:%d:%d.%d", &h, &m, &s, &milli);
    return ((h * 60 + m) * 60 + s) * 1000LL + milli;
  }
};

TEST_F(Pause, ProcessesStopWhereTheyAreAndGoOnAfterTheResume) {
  const std::string id = counting();
  const std::string base = "/v1/environments/" + id;
  json paused = call("POST", base + "/pause", nullptr, 200);
  EXPECT_EQ(paused["state"], "paused") << paused.dump();
  EXPECT_TRUE(paused.contains("paused_at")) << paused.dump();
  EXPECT_EQ(paused["ttl_while_paused"], "stops");
  EXPECT_EQ(call("GET", base, nullptr, 200)["state"], "paused");
  staysStill(id);

  // Reads answer (moat-init is not paused); what runs or changes waits.
  EXPECT_EQ(daemon_->request("GET", base + "/files/list?path=/workspace").status, 200);
  EXPECT_EQ(daemon_->request("GET", base + "/files/stat?path=/workspace/n").status, 200);
  for (const auto& [method, target, body] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"POST", base + "/exec", R"({"cmd":["true"]})"},
           {"POST", base + "/processes", R"({"cmd":["true"]})"},
           {"PUT", base + "/files?path=/workspace/x", "x"},
           {"POST", base + "/files/mkdir", R"({"path":"/workspace/d"})"},
           {"DELETE", base + "/files?path=/workspace/n", ""},
       }) {
    auto refused = daemon_->request(method, target, body);
    EXPECT_EQ(refused.status, 409) << method << " " << target << ": " << refused.body;
    EXPECT_NE(refused.body.find("is paused: resume it"), std::string::npos) << refused.body;
  }
  auto shell = daemon_->websocket(base + "/shell");
  EXPECT_EQ(shell.status, 409) << shell.rest;
  auto port = daemon_->request("GET", base + "/ports/8000/");
  EXPECT_EQ(port.status, 503) << port.body;
  EXPECT_NE(port.body.find("paused"), std::string::npos) << port.body;
  EXPECT_GT(counter(id), 0) << "the refused DELETE removed the file";
  // A second pause is no error; the body takes no field but `memory`.
  EXPECT_EQ(call("POST", base + "/pause", json::object(), 200)["state"], "paused");
  auto unknown = daemon_->request("POST", base + "/pause", R"({"memroy":"disk"})");
  EXPECT_EQ(unknown.status, 400) << unknown.body;
  EXPECT_NE(unknown.body.find("memroy"), std::string::npos) << unknown.body;

  const long stopped = counter(id);
  json resumed = call("POST", base + "/resume", nullptr, 200);
  EXPECT_EQ(resumed["state"], "running") << resumed.dump();
  EXPECT_FALSE(resumed.contains("paused_at")) << resumed.dump();
  EXPECT_TRUE(counts(id, stopped)) << "the counter did not go on";
  EXPECT_EQ(call("POST", base + "/resume", nullptr, 200)["state"], "running") << "a second resume is no error";
  EXPECT_EQ(exec(id, {{"cmd", {"echo", "again"}}})["stdout"], "again\n");

  const std::string log = eventsUntil("?type=environment.&environment=" + id, "environment.resumed");
  EXPECT_NE(log.find("environment.paused"), std::string::npos) << log;
  EXPECT_NE(log.find("\"paused_ms\""), std::string::npos) << log;
}

TEST_F(Pause, APausedEnvironmentStaysPausedAcrossAMoatdRestart) {
  const std::string id = counting();
  call("POST", "/v1/environments/" + id + "/pause", nullptr, 200);
  daemon_->kill9();  // a crash (an upgrade's SIGUSR1 keeps them the same way)
  daemon_->restart();
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "paused");
  staysStill(id);
  EXPECT_EQ(daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["true"]})").status, 409);
  const long stopped = counter(id);
  call("POST", "/v1/environments/" + id + "/resume", nullptr, 200);
  EXPECT_TRUE(counts(id, stopped));
}

// A checkpoint to disk is a microVM's (docs/PAUSE.md, "To disk"): a
// namespace environment's is refused by name before anything stops, and
// the pause's body is checked field by field.
TEST_F(Pause, ACheckpointToDiskOfANamespaceEnvironmentIsRefusedByName) {
  const std::string id = counting();
  const std::string base = "/v1/environments/" + id;
  auto refused = daemon_->request("POST", base + "/pause", R"({"memory":"disk"})");
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("need CRIU"), std::string::npos) << refused.body;
  EXPECT_EQ(call("GET", base, nullptr, 200)["state"], "running") << "nothing was paused";
  EXPECT_TRUE(counts(id, counter(id)));
  for (const char* bad : {R"({"memory":"swap"})", R"({"memory":1})", R"({"memory":"ram","later":true})"}) {
    auto r = daemon_->request("POST", base + "/pause", bad);
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
  }
  EXPECT_EQ(daemon_->request("POST", base + "/resume", R"({"memory":"disk"})").status, 400) << "a resume has no fields";
  json paused = call("POST", base + "/pause", {{"memory", "ram"}}, 200);
  EXPECT_EQ(paused["paused_memory"], "ram") << paused.dump();
  EXPECT_EQ(daemon_->request("POST", base + "/pause", R"({"memory":"disk"})").status, 400)
      << "nor once it is paused in RAM";
  EXPECT_EQ(call("GET", base, nullptr, 200)["paused_memory"], "ram");
  // Nor at its expiry: refused at create.
  auto atExpiry = daemon_->request("POST", "/v1/environments", R"({"ttl_s":60,"on_expiry":"checkpoint"})");
  EXPECT_EQ(atExpiry.status, 400) << atExpiry.body;
  EXPECT_NE(atExpiry.body.find("needs a microvm environment"), std::string::npos) << atExpiry.body;
}

TEST_F(Pause, ThePauseStopsTheTimeToLiveUnlessItWasAskedToRun) {
  // Stopped: a 2 s environment paused for longer is still there, and its
  // expiry moves on by the pause's length.
  std::string id = createEnv({{"ttl_s", 2}});
  json paused = call("POST", "/v1/environments/" + id + "/pause", nullptr, 200);
  const auto pausedAt = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  json still = call("GET", "/v1/environments/" + id, nullptr, 200);
  EXPECT_EQ(still["state"], "paused") << "expired while its time was stopped: " << still.dump();
  json resumed = call("POST", "/v1/environments/" + id + "/resume", nullptr, 200);
  const int64_t pausedFor = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - pausedAt).count();
  EXPECT_GE(ms(resumed["expires_at"]) - ms(paused["expires_at"]), pausedFor - 100) << resumed.dump();
  // A new time to live given while paused counts from the resume.
  std::string other = createEnv();
  call("POST", "/v1/environments/" + other + "/pause", nullptr, 200);
  call("POST", "/v1/environments/" + other + "/timeout", {{"ttl_s", 1}}, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(call("GET", "/v1/environments/" + other, nullptr, 200)["state"], "paused");

  // Running: a paused environment expires like any other.
  std::string runs = createEnv({{"ttl_s", 1}, {"ttl_while_paused", "runs"}});
  EXPECT_EQ(call("POST", "/v1/environments/" + runs + "/pause", nullptr, 200)["ttl_while_paused"], "runs");
  std::string state;
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (state != "gone" && Clock::now() < deadline) {
    state = call("GET", "/v1/environments/" + runs, nullptr, 200).value("state", "");
    if (state != "gone") std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(state, "gone");
  auto bad = daemon_->request("POST", "/v1/environments", R"({"ttl_while_paused":"sometimes"})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("ttl_while_paused"), std::string::npos) << bad.body;
}

// on_expiry "pause" (docs/PAUSE.md, "At expiry"): the end of the time to
// live pauses the environment instead of destroying it (its files answer,
// its processes stay where they are), a resume gives it its time to live
// again, and the next end pauses it again.
TEST_F(Pause, AnEnvironmentAskedToPauseAtItsExpiryIsPausedAndAResumeGivesItsTimeAgain) {
  const std::string id = counting({{"ttl_s", 2}, {"on_expiry", "pause"}});
  const std::string base = "/v1/environments/" + id;
  EXPECT_EQ(call("GET", base, nullptr, 200)["on_expiry"], "pause");
  auto pausedNow = [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(15);
    json record;
    do {
      record = call("GET", base, nullptr, 200);
      if (record.value("state", "") == "paused") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (Clock::now() < deadline);
    return record;
  };
  json paused = pausedNow();
  const auto seenPaused = Clock::now();
  ASSERT_EQ(paused["state"], "paused") << "its expiry did not pause it: " << paused.dump();
  // The record says paused before the freezer has stopped everything (a
  // moatd that dies between never leaves "running" over frozen processes:
  // pause.cc); the event comes once it has.
  const std::string log = eventsUntil("?type=environment.paused&environment=" + id, "environment.paused");
  staysStill(id);
  EXPECT_EQ(daemon_->request("GET", base + "/files/stat?path=/workspace/n").status, 200);
  EXPECT_NE(log.find("\"reason\":\"expired\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"actor\":\"moatd\""), std::string::npos) << log;
  // Its time to live again, counted from the resume.
  EXPECT_GE(ms(paused["expires_at"]) - ms(paused["paused_at"]), 2000 - 1) << paused.dump();
  const long stopped = counter(id);
  json resumed = call("POST", base + "/resume", nullptr, 200);
  const int64_t seenFor = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - seenPaused).count();
  EXPECT_EQ(resumed["state"], "running") << resumed.dump();
  EXPECT_GE(ms(resumed["expires_at"]) - ms(paused["expires_at"]), seenFor - 250) << resumed.dump();
  EXPECT_TRUE(counts(id, stopped)) << "the counter did not go on";
  json again = pausedNow();
  EXPECT_EQ(again["state"], "paused") << "the second end of its time did not pause it: " << again.dump();
  // A fork keeps the choice; the refusals name the field.
  EXPECT_EQ(call("POST", base + "/fork", json::object(), 201)["on_expiry"], "pause");
  for (const char* body : {R"({"on_expiry":"sometimes"})", R"({"on_expiry":"pause","ttl_while_paused":"runs"})"}) {
    auto bad = daemon_->request("POST", "/v1/environments", body);
    EXPECT_EQ(bad.status, 400) << bad.body;
    EXPECT_NE(bad.body.find("on_expiry"), std::string::npos) << bad.body;
  }
}

// A fork of a paused environment runs (its files as they were; nothing of
// its processes) and keeps its choice of what a pause does to the TTL; the
// paused one stays paused.
TEST_F(Pause, AForkOfAPausedEnvironmentRunsAndKeepsItsTtlChoice) {
  const std::string id = counting({{"ttl_while_paused", "runs"}});
  call("POST", "/v1/environments/" + id + "/pause", nullptr, 200);
  json fork = call("POST", "/v1/environments/" + id + "/fork", json::object(), 201);
  const std::string copy = fork["id"];
  EXPECT_EQ(fork["state"], "running") << fork.dump();
  EXPECT_EQ(fork["ttl_while_paused"], "runs") << fork.dump();
  EXPECT_EQ(exec(copy, {{"cmd", {"test", "-s", "/workspace/n"}}})["exit_code"], 0) << "the fork has the files";
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "paused");
  staysStill(id);
}

TEST_F(Pause, APausedEnvironmentIsDestroyedWholeAndLeavesNothing) {
  const std::string id = counting();
  call("POST", "/v1/environments/" + id + "/pause", nullptr, 200);
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204);
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "gone");
  auto layout = isolation::cgroup::preparedHostLayout(false);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  noCgroupLeft(layout.value(), id);
  // And one paused then restored runs anew.
  const std::string again = counting();
  json snap = call("POST", "/v1/environments/" + again + "/snapshots", json::object(), 201);
  call("POST", "/v1/environments/" + again + "/pause", nullptr, 200);
  json restored = call("POST", "/v1/environments/" + again + "/restore", {{"snapshot", snap["id"]}}, 200);
  EXPECT_EQ(restored["state"], "running") << restored.dump();
  EXPECT_EQ(exec(again, {{"cmd", {"echo", "fresh"}}})["stdout"], "fresh\n");
}

// A command on its way to moat-init while the pause begins is waited for
// and frozen with the rest, never left running outside the freezer; a
// program that detaches (setsid, its own session) is caught too.
TEST_F(Pause, ACommandStartedDuringThePauseIsPausedToo) {
  const std::string id = createEnv();
  const std::string base = "/v1/environments/" + id;
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  std::thread starter([&] {
    const std::string writer =
        R"({"cmd":["sh","-c","setsid sh -c 'while :; do date +%s%N >> /workspace/t; done' >/dev/null 2>&1 &"]})";
    while (!stop) {
      if (daemon_->request("POST", base + "/exec", writer).status == 200) ++started;
    }
  });
  auto size = [&] {
    auto r = daemon_->request("GET", base + "/files/stat?path=/workspace/t");
    auto j = json::parse(r.body, nullptr, false);
    return r.status == 200 && j.is_object() ? j.value("size", int64_t{-1}) : int64_t{-1};
  };
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (started < 2 && Clock::now() < deadline) std::this_thread::yield();
  for (int round = 0; round < 10; ++round) {
    call("POST", base + "/pause", nullptr, 200);
    const int64_t at = size();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(size(), at) << "round " << round << ": a process ran on while paused";
    call("POST", base + "/resume", nullptr, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // new commands start between the pauses
  }
  stop = true;
  starter.join();
  EXPECT_GT(started.load(), 2);
  // A network change is refused too: its first link writes files inside.
  call("POST", base + "/pause", nullptr, 200);
  auto network = daemon_->request("PUT", base + "/network", R"({"network":"open"})");
  EXPECT_EQ(network.status, 409) << network.body;
  EXPECT_NE(network.body.find("is paused"), std::string::npos) << network.body;
}

// A paused environment whose pid 1 dies is ended like a running one (and
// its frozen processes with it), never left paused forever.
TEST_F(Pause, APausedEnvironmentWhosePid1DiesIsEndedWhole) {
  const std::string id = counting();
  call("POST", "/v1/environments/" + id + "/pause", nullptr, 200);
  auto layout = isolation::cgroup::preparedHostLayout(false);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  const std::string procs =
      (layout->version == isolation::cgroup::Version::kV2 ? layout->v2Parent : layout->v1Parents.at("cpu")) + "/moat-" +
      id + "/cgroup.procs";
  pid_t init = 0;
  auto listed = os::readFile(procs);
  ASSERT_TRUE(listed.ok()) << listed.error().message();
  std::istringstream in(listed.value());
  for (pid_t pid; in >> pid;) {
    auto comm = os::readFile("/proc/" + std::to_string(pid) + "/comm");
    if (comm.ok() && comm->rfind("moat-init", 0) == 0) init = pid;
  }
  ASSERT_GT(init, 0) << "no moat-init in " << procs;
  ASSERT_EQ(::kill(init, SIGKILL), 0);
  std::string state;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (state != "failed" && Clock::now() < deadline) {
    state = call("GET", "/v1/environments/" + id, nullptr, 200).value("state", "");
    if (state != "failed") std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(state, "failed");
  noCgroupLeft(layout.value(), id);
}

// Who may pause: a key with the scope, its own environments only.
TEST_F(Pause, OnlyAKeyWithThePauseScopePausesAndOnlyItsOwn) {
  const std::string mine = createEnv();
  json without = call("POST", "/v1/keys", {{"scopes", {"create", "read", "exec"}}}, 201);
  json with = call("POST", "/v1/keys", {{"scopes", {"create", "read", "pause"}}}, 201);
  EXPECT_EQ(as(without["token"], "POST", "/v1/environments/" + mine + "/pause").status, 403);
  EXPECT_EQ(as(with["token"], "POST", "/v1/environments/" + mine + "/pause").status, 404)
      << "another's environment looks absent";
  EXPECT_EQ(call("GET", "/v1/environments/" + mine, nullptr, 200)["state"], "running");
  auto own = as(with["token"], "POST", "/v1/environments", "{}");
  ASSERT_EQ(own.status, 201) << own.body;
  const std::string ownId = json::parse(own.body)["id"];
  auto paused = as(with["token"], "POST", "/v1/environments/" + ownId + "/pause");
  EXPECT_EQ(paused.status, 200) << paused.body;
  EXPECT_EQ(as(with["token"], "POST", "/v1/environments/" + ownId + "/resume").status, 200);
  EXPECT_EQ(daemon_->request("POST", "/v1/environments/000000000000/pause").status, 404);
  EXPECT_EQ(daemon_->request("POST", "/v1/environments/" + mine + "/pause", "{not json").status, 400);
  // A pause at expiry keeps the environment past its time, as a pause
  // does: a key that may not pause may not ask for it either.
  const std::string atExpiry = R"({"ttl_s":1,"on_expiry":"pause"})";
  auto refused = as(without["token"], "POST", "/v1/environments", atExpiry);
  EXPECT_EQ(refused.status, 403) << refused.body;
  EXPECT_NE(refused.body.find("on_expiry"), std::string::npos) << refused.body;
  EXPECT_EQ(as(without["token"], "GET", "/v1/environments").body.find("\"on_expiry\":\"pause\""), std::string::npos)
      << "the refused create made an environment";
  EXPECT_EQ(as(with["token"], "POST", "/v1/environments", atExpiry).status, 201);
}

}  // namespace
}  // namespace moat::test
