// The gate end to end: permissions on every side effect, people deciding
// what asks, and what a key may and may not do about it.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "moatd_fixture.h"
#include "moatd_process.h"
#include "os/file.h"

namespace moat::test {
namespace {

using json = nlohmann::json;

class Gate : public MoatdFixture {
 protected:
  void SetUp() override {
    if (!isRoot()) GTEST_SKIP() << "needs root: moatd creates namespaces, cgroups and mounts (CI runs as root)";
    daemon_ = std::make_unique<Moatd>(std::vector<std::string>{"--approval-timeout", "3"});
  }

  std::string envWith(const json& permissions) { return createEnv({{"permissions", permissions}}); }

  HttpResult execRaw(const std::string& id, const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& headers = {}) {
    return daemon_->request("POST", "/v1/environments/" + id + "/exec", json{{"cmd", argv}}.dump(), true, headers);
  }

  // The first pending approval, waiting (bounded) until one exists.
  json pendingApproval() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      json list = call("GET", "/v1/approvals?state=pending", nullptr, 200);
      if (!list["approvals"].empty()) return list["approvals"][0];
    }
    return json();
  }

  json keyWith(const json& body) { return call("POST", "/v1/keys", body, 201); }
  HttpResult as(const std::string& token, const std::string& method, const std::string& target,
                const std::string& body = "", std::map<std::string, std::string> headers = {}) {
    headers["Authorization"] = "Bearer " + token;
    return daemon_->request(method, target, body, false, headers);
  }
};

TEST_F(Gate, EveryScopeAllowsAsksOrDenies) {
  std::string id = envWith({{"read_file", "deny"}, {"write_file", "deny"}, {"run_command", "deny"}});
  auto denied = execRaw(id, {"true"});
  EXPECT_EQ(denied.status, 403);
  json err = json::parse(denied.body)["error"];
  EXPECT_EQ(err["code"], "denied_by_policy");
  EXPECT_EQ(err["scope"], "run_command");
  EXPECT_EQ(err["action"]["argv"], json({"true"}));
  EXPECT_EQ(daemon_->request("PUT", "/v1/environments/" + id + "/files?path=/workspace/a", "x").status, 403);
  EXPECT_EQ(daemon_->request("GET", "/v1/environments/" + id + "/files?path=/etc/hostname").status, 403);
  EXPECT_EQ(daemon_->request("GET", "/v1/environments/" + id + "/files/list?path=/").status, 403);
  EXPECT_EQ(daemon_->request("POST", "/v1/environments/" + id + "/processes", R"({"cmd":["true"]})").status, 403);
  EXPECT_EQ(daemon_->request("POST", "/v1/environments/" + id + "/files/mkdir", R"({"path":"/workspace/d"})").status,
            403);
  // Each scope asks, too: the request waits for a person (here: 202 with
  // the approval at once), and what was asked is what the approval shows.
  std::string asking = envWith({{"read_file", "ask"}, {"write_file", "ask"}, {"run_command", "ask"}});
  auto asks = [&](const std::string& method, const std::string& target, const std::string& body,
                  const std::string& scope) {
    auto r = daemon_->request(method, target, body, true, {{"Prefer", "respond-async"}});
    EXPECT_EQ(r.status, 202) << method << " " << target << ": " << r.body;
    json a = json::parse(r.body, nullptr, false);
    EXPECT_EQ(a["approval"]["state"], "pending") << r.body;
    EXPECT_EQ(a["approval"]["scope"], scope) << r.body;
  };
  asks("POST", "/v1/environments/" + asking + "/exec", R"({"cmd":["true"]})", "run_command");
  asks("PUT", "/v1/environments/" + asking + "/files?path=/workspace/a", "x", "write_file");
  asks("GET", "/v1/environments/" + asking + "/files?path=/etc/hostname", "", "read_file");
  // The defaults allow files and commands.
  std::string open = createEnv();
  EXPECT_EQ(exec(open, {{"cmd", {"true"}}})["exit_code"], 0);
  json p = call("GET", "/v1/environments/" + open + "/permissions", nullptr, 200)["permissions"];
  EXPECT_EQ(p["network"], "deny");
  EXPECT_EQ(p["run_command"], "allow");
}

// A listing shows names, and a name inside a tree read_file denies is
// something read: those entries are left out (they were listed before).
TEST_F(Gate, AReadDeniedTreeDoesNotListItsNames) {
  std::string id =
      envWith({{"read_file", {{{"path", "/workspace/secret/**"}, {"action", "deny"}}, {{"action", "allow"}}}}});
  exec(id, {{"cmd",
             {"sh", "-c",
              "mkdir -p /workspace/secret && echo s > /workspace/secret/plans.txt && echo o > /workspace/open"}}});
  json inside = call("GET", "/v1/environments/" + id + "/files/list?path=/workspace/secret", nullptr, 200);
  EXPECT_EQ(inside["entries"], json::array()) << inside.dump();
  json above = call("GET", "/v1/environments/" + id + "/files/list?path=/workspace", nullptr, 200);
  std::set<std::string> names;
  for (const auto& e : above["entries"]) names.insert(e["name"].get<std::string>());
  EXPECT_EQ(names, (std::set<std::string>{"open", "secret"})) << above.dump();
  EXPECT_EQ(daemon_->request("GET", "/v1/environments/" + id + "/files?path=/workspace/secret/plans.txt").status, 403);
}

TEST_F(Gate, RulesAreOrderedAndTheFirstMatchWins) {
  std::string id = envWith({{"run_command",
                             {{{"match", {"rm", "-rf", "*"}}, {"action", "deny"}},
                              {{"match", {"rm", "*"}}, {"action", "allow"}},
                              {{"match", {"echo", "*"}}, {"action", "allow"}}}},
                            {"write_file", {{{"path", "/workspace/**"}, {"action", "allow"}}, {{"action", "deny"}}}}});
  EXPECT_EQ(execRaw(id, {"rm", "-rf", "/workspace"}).status, 403);
  EXPECT_EQ(execRaw(id, {"/bin/rm", "-rf", "/"}).status, 403) << "a path to the program is the program";
  EXPECT_EQ(execRaw(id, {"rm", "-f", "/workspace/none"}).status, 200);
  EXPECT_EQ(execRaw(id, {"echo"}).status, 200) << "a last \"*\" takes any rest, none included";
  auto other = execRaw(id, {"true"});
  EXPECT_EQ(other.status, 403) << "no rule matched: deny";
  EXPECT_NE(json::parse(other.body)["error"]["message"].get<std::string>().find("no rule"), std::string::npos);
  EXPECT_EQ(daemon_->request("PUT", "/v1/environments/" + id + "/files?path=/workspace/a/b", "x").status, 200);
  EXPECT_EQ(daemon_->request("PUT", "/v1/environments/" + id + "/files?path=/workspace/../etc/x", "x").status, 403)
      << "paths are normalized before they are matched";
  EXPECT_EQ(
      daemon_->request("POST", "/v1/environments/" + id + "/files/move", R"({"from":"/workspace/a/b","to":"/etc/b"})")
          .status,
      403)
      << "a move needs both ends";
}

TEST_F(Gate, WhatReachesAWholeTreeAnswersToEveryRuleBelowIt) {
  // GATE.md's own example: /workspace/locked/** may not be written. Before,
  // removing /workspace recursively, moving /workspace/locked away, or
  // restoring the environment passed (the rule does not match those paths
  // themselves), and a snapshot read files read_file denies.
  std::string id =
      envWith({{"write_file", {{{"path", "/workspace/locked/**"}, {"action", "deny"}}, {{"action", "allow"}}}},
               {"read_file", {{{"path", "/workspace/secret/**"}, {"action", "deny"}}, {{"action", "allow"}}}}});
  exec(id, {{"cmd",
             {"sh", "-c",
              "mkdir -p /workspace/locked /workspace/secret /workspace/free && "
              "echo kept > /workspace/locked/f && echo s > /workspace/secret/s"}}});
  const std::string files = "/v1/environments/" + id + "/files";
  for (std::string path : {"/workspace", "/workspace/locked", "/"}) {
    auto removed = daemon_->request("DELETE", files + "?path=" + path + "&recursive=1");
    EXPECT_EQ(removed.status, 403) << path << ": " << removed.body;
    EXPECT_NE(removed.body.find("locked/**"), std::string::npos) << "names the rule: " << removed.body;
  }
  EXPECT_EQ(daemon_->request("POST", files + "/move", R"({"from":"/workspace/locked","to":"/workspace/x"})").status,
            403);
  EXPECT_EQ(daemon_->request("POST", files + "/move", R"({"from":"/workspace","to":"/w2"})").status, 403);
  EXPECT_EQ(daemon_->request("GET", files + "?path=/workspace/locked/f").body, "kept\n");
  // What no rule below protects is as before.
  EXPECT_EQ(daemon_->request("DELETE", files + "?path=/workspace/free&recursive=1").status, 200);
  EXPECT_EQ(daemon_->request("POST", files + "/move", R"({"from":"/workspace/locked/f","to":"/workspace/g"})").status,
            403);
  // A move reads what it moves: moved where it may be read, a file read_file
  // denies would be readable.
  auto carried = daemon_->request("POST", files + "/move", R"({"from":"/workspace/secret","to":"/workspace/free2"})");
  EXPECT_EQ(carried.status, 403) << carried.body;
  EXPECT_NE(carried.body.find("read_file"), std::string::npos) << carried.body;
  auto snapshot = daemon_->request("POST", "/v1/environments/" + id + "/snapshots", "{}");
  EXPECT_EQ(snapshot.status, 403) << snapshot.body;
  EXPECT_NE(snapshot.body.find("read_file"), std::string::npos) << snapshot.body;
  // Without the read rule, the snapshot is taken; restoring it rewrites
  // the locked tree, so the write rule refuses it.
  call("PUT", "/v1/environments/" + id + "/permissions",
       {{"permissions",
         {{"write_file", {{{"path", "/workspace/locked/**"}, {"action", "deny"}}, {{"action", "allow"}}}}}},
        {"replace", true}},
       200);
  std::string sid = call("POST", "/v1/environments/" + id + "/snapshots", json::object(), 201)["id"];
  auto restored = daemon_->request("POST", "/v1/environments/" + id + "/restore", json{{"snapshot", sid}}.dump());
  EXPECT_EQ(restored.status, 403) << restored.body;
}

TEST_F(Gate, AnAskWaitsForAPersonWhoApprovesOrDenies) {
  std::string id = envWith({{"run_command", "ask"}});
  HttpResult approved;
  std::thread asker([&] { approved = execRaw(id, {"echo", "yes"}); });
  json a = pendingApproval();
  ASSERT_FALSE(a.is_null());
  EXPECT_EQ(a["scope"], "run_command");
  EXPECT_EQ(a["action"]["argv"], json({"echo", "yes"}));
  EXPECT_EQ(a["requester"], "master");
  call("POST", "/v1/approvals/" + a["id"].get<std::string>(), {{"decision", "approve"}, {"reason", "fine"}}, 200);
  asker.join();
  EXPECT_EQ(approved.status, 200);
  EXPECT_EQ(json::parse(approved.body)["stdout"], "yes\n");
  auto repeat = execRaw(id, {"echo", "yes"}, {{"Prefer", "respond-async"}});
  ASSERT_EQ(repeat.status, 202) << "the waiting request used its approval up: a repeat asks again";
  call("POST", "/v1/approvals/" + json::parse(repeat.body)["approval"]["id"].get<std::string>(), {{"decision", "deny"}},
       200);

  HttpResult refused;
  std::thread asker2([&] { refused = execRaw(id, {"echo", "no"}); });
  json b = pendingApproval();
  ASSERT_FALSE(b.is_null());
  call("POST", "/v1/approvals/" + b["id"].get<std::string>(), {{"decision", "deny"}, {"reason", "not now"}}, 200);
  asker2.join();
  EXPECT_EQ(refused.status, 403);
  json err = json::parse(refused.body)["error"];
  EXPECT_EQ(err["approval"], b["id"]);
  EXPECT_NE(err["message"].get<std::string>().find("not now"), std::string::npos);
  // Both questions and both answers are in the audit log, with who decided.
  std::string events = eventsUntil("?type=approval.&environment=" + id, "approval.decided");
  EXPECT_NE(events.find("approval.requested"), std::string::npos) << events;
  EXPECT_NE(events.find("approval.decided"), std::string::npos) << events;
  EXPECT_NE(events.find("not now"), std::string::npos) << events;
  // Deciding twice is a conflict.
  EXPECT_EQ(
      call("POST", "/v1/approvals/" + b["id"].get<std::string>(), {{"decision", "approve"}}, 409)["error"]["code"],
      "conflict");
}

// An approval grants exactly what it showed (issue 24): the person denied
// the read and approved the stat of a file, and the agent's next GET of it
// returned its content; an approved mkdir let a PUT write a file there; an
// approved write let other bytes be written.
TEST_F(Gate, AnApprovalGrantsExactlyTheActionItShowed) {
  std::string id =
      envWith({{"read_file", {{{"path", "/workspace/secret/**"}, {"action", "ask"}}, {{"action", "allow"}}}},
               {"write_file", {{{"path", "/workspace/asked/**"}, {"action", "ask"}}, {{"action", "allow"}}}}});
  exec(id,
       {{"cmd", {"sh", "-c", "mkdir -p /workspace/secret /workspace/asked && echo s3cret > /workspace/secret/key"}}});
  const std::string base = "/v1/environments/" + id + "/files";
  const std::map<std::string, std::string> async = {{"Prefer", "respond-async"}};
  auto asked = [&](const std::string& method, const std::string& target, const std::string& body = "") {
    auto r = daemon_->request(method, target, body, true, async);
    EXPECT_EQ(r.status, 202) << method << " " << target << ": " << r.body;
    return json::parse(r.body, nullptr, false)["approval"].value("id", "");
  };
  std::string read = asked("GET", base + "?path=/workspace/secret/key");
  std::string stat = asked("GET", base + "/stat?path=/workspace/secret/key");
  call("POST", "/v1/approvals/" + read, {{"decision", "deny"}}, 200);
  call("POST", "/v1/approvals/" + stat, {{"decision", "approve"}}, 200);
  auto again = daemon_->request("GET", base + "?path=/workspace/secret/key", "", true, async);
  EXPECT_EQ(again.status, 202) << "the approved stat granted the read: " << again.body;
  EXPECT_EQ(again.body.find("s3cret"), std::string::npos);
  EXPECT_EQ(daemon_->request("GET", base + "/stat?path=/workspace/secret/key").status, 200) << "the stat it granted";
  // An approved mkdir grants no write there.
  std::string mkdir = asked("POST", base + "/mkdir", R"({"path":"/workspace/asked/agent"})");
  call("POST", "/v1/approvals/" + mkdir, {{"decision", "approve"}}, 200);
  EXPECT_EQ(daemon_->request("PUT", base + "?path=/workspace/asked/agent", "x", true, async).status, 202);
  // An approved write grants those bytes only.
  std::string write = asked("PUT", base + "?path=/workspace/asked/f", "shown bytes");
  json shown = call("GET", "/v1/approvals/" + write, nullptr, 200);
  EXPECT_EQ(shown["action"]["size"], 11);
  EXPECT_EQ(shown["action"]["sha256"].get<std::string>().size(), 64u) << shown.dump();
  call("POST", "/v1/approvals/" + write, {{"decision", "approve"}}, 200);
  EXPECT_EQ(daemon_->request("PUT", base + "?path=/workspace/asked/f", "other bytes", true, async).status, 202);
  EXPECT_EQ(daemon_->request("PUT", base + "?path=/workspace/asked/f", "shown bytes", true, async).status, 200);
}

// The variables a command runs with are part of what the gate judges
// (issue 24): with run_command allowing only `ls *`, an exec of ls with
// LD_PRELOAD naming a library the agent wrote ran that library's code, and
// the log showed only ["ls", "/workspace"].
TEST_F(Gate, CodeLoadingVariablesNeedARuleThatNamesThem) {
  std::string id = envWith({{"run_command",
                             {{{"match", {"ls", "*"}}, {"action", "allow"}},
                              {{"match", {"env", "*"}}, {"env", {"LD_LIBRARY_PATH"}}, {"action", "allow"}}}}});
  auto preload =
      daemon_->request("POST", "/v1/environments/" + id + "/exec",
                       json{{"cmd", {"ls", "/workspace"}}, {"env", {{"LD_PRELOAD", "/workspace/x.so"}}}}.dump());
  EXPECT_EQ(preload.status, 403) << preload.body;
  EXPECT_NE(preload.body.find("LD_PRELOAD"), std::string::npos) << preload.body;
  EXPECT_EQ(json::parse(preload.body)["error"]["action"]["env"]["LD_PRELOAD"], "/workspace/x.so") << preload.body;
  // The same as a process, and variables that load nothing are fine.
  EXPECT_EQ(daemon_
                ->request("POST", "/v1/environments/" + id + "/processes",
                          json{{"cmd", {"ls"}}, {"env", {{"BASH_ENV", "/workspace/rc"}}}}.dump())
                .status,
            403);
  EXPECT_EQ(daemon_
                ->request("POST", "/v1/environments/" + id + "/exec",
                          json{{"cmd", {"ls", "/"}}, {"env", {{"LANG", "C"}}}}.dump())
                .status,
            200);
  // A rule that names the variable allows it; the log records what was set.
  auto named = daemon_->request("POST", "/v1/environments/" + id + "/exec",
                                json{{"cmd", {"env"}}, {"env", {{"LD_LIBRARY_PATH", "/workspace/lib"}}}}.dump());
  EXPECT_EQ(named.status, 200) << named.body;
  std::string events = eventsUntil("?type=exec.started&environment=" + id, "LD_LIBRARY_PATH");
  EXPECT_NE(events.find("\"LD_LIBRARY_PATH\":\"/workspace/lib\""), std::string::npos) << events;
  // The defaults allow every command, but not one that loads code this way.
  std::string open = createEnv();
  EXPECT_EQ(daemon_
                ->request("POST", "/v1/environments/" + open + "/exec",
                          json{{"cmd", {"true"}}, {"env", {{"LD_PRELOAD", "/workspace/x.so"}}}}.dump())
                .status,
            403);
  // Rules naming a variable are validated.
  auto bad =
      daemon_->request("POST", "/v1/environments",
                       json{{"permissions", {{"run_command", {{{"env", "LD_PRELOAD"}, {"action", "allow"}}}}}}}.dump());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("permissions.run_command[0].env"), std::string::npos) << bad.body;
}

// Every program that starts in the environment answers to run_command, not
// only the command moatd was asked to run (issue 24): `sh -c 'rm -rf
// /workspace/*'` ran with a rule denying rm, and so did scripts, xargs,
// find -exec and interpreters. moat-init hands every exec to the gate.
TEST_F(Gate, EveryProgramAnswersToRunCommandHoweverItStarts) {
  std::string id = envWith({{"run_command",
                             {{{"match", {"rm", "-rf", "*"}}, {"action", "deny"}},
                              {{"match", {"rm", "*"}}, {"action", "allow"}},
                              {{"action", "allow"}}}}});
  exec(id, {{"cmd", {"sh", "-c", "mkdir -p /workspace/d && touch /workspace/d/a /workspace/keep"}}});
  for (const std::string& script :
       {std::string("rm -rf /workspace/d"), std::string("echo /workspace/d | xargs rm -rf"),
        std::string("find /workspace -name d -exec rm -rf {} +"),
        std::string("python3 -c 'import os; os.execvp(\"rm\", [\"rm\", \"-rf\", \"/workspace/d\"])'"),
        // argv[0] is the caller's to choose: the program is the file named.
        std::string("python3 -c 'import os; os.execv(\"/usr/bin/rm\", [\"ls\", \"-rf\", \"/workspace/d\"])'"),
        std::string("printf '#!/bin/sh\\nrm -rf /workspace/d\\n' > /tmp/s && chmod +x /tmp/s && /tmp/s"),
        // A script's interpreter is a program that starts too.
        std::string("printf '#!/usr/bin/rm -rf\\n' > /tmp/r && chmod +x /tmp/r && /tmp/r /workspace/d")}) {
    json r = exec(id, {{"cmd", {"sh", "-c", script + "; test -e /workspace/d/a && echo still-there"}}});
    EXPECT_NE(r["stdout"].get<std::string>().find("still-there"), std::string::npos) << script << ": " << r.dump();
    EXPECT_NE(r["stderr"].get<std::string>().find("Operation not permitted"), std::string::npos)
        << script << ": " << r.dump();
  }
  // What the rules allow still runs, nested too.
  // Also a copied binary and a script run by a relative path through env
  // (files of the environment's own layer; an interpreter found by a symlink);
  // and a FIFO named like a program does not hold moat-init (it would wait
  // in open(2) for a writer, every exec with it).
  json ok = exec(id, {{"cmd",
                       {"sh", "-c",
                        "cd /tmp && cp /bin/true t && ./t && printf '#!/usr/bin/env sh\\necho env-ok\\n' > e && "
                        "chmod +x e && ./e && mkfifo p && chmod +x p && { ./p 2>/dev/null; true; } && "
                        "rm /workspace/keep && ls /workspace"}},
                      {"timeout_ms", 20000}});
  EXPECT_EQ(ok["exit_code"], 0) << ok.dump();
  EXPECT_EQ(ok["stdout"], "env-ok\nd\n") << ok.dump();
  // The refusals are in the log with what was run and by whom.
  std::string events = eventsUntil("?type=gate.denied&environment=" + id, "\"program\"");
  EXPECT_NE(events.find("\"argv\":[\"rm\",\"-rf\",\"/workspace/d\"]"), std::string::npos) << events;
  EXPECT_NE(events.find("\"parents\""), std::string::npos) << events;
  // The programs it allowed too, each before the end of the command that ran
  // them (moat-init holds their reports a moment, never past its next message).
  std::string log = eventsUntil("?environment=" + id, "\"ls\",\"/workspace\"");
  int64_t ls = -1, lastEnded = -1;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: ", 0) != 0) continue;
    json e = json::parse(line.substr(6));
    if (e["type"] == "program.started" && e["data"]["action"]["argv"] == json({"ls", "/workspace"})) ls = e["id"];
    if (e["type"] == "exec.ended") lastEnded = e["id"];
  }
  ASSERT_GT(ls, 0) << log;
  EXPECT_LT(ls, lastEnded) << log;
}

// A user other than root inside answers to the same rules: moat-init reads
// its exec and follows it to its first instruction as for root's.
TEST_F(Gate, AnotherUsersProgramsAnswerToTheRulesToo) {
  std::string id = envWith({{"run_command", {{{"match", {"rm", "*"}}, {"action", "deny"}}, {{"action", "allow"}}}}});
  json r = exec(id, {{"cmd",
                      {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                       "touch /tmp/f; ls /tmp/f && id -u; rm /tmp/f || echo refused"}}});
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  EXPECT_EQ(r["stdout"], "/tmp/f\n65534\nrefused\n") << r.dump();
}

// A multithreaded program can rewrite what its exec asks for between the
// check and the kernel's own read of it: another thread flips the name
// between an allowed program and a denied one. Whatever the kernel ran,
// what was not judged is killed before its first instruction.
TEST_F(Gate, AProgramThatRewritesItsExecAfterTheCheckDoesNotRunIt) {
  std::string id = envWith({{"run_command", {{{"match", {"rm", "*"}}, {"action", "deny"}}, {{"action", "allow"}}}}});
  constexpr int kAttempts = 40;
  exec(id, {{"cmd",
             {"sh", "-c", "for i in $(seq 0 " + std::to_string(kAttempts - 1) + "); do touch /workspace/f$i; done"}}});
  const char* racer = R"(
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
allowed, denied = b"/bin/true\0\0\0", b"/usr/bin/rm\0"
for i in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        name = ctypes.create_string_buffer(allowed, 12)
        def flip():
            while True:
                ctypes.memmove(name, denied, 12)
                ctypes.memmove(name, allowed, 12)
        threading.Thread(target=flip, daemon=True).start()
        argv = (ctypes.c_char_p * 3)(b"x", b"/workspace/f%d" % i, None)
        libc.execve(name, argv, None)
        os._exit(3)
    os.waitpid(pid, 0)
)";
  json r = exec(id, {{"cmd", {"python3", "-c", racer, std::to_string(kAttempts)}}, {"timeout_ms", 60000}});
  ASSERT_EQ(r["exit_code"], 0) << r.dump();
  json left = exec(id, {{"cmd", {"sh", "-c", "ls /workspace | wc -l"}}});
  EXPECT_EQ(left["stdout"], std::to_string(kAttempts) + "\n") << "rm ran where only true was judged";
  // The same with a descriptor (fexecve): the name the kernel gives the
  // program is /dev/fd/N either way; the file behind N is swapped.
  const char* swapper = R"(
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
allowed, denied = os.open("/bin/true", os.O_RDONLY), os.open("/usr/bin/rm", os.O_RDONLY)
for i in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        os.dup2(allowed, 10)
        def swap():
            while True:
                os.dup2(denied, 10)
                os.dup2(allowed, 10)
        threading.Thread(target=swap, daemon=True).start()
        argv = (ctypes.c_char_p * 3)(b"x", b"/workspace/f%d" % i, None)
        libc.syscall(322, 10, b"", argv, None, 0x1000)  # execveat(10, "", argv, NULL, AT_EMPTY_PATH)
        os._exit(3)
    os.waitpid(pid, 0)
)";
  r = exec(id, {{"cmd", {"python3", "-c", swapper, std::to_string(kAttempts)}}, {"timeout_ms", 60000}});
  ASSERT_EQ(r["exit_code"], 0) << r.dump();
  left = exec(id, {{"cmd", {"sh", "-c", "ls /workspace | wc -l"}}});
  EXPECT_EQ(left["stdout"], std::to_string(kAttempts) + "\n") << "rm ran through a descriptor judged as true";
}

// A process another process traces cannot be traced for the second look:
// under rules its execs are refused, and the log does not say they started.
TEST_F(Gate, AProcessAnotherTracesCannotExecUnderRules) {
  std::string id = envWith({{"run_command", {{{"match", {"rm", "*"}}, {"action", "deny"}}, {{"action", "allow"}}}}});
  const char* script = R"(
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    libc.ptrace(0, 0, None, None)  # PTRACE_TRACEME: the parent traces it
    try:
        os.execv("/bin/echo", ["echo", "traced-and-ran"])
    except OSError as e:
        print("refused", e.errno, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
)";
  json r = exec(id, {{"cmd", {"python3", "-c", script}}});
  EXPECT_EQ(r["stdout"], "refused 1\n") << r.dump();
  std::string log = eventsUntil("?environment=" + id, "\"gate.denied\"");
  EXPECT_NE(log.find("\"gate.denied\""), std::string::npos) << log;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: ", 0) != 0) continue;
    json e = json::parse(line.substr(6));
    if (e["type"] == "program.started") {
      EXPECT_NE(e["data"]["action"]["argv"], json({"echo", "traced-and-ran"})) << "recorded as started: " << line;
    }
  }
}

// An argv is judged whole, however long (up to what any exec takes): one
// cut where the judgment stopped reading hid what came after it.
TEST_F(Gate, ALongCommandLineIsJudgedWhole) {
  std::string id = envWith({{"run_command",
                             {{{"match", {"rm", "/workspace/scratch"}}, {"action", "allow"}},
                              {{"match", {"rm", "*"}}, {"action", "deny"}},
                              {{"action", "allow"}}}}});
  exec(id, {{"cmd", {"sh", "-c", "mkdir /workspace/scratch && touch /workspace/keep"}}});
  // 64 KiB of argv[0]: the judgment read up to there once, and saw
  // ["/usr/bin/rm", "/workspace/scratch"].
  const char* script = R"(
import os
first = "A" * (65536 - len("/usr/bin/rm") - len("/workspace/scratch"))
os.execv("/usr/bin/rm", [first, "/workspace/scratch" + "/" * 1000 + "../keep"])
)";
  json r = exec(id, {{"cmd", {"python3", "-c", script}}});
  EXPECT_NE(r["stderr"].get<std::string>().find("Operation not permitted"), std::string::npos) << r.dump();
  EXPECT_EQ(exec(id, {{"cmd", {"ls", "/workspace"}}})["stdout"], "keep\nscratch\n");
  // What is long and allowed runs: 1.5 MB of arguments (the kernel takes 2 MiB here).
  json big = exec(id, {{"cmd",
                        {"python3", "-c",
                         "import os; os.execv('/usr/bin/python3', ['python3', '-c', 'import sys; "
                         "print(len(sys.argv))'] + ['x' * 1000] * 1500)"}}});
  EXPECT_EQ(big["stdout"], "1501\n") << big.dump().substr(0, 2000);
}

// A process whose judged exec failed stays traced until its next exec or
// its end: its signals, stops and continues behave as without the gate, and
// its next exec runs, from another thread too.
TEST_F(Gate, AProcessWhoseExecFailedRunsOnAsBefore) {
  std::string id = envWith({{"run_command", {{{"match", {"rm", "*"}}, {"action", "deny"}}, {{"action", "allow"}}}}});
  const char* script = R"(
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
try:
    os.execv("/nonexistent", ["x"])
except OSError as e:
    print("failed", e.errno)
os.kill(os.getpid(), signal.SIGUSR1)
print("handled", len(got))
child = os.fork()
if child == 0:
    parent = os.getppid()
    os.kill(parent, signal.SIGSTOP)
    while open("/proc/%d/stat" % parent).read().split(") ")[1][0] not in "Tt":  # t: traced
        time.sleep(0.001)
    os.kill(parent, signal.SIGCONT)
    os._exit(0)
os.waitpid(child, 0)
print("continued")
sys.stdout.flush()
# From a thread other than the first: it takes the process's id at exec.
import threading
threading.Thread(target=lambda: os.execv("/bin/echo", ["echo", "ran"])).start()
time.sleep(30)
)";
  json r = exec(id, {{"cmd", {"python3", "-c", script}}, {"timeout_ms", 20000}});
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  EXPECT_EQ(r["stdout"], "failed 2\nhandled 1\ncontinued\nran\n") << r.dump();
}

// The newest filter's listener gets a call several filters hand over: a
// process that installed its own would answer its execs itself, past the
// gate. After moat-init's, no listener can be made in the environment.
TEST_F(Gate, NoProcessInsideCanTakeTheExecGateOver) {
  std::string id = envWith({{"run_command", {{{"match", {"rm", "*"}}, {"action", "deny"}}, {{"action", "allow"}}}}});
  const char* script = R"(
import ctypes, ctypes.util, errno
libc = ctypes.CDLL(None, use_errno=True)
class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
allow = (Filter * 1)(Filter(0x06, 0, 0, 0x7fff0000))
prog = Prog(1, allow)
rc = libc.syscall(317, 1, 8, ctypes.byref(prog))  # seccomp(SET_MODE_FILTER, NEW_LISTENER)
print(rc, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
)";
  json r = exec(id, {{"cmd", {"python3", "-c", script}}});
  EXPECT_EQ(r["stdout"], "-1 EPERM\n") << r.dump();
  // A filter without a listener is still the process's to add.
  const char* plain = "import ctypes; l = ctypes.CDLL(None); print(l.prctl(38, 1, 0, 0, 0))";  // no_new_privs
  EXPECT_EQ(exec(id, {{"cmd", {"python3", "-c", plain}}})["stdout"], "0\n");
}

// An ask on a program waits for a person while its exec waits in the
// kernel; the approval shows the argv, the program and who runs it.
TEST_F(Gate, ANestedProgramThatAsksWaitsForAPerson) {
  std::string id = envWith({{"run_command",
                             {{{"match", {"sh", "*"}}, {"action", "allow"}},
                              {{"match", {"touch", "*"}}, {"action", "ask"}},
                              {{"action", "deny"}}}}});
  HttpResult r;
  std::thread runner([&] {
    r = daemon_->request("POST", "/v1/environments/" + id + "/exec",
                         json{{"cmd", {"sh", "-c", "touch /workspace/asked && echo made"}}}.dump());
  });
  json a = pendingApproval();
  ASSERT_FALSE(a.is_null());
  EXPECT_EQ(a["action"]["argv"], json({"touch", "/workspace/asked"})) << a.dump();
  EXPECT_EQ(a["action"]["op"], "program");
  EXPECT_EQ(a["action"]["program"], "/usr/bin/touch") << a.dump();
  EXPECT_FALSE(a["action"]["parents"].empty()) << a.dump();
  call("POST", "/v1/approvals/" + a["id"].get<std::string>(), {{"decision", "approve"}}, 200);
  runner.join();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["stdout"], "made\n") << r.body;
}

TEST_F(Gate, NobodyDecidingIsADenyThatSaysSo) {
  std::string id = envWith({{"write_file", "ask"}});
  auto r = daemon_->request("PUT", "/v1/environments/" + id + "/files?path=/workspace/f", "data");
  EXPECT_EQ(r.status, 403);
  json err = json::parse(r.body)["error"];
  EXPECT_NE(err["message"].get<std::string>().find("no decision within 3 s"), std::string::npos) << r.body;
  json a = call("GET", "/v1/approvals/" + err["approval"].get<std::string>(), nullptr, 200);
  EXPECT_EQ(a["state"], "expired");
  EXPECT_EQ(a["action"]["size"], 4);
  EXPECT_EQ(a["action"]["path"], "/workspace/f");
}

TEST_F(Gate, AsyncAsksGrantOneRepeatAndRememberMakesARule) {
  std::string id = envWith({{"run_command", "ask"}});
  auto r = execRaw(id, {"echo", "later"}, {{"Prefer", "respond-async"}});
  ASSERT_EQ(r.status, 202) << r.body;
  std::string approval = json::parse(r.body)["approval"]["id"];
  EXPECT_EQ(call("GET", "/v1/approvals/" + approval + "?wait=1", nullptr, 200)["state"], "pending");
  call("POST", "/v1/approvals/" + approval, {{"decision", "approve"}}, 200);
  auto repeated = execRaw(id, {"echo", "later"}, {{"Prefer", "respond-async"}});
  EXPECT_EQ(repeated.status, 200) << "the approved action runs once";
  EXPECT_EQ(execRaw(id, {"echo", "later"}, {{"Prefer", "respond-async"}}).status, 202) << "the grant is used up";
  // remember: the decision becomes a rule for exactly that action.
  auto again = execRaw(id, {"echo", "always"}, {{"Prefer", "respond-async"}});
  ASSERT_EQ(again.status, 202);
  call("POST", "/v1/approvals/" + json::parse(again.body)["approval"]["id"].get<std::string>(),
       {{"decision", "approve"}, {"remember", true}}, 200);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(execRaw(id, {"echo", "always"}).status, 200);
  EXPECT_EQ(execRaw(id, {"echo", "always", "more"}, {{"Prefer", "respond-async"}}).status, 202)
      << "remembered for exactly that argv";
  json rules = call("GET", "/v1/environments/" + id + "/permissions", nullptr, 200)["permissions"]["run_command"];
  ASSERT_TRUE(rules.is_array());
  EXPECT_EQ(rules[0]["match"], json({"echo", "always"}));
}

TEST_F(Gate, AShellIsARunCommand) {
  std::string id = envWith({{"run_command", "deny"}});
  auto shell = daemon_->websocket("/v1/environments/" + id + "/shell");
  EXPECT_EQ(shell.status, 403);
  EXPECT_NE(shell.rest.find("denied_by_policy"), std::string::npos);
  ::close(shell.fd);
}

TEST_F(Gate, TighteningTakesEffectForTheNextActionAndOnlyTrustedCallersLoosen) {
  json key = keyWith({{"scopes", {"create", "read", "exec", "files"}}});
  std::string token = key["token"];
  auto created = as(token, "POST", "/v1/environments", "{}");
  ASSERT_EQ(created.status, 201);
  std::string id = json::parse(created.body)["id"];
  std::string perms = "/v1/environments/" + id + "/permissions";
  EXPECT_EQ(as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["true"]})").status, 200);
  // The key adds a layer: it can only tighten.
  auto tightened = as(token, "PUT", perms,
                      R"({"permissions":{"run_command":[{"match":["true"],"action":"deny"},{"action":"allow"}]}})");
  ASSERT_EQ(tightened.status, 200) << tightened.body;
  EXPECT_EQ(json::parse(tightened.body)["layers"].size(), 2u);
  EXPECT_EQ(as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["true"]})").status, 403);
  EXPECT_EQ(as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["echo"]})").status, 200);
  // A layer that allows everything cannot undo another layer's deny.
  ASSERT_EQ(as(token, "PUT", perms, R"({"permissions":{"run_command":"allow"}})").status, 200);
  EXPECT_EQ(as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["true"]})").status, 403);
  // A remembered allow holds in every layer: the added layer asks, a person
  // approves once with remember, and it no longer asks.
  ASSERT_EQ(as(token, "PUT", perms,
               R"({"permissions":{"run_command":[{"match":["echo","ask"],"action":"ask"},{"action":"allow"}]}})")
                .status,
            200);
  auto asked =
      as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["echo","ask"]})", {{"Prefer", "respond-async"}});
  ASSERT_EQ(asked.status, 202) << asked.body;
  call("POST", "/v1/approvals/" + json::parse(asked.body)["approval"]["id"].get<std::string>(),
       {{"decision", "approve"}, {"remember", true}}, 200);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["echo","ask"]})").status, 200);
  }
  // Replacing can loosen: not for this key.
  EXPECT_EQ(as(token, "PUT", perms, R"({"permissions":{"run_command":"allow"},"replace":true})").status, 403);
  // The master can.
  call("PUT", perms, {{"permissions", {{"run_command", "allow"}}}, {"replace", true}}, 200);
  EXPECT_EQ(as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["true"]})").status, 200);
}

TEST_F(Gate, AKeysCeilingHoldsAndItCannotApproveItself) {
  json key = keyWith({{"scopes", {"create", "read", "exec", "files", "approve"}},
                      {"permissions",
                       {{"run_command", {{{"match", {"echo", "*"}}, {"action", "ask"}}, {{"action", "allow"}}}},
                        {"write_file", "deny"}}}});
  std::string token = key["token"];
  EXPECT_EQ(key["permissions"]["write_file"], "deny");
  auto created = as(token, "POST", "/v1/environments", R"({"permissions":{"write_file":"allow"}})");
  std::string id = json::parse(created.body)["id"];
  EXPECT_EQ(as(token, "PUT", "/v1/environments/" + id + "/files?path=/workspace/x", "x").status, 403)
      << "the environment allows it, the key's ceiling does not";
  auto pending =
      as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["echo","hi"]})", {{"Prefer", "respond-async"}});
  ASSERT_EQ(pending.status, 202);
  std::string approval = json::parse(pending.body)["approval"]["id"];
  EXPECT_EQ(json::parse(pending.body)["approval"]["requester"], key["id"]);
  auto self = as(token, "POST", "/v1/approvals/" + approval, R"({"decision":"approve"})");
  EXPECT_EQ(self.status, 403) << "an agent must not approve its own request";
  json readOnly = keyWith({{"scopes", {"read"}}});
  EXPECT_EQ(as(readOnly["token"], "GET", "/v1/approvals").status, 403);
}

TEST_F(Gate, AKeyWithoutApproveFollowsTheApprovalsItAskedForAndNoOthers) {
  // GATE.md tells a client that got a 202 to follow its Location; an agent
  // key (no `approve`, as advised) got 403 there.
  json agent = keyWith({{"scopes", {"create", "read", "exec"}}});
  std::string token = agent["token"];
  auto created = as(token, "POST", "/v1/environments", R"({"permissions":{"run_command":"ask"}})");
  ASSERT_EQ(created.status, 201) << created.body;
  std::string id = json::parse(created.body)["id"];
  auto pending =
      as(token, "POST", "/v1/environments/" + id + "/exec", R"({"cmd":["echo","hi"]})", {{"Prefer", "respond-async"}});
  ASSERT_EQ(pending.status, 202) << pending.body;
  std::string approval = json::parse(pending.body)["approval"]["id"];
  auto followed = as(token, "GET", "/v1/approvals/" + approval + "?wait=0");
  EXPECT_EQ(followed.status, 200) << followed.body;
  EXPECT_EQ(json::parse(followed.body)["state"], "pending");
  EXPECT_EQ(as(token, "POST", "/v1/approvals/" + approval, R"({"decision":"approve"})").status, 403);
  EXPECT_EQ(as(token, "GET", "/v1/approvals").status, 403) << "not the list";
  // Another's approval, or none, looks the same: 403.
  std::string masters = envWith({{"run_command", "ask"}});
  auto other = execRaw(masters, {"echo", "master"}, {{"Prefer", "respond-async"}});
  ASSERT_EQ(other.status, 202);
  auto foreign = as(token, "GET", "/v1/approvals/" + json::parse(other.body)["approval"]["id"].get<std::string>());
  EXPECT_EQ(foreign.status, 403) << foreign.body;
  EXPECT_EQ(as(token, "GET", "/v1/approvals/000000000000").status, 403);
  call("POST", "/v1/approvals/" + approval, {{"decision", "approve"}}, 200);
  followed = as(token, "GET", "/v1/approvals/" + approval);
  EXPECT_EQ(json::parse(followed.body)["state"], "approved");
}

TEST_F(Gate, BadPermissionsNameTheField) {
  auto bad = [&](const json& permissions) {
    auto r = daemon_->request("POST", "/v1/environments", json{{"permissions", permissions}}.dump());
    EXPECT_EQ(r.status, 400) << permissions.dump() << " -> " << r.body;
    return json::parse(r.body)["error"];
  };
  EXPECT_EQ(bad({{"run_command", "maybe"}})["field"], "permissions.run_command");
  EXPECT_EQ(bad({{"run_command", {{{"match", {"ls"}}}}}})["field"], "permissions.run_command[0].action");
  EXPECT_EQ(bad({{"run_command", {{{"path", "/x"}, {"action", "deny"}}}}})["code"], "unknown_field");
  EXPECT_EQ(bad({{"write_file", {{{"path", "relative"}, {"action", "deny"}}}}})["field"],
            "permissions.write_file[0].path");
  EXPECT_EQ(bad({{"teleport", "allow"}})["code"], "unknown_field");
  EXPECT_EQ(bad(json::array())["field"], "permissions");
}

TEST_F(Gate, PendingApprovalsSurviveARestartAsExpired) {
  std::string id = envWith({{"run_command", "ask"}});
  auto r = execRaw(id, {"echo", "x"}, {{"Prefer", "respond-async"}});
  ASSERT_EQ(r.status, 202);
  std::string approval = json::parse(r.body)["approval"]["id"];
  daemon_->kill9();
  daemon_->restart();
  json a = call("GET", "/v1/approvals/" + approval, nullptr, 200);
  EXPECT_EQ(a["state"], "expired");
  EXPECT_NE(a["reason"].get<std::string>().find("restarted"), std::string::npos);
  // The environment's permissions survived too.
  EXPECT_EQ(call("GET", "/v1/environments/" + id + "/permissions", nullptr, 200)["permissions"]["run_command"], "ask");
}

// Host pids of the processes whose command line holds `marker`.
std::vector<pid_t> hostPidsWith(const std::string& marker) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // A process may end while it is read (ESRCH): it is then not one of them.
    auto cmdline = os::readFile(entry.path() / "cmdline");
    if (cmdline && cmdline->find(marker) != std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

// moat-init judges programs by itself while moatd is away and keeps what it
// decided for the next moatd: nothing runs unrecorded.
TEST_F(Gate, ProgramsRunWhileMoatdRestartsAreRecordedByTheNext) {
  std::string id = envWith({{"run_command", {{{"match", {"rm", "*"}}, {"action", "deny"}}, {{"action", "allow"}}}}});
  exec(id, {{"cmd", {"touch", "/workspace/x"}}});
  // Waits for SIGUSR1 (sent from the host once moatd is gone), then runs one
  // allowed and one denied program.
  const std::string marker = "moat-gate-restart-" + id;
  call("POST", "/v1/environments/" + id + "/processes",
       {{"cmd",
         {"sh", "-c",
          "go=; trap go=1 USR1; while [ -z \"$go\" ]; do sleep 0.02; done; "
          "touch /workspace/while-away; rm /workspace/x; : " +
              marker}}},
       201);
  // The shell, not a child it forked for a sleep (same command line until
  // that child execs): the one whose parent is not one of them.
  std::vector<pid_t> pids;
  for (int i = 0; i < 500 && pids.empty(); ++i) pids = hostPidsWith(marker);
  const std::vector<pid_t> all = pids;
  std::erase_if(pids, [&](pid_t pid) {
    auto read = os::readFile("/proc/" + std::to_string(pid) + "/stat");
    if (!read) return true;  // gone meanwhile
    const std::string& text = *read;
    size_t close = text.rfind(')');
    if (close == std::string::npos) return true;  // gone meanwhile
    pid_t parent = std::atoi(text.c_str() + close + 4);
    return std::find(all.begin(), all.end(), parent) != all.end();
  });
  ASSERT_EQ(pids.size(), 1u);
  // Its trap set (SIGUSR1 caught): a signal sent before that would end the
  // shell before it ran anything (its command line is there from its exec).
  auto catchesUsr1 = [&] {
    return (std::strtoull(statusOf(pids[0], "SigCgt").c_str(), nullptr, 16) & (1ull << (SIGUSR1 - 1))) != 0;
  };
  const auto trapped = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!catchesUsr1() && std::chrono::steady_clock::now() < trapped) std::this_thread::yield();
  ASSERT_TRUE(catchesUsr1()) << "the shell never set its trap";
  daemon_->kill9();
  ASSERT_EQ(::kill(pids[0], SIGUSR1), 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::kill(pids[0], 0) == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_NE(::kill(pids[0], 0), 0) << "the process did not end";
  daemon_->restart();
  std::string log = eventsUntil("?environment=" + id, "\"gate.denied\"");
  EXPECT_NE(log.find("\"argv\":[\"touch\",\"/workspace/while-away\"]"), std::string::npos) << log;
  EXPECT_NE(log.find("\"argv\":[\"rm\",\"/workspace/x\"]"), std::string::npos) << log;
  // And what the rules said held: the file it was denied to remove is there.
  EXPECT_EQ(exec(id, {{"cmd", {"ls", "/workspace"}}})["stdout"], "while-away\nx\n");
}

}  // namespace
}  // namespace moat::test
