// Background processes through moatd: output kept and followed from any
// offset, stdin, signals, and clean endings when the environment goes.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/encoding.h"
#include "moatd_fixture.h"
#include "moatd_process.h"

namespace moat::test {
namespace {

using json = nlohmann::json;

class Processes : public MoatdFixture {
 protected:
  void SetUp() override {
    MoatdFixture::SetUp();
    if (daemon_) env_ = createEnv();
  }

  std::string base() const { return "/v1/environments/" + env_ + "/processes"; }

  json start(const json& body, int status = 201) { return call("POST", base(), body, status); }

  // Reads events until the final one (exit or end), or until the stream stops.
  static std::vector<json> readToEnd(EventStream& s) {
    std::vector<json> events;
    std::string line;
    while (s.nextLine(line)) {
      events.push_back(json::parse(line));
      if (events.back()["type"] == "exit" || events.back()["type"] == "end") break;
    }
    return events;
  }

  static std::string data(const json& e) {
    std::string d = e["data"];
    return e["encoding"] == "base64" ? base64Decode(d).value() : d;
  }

  static std::string stdoutOf(const std::vector<json>& events) {
    std::string out;
    for (const auto& e : events) {
      if (e["type"] == "output" && e["stream"] == "stdout") out += data(e);
    }
    return out;
  }

  json waitEnded(uint64_t pid) {
    json p;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      p = call("GET", base() + "/" + std::to_string(pid), nullptr, 200);
      if (p["state"] != "running") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return p;
  }

  std::string env_;
};

TEST_F(Processes, StartsAtOnceAndItsOutputFollowsToTheExit) {
  json p = start({{"cmd", {"sh", "-c", "echo out; echo err >&2; sleep 0.2; echo late; exit 3"}}});
  EXPECT_EQ(p["state"], "running");
  EXPECT_GT(p["pid"].get<int>(), 1);
  auto s = daemon_->stream(base() + "/" + std::to_string(p["id"].get<int>()) + "/output?follow=1");
  ASSERT_EQ(s.status(), 200);
  auto events = readToEnd(s);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(stdoutOf(events), "out\nlate\n");
  // Offsets are contiguous across both streams, and the exit comes last.
  uint64_t next = 0;
  std::string err;
  for (const auto& e : events) {
    if (e["type"] != "output") continue;
    EXPECT_EQ(e["offset"].get<uint64_t>(), next);
    next += data(e).size();
    if (e["stream"] == "stderr") err += data(e);
  }
  EXPECT_EQ(err, "err\n");
  EXPECT_EQ(events.back()["type"], "exit");
  EXPECT_EQ(events.back()["exit_code"], 3);
  EXPECT_EQ(events.back()["offset"].get<uint64_t>(), next);
  json after = call("GET", base() + "/" + std::to_string(p["id"].get<int>()), nullptr, 200);
  EXPECT_EQ(after["state"], "exited");
  EXPECT_EQ(after["exit_code"], 3);
  EXPECT_EQ(after["stdout_bytes"], 9);
}

TEST_F(Processes, AClientThatLeavesAndComesBackFromItsOffsetLosesNothing) {
  json p = start({{"cmd", {"sh", "-c", "i=0; while [ $i -lt 300 ]; do echo line$i; i=$((i+1)); sleep 0.002; done"}}});
  std::string id = std::to_string(p["id"].get<int>());
  std::string seen;
  uint64_t next = 0;
  {
    auto s = daemon_->stream(base() + "/" + id + "/output?follow=1");
    std::string line;
    for (int i = 0; i < 5 && s.nextLine(line); ++i) {
      json e = json::parse(line);
      if (e["type"] != "output") continue;
      seen += data(e);
      next = e["offset"].get<uint64_t>() + data(e).size();
    }
    s.close();  // detach: the process goes on
  }
  EXPECT_EQ(call("GET", base() + "/" + id, nullptr, 200)["state"], "running") << "leaving must not kill it";
  auto s = daemon_->stream(base() + "/" + id + "/output?follow=1&since=" + std::to_string(next));
  auto events = readToEnd(s);
  seen += stdoutOf(events);
  std::string expected;
  for (int i = 0; i < 300; ++i) expected += "line" + std::to_string(i) + "\n";
  EXPECT_EQ(seen, expected);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["exit_code"], 0);
}

TEST_F(Processes, OutputBeyondTheLogIsReportedDroppedNotSpliced) {
  json p = start({{"cmd", {"sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo -n END"}}});
  json ended = waitEnded(p["id"]);
  ASSERT_EQ(ended["state"], "exited");
  EXPECT_EQ(ended["stdout_bytes"], 3000003);
  EXPECT_EQ(ended["stdout_dropped"], 3000003 - (1 << 20));
  auto r = daemon_->request("GET", base() + "/" + std::to_string(p["id"].get<int>()) + "/output");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.contentType, "application/x-ndjson");
  std::vector<json> events;
  size_t start = 0;
  while (start < r.body.size()) {
    size_t nl = r.body.find('\n', start);
    events.push_back(json::parse(r.body.substr(start, nl - start)));
    start = nl + 1;
  }
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["type"], "dropped");
  EXPECT_EQ(events.front()["offset"], 0);
  EXPECT_EQ(events.front()["bytes"], 3000003 - (1 << 20));
  std::string kept = stdoutOf(events);
  EXPECT_EQ(kept.size(), 1u << 20);
  EXPECT_EQ(kept.substr(kept.size() - 3), "END");
  EXPECT_EQ(kept.find_first_not_of('x'), kept.size() - 3);
  EXPECT_EQ(events.back()["type"], "exit");
}

TEST_F(Processes, ALosslessProcessWaitsForItsReadersInsteadOfDropping) {
  // 3 MiB: three times what the log keeps of a stream.
  const std::string cmd = "head -c 3000000 /dev/zero | tr '\\0' x; echo -n END; touch /tmp/wrote-all";
  json p = start({{"cmd", {"sh", "-c", cmd}}, {"lossless", true}});
  EXPECT_EQ(p["lossless"], true);
  std::string path = base() + "/" + std::to_string(p["id"].get<int>());
  // Before its first follower, moat-init forwards exactly one window and the
  // process waits in its writes.
  json now;
  for (int i = 0; i < 2000; ++i) {
    now = call("GET", path, nullptr, 200);
    if (now["stdout_bytes"] == 512 * 1024) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(now["stdout_bytes"], 512 * 1024) << now.dump();
  EXPECT_EQ(now["state"], "running");
  auto probe = call("POST", "/v1/environments/" + env_ + "/exec", {{"cmd", {"test", "-e", "/tmp/wrote-all"}}}, 200);
  EXPECT_EQ(probe["exit_code"], 1) << "the process went on without a reader";
  // A follower gets every byte, in order, with nothing dropped.
  auto s = daemon_->stream(path + "/output?follow=1");
  ASSERT_EQ(s.status(), 200);
  auto events = readToEnd(s);
  for (const auto& e : events) EXPECT_NE(e["type"], "dropped") << e.dump();
  std::string out = stdoutOf(events);
  EXPECT_EQ(out.size(), 3000003u);
  EXPECT_EQ(out.find_first_not_of('x'), 3000000u);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["type"], "exit");
  EXPECT_EQ(events.back()["exit_code"], 0);
}

TEST_F(Processes, ALosslessFollowerThatComesBackFromItsOffsetLosesNothing) {
  json p = start({{"cmd", {"sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"}}, {"lossless", true}});
  std::string path = base() + "/" + std::to_string(p["id"].get<int>());
  uint64_t next = 0;
  std::string out;
  {
    auto s = daemon_->stream(path + "/output?follow=1");
    std::string line;
    ASSERT_TRUE(s.nextLine(line));
    json e = json::parse(line);
    ASSERT_EQ(e["type"], "output");
    out = data(e);
    next = e["offset"].get<uint64_t>() + out.size();
    s.close();  // gone for a moment (moatd's --lossless-wait is 30 s)
  }
  json held = call("GET", path, nullptr, 200);
  EXPECT_EQ(held["state"], "running") << "held while nobody follows";
  EXPECT_EQ(held["lossless"], true);
  auto s = daemon_->stream(path + "/output?follow=1&since=" + std::to_string(next));
  auto events = readToEnd(s);
  for (const auto& e : events) EXPECT_NE(e["type"], "dropped") << e.dump();
  out += stdoutOf(events);
  EXPECT_EQ(out.size(), 3000000u);
  EXPECT_EQ(out.find_first_not_of('x'), std::string::npos);
}

TEST_F(Processes, ALosslessProcessNobodyFollowsGoesOnAfterTheWait) {
  daemon_ = std::make_unique<Moatd>(std::vector<std::string>{"--lossless-wait", "1"});
  env_ = createEnv();
  // Never followed, and followed once then left: neither is held up for good.
  json never = start({{"cmd", {"sh", "-c", "head -c 3000000 /dev/zero"}}, {"lossless", true}});
  json left = start({{"cmd", {"sh", "-c", "head -c 3000000 /dev/zero"}}, {"lossless", true}});
  {
    auto s = daemon_->stream(base() + "/" + std::to_string(left["id"].get<int>()) + "/output?follow=1");
    std::string line;
    ASSERT_TRUE(s.nextLine(line));
    s.close();
  }
  for (const json& p : {never, left}) {
    json ended = waitEnded(p["id"]);
    EXPECT_EQ(ended["state"], "exited") << ended.dump();
    EXPECT_EQ(ended["lossless"], false);
    EXPECT_EQ(ended["stdout_bytes"], 3000000);
  }
}

TEST_F(Processes, ALosslessProcessIsNotHeldUpByAMoatdThatDied) {
  json p = start({{"cmd", {"sh", "-c", "head -c 3000000 /dev/zero; touch /tmp/wrote-all"}}, {"lossless", true}});
  std::string path = base() + "/" + std::to_string(p["id"].get<int>());
  json now = json::object();
  for (int i = 0; i < 2000 && now.value("stdout_bytes", 0) < 512 * 1024; ++i) {
    now = call("GET", path, nullptr, 200);
    if (now.value("stdout_bytes", 0) < 512 * 1024) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(now["stdout_bytes"], 512 * 1024) << "held at its window";
  // The next moatd knows nothing of the process: moat-init lifts its limit.
  daemon_->kill9();
  daemon_->restart();
  bool wrote = false;
  for (int i = 0; i < 400 && !wrote; ++i) {
    wrote = exec(env_, {{"cmd", {"test", "-e", "/tmp/wrote-all"}}})["exit_code"] == 0;
    if (!wrote) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(wrote) << "the process went on to its end";
}

TEST_F(Processes, StdinReachesTheProcessAndCloseIsEof) {
  json p = start({{"cmd", {"cat"}}});
  std::string path = base() + "/" + std::to_string(p["id"].get<int>());
  call("POST", path + "/stdin", {{"data", "hello\n"}}, 204);
  call("POST", path + "/stdin", {{"data", base64Encode(std::string("\xff\x00", 2))}, {"encoding", "base64"}}, 204);
  call("POST", path + "/stdin", {{"close", true}}, 204);
  auto s = daemon_->stream(path + "/output?follow=1");
  auto events = readToEnd(s);
  EXPECT_EQ(stdoutOf(events), std::string("hello\n\xff\x00", 8));
  EXPECT_EQ(events.back()["exit_code"], 0);
  json closed = call("POST", path + "/stdin", {{"data", "more"}}, 409);
  EXPECT_EQ(closed["error"]["code"], "conflict");
  // No stdin at all: /dev/null, so cat ends at once.
  json devnull = start({{"cmd", {"cat"}}, {"stdin", false}});
  EXPECT_EQ(waitEnded(devnull["id"])["exit_code"], 0);
}

// Input a process does not read waits in moatd's client, not in the
// environment: at most 1 MiB is held there (in memory the environment pays
// for); beyond it a write waits, then is refused whole and can be sent again.
TEST_F(Processes, InputAProcessDoesNotReadIsRefusedBeyondAMebibyteAndNothingIsLost) {
  json p = start({{"cmd", {"sh", "-c", "until [ -e /workspace/go ]; do sleep 0.01; done; exec wc -c"}}});
  std::string path = base() + "/" + std::to_string(p["id"].get<int>());
  const std::string piece(256u << 10, 'i');
  uint64_t accepted = 0;
  json full;
  for (int i = 0; i < 12 && full.is_null(); ++i) {
    auto r = daemon_->request("POST", path + "/stdin", json{{"data", piece}, {"wait_ms", 0}}.dump());
    if (r.status == 204) {
      accepted += piece.size();
    } else {
      ASSERT_EQ(r.status, 409) << r.body;
      full = json::parse(r.body);
    }
  }
  ASSERT_FALSE(full.is_null()) << "3 MiB taken for a process that reads nothing";
  EXPECT_EQ(full["error"]["code"], "stdin_full");
  EXPECT_NE(full["error"]["message"].get<std::string>().find("not reading its input"), std::string::npos) << full;
  EXPECT_GE(accepted, 1u << 20);
  EXPECT_LE(accepted, (1u << 20) + (64u << 10)) << "more held than the window and a pipe";
  EXPECT_EQ(call("POST", path + "/stdin", {{"data", "x"}, {"wait_ms", 300001}}, 400)["error"]["field"], "wait_ms");
  EXPECT_EQ(call("POST", path + "/stdin", {{"data", "x"}, {"wait_ms", "soon"}}, 400)["error"]["field"], "wait_ms");
  // It reads: the refused piece, sent again, and the rest get there once each.
  auto go = daemon_->request("PUT", "/v1/environments/" + env_ + "/files?path=/workspace/go", "");
  ASSERT_EQ(go.status, 200) << go.body;
  for (int i = 0; i < 4; ++i) {
    call("POST", path + "/stdin", {{"data", piece}}, 204);
    accepted += piece.size();
  }
  call("POST", path + "/stdin", {{"close", true}}, 204);
  auto s = daemon_->stream(path + "/output?follow=1");
  auto events = readToEnd(s);
  EXPECT_EQ(stdoutOf(events), std::to_string(accepted) + "\n");
}

TEST_F(Processes, SignalsByNameOrNumberReachTheGroup) {
  json a = start({{"cmd", {"sh", "-c", "sleep 100 & wait"}}});
  call("POST", base() + "/" + std::to_string(a["id"].get<int>()) + "/signal", {{"signal", "TERM"}}, 204);
  json endedA = waitEnded(a["id"]);
  EXPECT_EQ(endedA["exit_code"], 128 + 15);
  EXPECT_EQ(endedA["signal"], 15);
  json b = start({{"cmd", {"sleep", "100"}}});
  std::string pathB = base() + "/" + std::to_string(b["id"].get<int>());
  call("POST", pathB + "/signal", {{"signal", 9}}, 204);
  EXPECT_EQ(waitEnded(b["id"])["exit_code"], 128 + 9);
  EXPECT_EQ(call("POST", pathB + "/signal", {{"signal", "TERM"}}, 409)["error"]["code"], "conflict");
  json c = start({{"cmd", {"sleep", "100"}}});
  std::string pathC = base() + "/" + std::to_string(c["id"].get<int>());
  EXPECT_EQ(call("POST", pathC + "/signal", {{"signal", "NOPE"}}, 400)["error"]["field"], "signal");
  EXPECT_EQ(call("POST", pathC + "/signal", {{"signal", 65}}, 400)["error"]["field"], "signal");
  EXPECT_EQ(call("POST", pathC + "/signal", {{"signal", "SIGKILL"}}, 204), json());
  EXPECT_EQ(waitEnded(c["id"])["exit_code"], 128 + 9);
  // No process of the environment survived its group's signal (pgrep also
  // counts a killed one that is not reaped yet: hence the wait above).
  EXPECT_EQ(exec(env_, {{"cmd", {"pgrep", "sleep"}}})["exit_code"], 1);
}

TEST_F(Processes, TimeoutKillsTheProcess) {
  json p = start({{"cmd", {"sleep", "30"}}, {"timeout_ms", 200}});
  json ended = waitEnded(p["id"]);
  EXPECT_EQ(ended["timed_out"], true);
  EXPECT_EQ(ended["exit_code"], 128 + 9);
}

TEST_F(Processes, AFollowerOfADestroyedEnvironmentHearsWhyAtOnce) {
  json p = start({{"cmd", {"sleep", "1000"}}});
  auto s = daemon_->stream(base() + "/" + std::to_string(p["id"].get<int>()) + "/output?follow=1");
  ASSERT_EQ(s.status(), 200);
  std::thread destroyer([&] { call("DELETE", "/v1/environments/" + env_, nullptr, 204); });
  auto events = readToEnd(s);
  destroyer.join();
  ASSERT_FALSE(events.empty()) << "the stream must end with a reason, not hang";
  EXPECT_EQ(events.back()["type"], "end");
  EXPECT_EQ(events.back()["state"], "lost");
  EXPECT_NE(events.back()["reason"].get<std::string>().find("destroyed"), std::string::npos);
  // The environment is gone: its processes are too.
  EXPECT_EQ(call("GET", base(), nullptr, 409)["error"]["code"], "conflict");
}

TEST_F(Processes, AFailedStartIsAnAnswerNotAnError) {
  json p = start({{"cmd", {"no-such-command"}}});
  EXPECT_EQ(p["state"], "failed");
  EXPECT_EQ(p["exit_code"], 127);
  EXPECT_NE(p["error"].get<std::string>().find("not found"), std::string::npos);
  json q = start({{"cmd", {"/etc/passwd"}}});
  EXPECT_EQ(q["exit_code"], 126);
  // A follower hears why too.
  auto s = daemon_->stream(base() + "/" + std::to_string(p["id"].get<int>()) + "/output?follow=1");
  auto events = readToEnd(s);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["state"], "failed");
  EXPECT_EQ(events[0]["exit_code"], 127);
  EXPECT_NE(events[0]["error"].get<std::string>().find("not found"), std::string::npos);
}

TEST_F(Processes, AHundredFollowersEachGetEverythingAndExecStillServes) {
  json p = start({{"cmd", {"sh", "-c", "read go; i=0; while [ $i -lt 50 ]; do echo tick$i; i=$((i+1)); done"}}});
  std::string path = base() + "/" + std::to_string(p["id"].get<int>());
  std::vector<EventStream> followers;
  for (int i = 0; i < 100; ++i) {
    followers.push_back(daemon_->stream(path + "/output?follow=1"));
    ASSERT_EQ(followers.back().status(), 200);
  }
  for (int i = 0; i < 10; ++i) EXPECT_EQ(exec(env_, {{"cmd", {"true"}}})["exit_code"], 0);
  call("POST", path + "/stdin", {{"data", "go\n"}}, 204);
  std::string expected;
  for (int i = 0; i < 50; ++i) expected += "tick" + std::to_string(i) + "\n";
  for (auto& f : followers) {
    auto events = readToEnd(f);
    EXPECT_EQ(stdoutOf(events), expected);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back()["type"], "exit");
  }
}

TEST_F(Processes, BadRequestsNameTheProblem) {
  EXPECT_EQ(start({{"cmd", {"true"}}, {"colour", "red"}}, 400)["error"]["code"], "unknown_field");
  EXPECT_EQ(start(json::object(), 400)["error"]["field"], "cmd");
  EXPECT_EQ(start({{"cmd", json::array()}}, 400)["error"]["field"], "cmd");
  EXPECT_EQ(start({{"cmd", {"true"}}, {"rows", 40}}, 400)["error"]["field"], "rows");
  EXPECT_EQ(start({{"cmd", {"true"}}, {"pty", "yes"}}, 400)["error"]["field"], "pty");
  EXPECT_EQ(call("GET", base() + "/999", nullptr, 404)["error"]["code"], "not_found");
  EXPECT_EQ(call("GET", base() + "/abc", nullptr, 404)["error"]["code"], "not_found");
  EXPECT_EQ(call("GET", base() + "/1/nothing", nullptr, 404)["error"]["code"], "not_found");
  json p = start({{"cmd", {"true"}}});
  std::string path = base() + "/" + std::to_string(p["id"].get<int>());
  EXPECT_EQ(call("GET", path + "/output?since=-1", nullptr, 400)["error"]["field"], "since");
  EXPECT_EQ(call("GET", path + "/output?tail=1", nullptr, 400)["error"]["code"], "unknown_field");
  EXPECT_EQ(call("POST", path + "/stdin", json::object(), 400)["error"]["field"], "data");
  EXPECT_EQ(call("POST", path + "/resize", {{"rows", 10}, {"cols", 10}}, 409)["error"]["code"], "conflict");
  // A reader far past the end gets nothing it should not.
  waitEnded(p["id"]);
  auto r = daemon_->request("GET", path + "/output?since=999999");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body.substr(0, r.body.find('\n')))["type"], "exit");
}

TEST_F(Processes, AKeySeesOnlyItsOwnEnvironmentsProcesses) {
  json key = call("POST", "/v1/keys", {{"scopes", {"create", "read", "exec"}}}, 201);
  std::string token = key["token"];
  auto asKey = [&](const std::string& method, const std::string& target, const std::string& body = "") {
    return daemon_->request(method, target, body, false, {{"Authorization", "Bearer " + token}});
  };
  json p = start({{"cmd", {"sleep", "100"}}});
  std::string path = base() + "/" + std::to_string(p["id"].get<int>());
  EXPECT_EQ(asKey("GET", base()).status, 404);
  EXPECT_EQ(asKey("GET", path + "/output").status, 404);
  EXPECT_EQ(asKey("POST", path + "/signal", R"({"signal":"KILL"})").status, 404);
  EXPECT_EQ(asKey("POST", base(), R"({"cmd":["id"]})").status, 404);
  EXPECT_EQ(call("GET", path, nullptr, 200)["state"], "running") << "the other key's signal must not land";
  // Without the exec scope, a key cannot start processes even in its own environment.
  json readOnly = call("POST", "/v1/keys", {{"scopes", {"create", "read"}}}, 201);
  auto own = daemon_->request("POST", "/v1/environments", "{}", false,
                              {{"Authorization", "Bearer " + readOnly["token"].get<std::string>()}});
  std::string ownId = json::parse(own.body)["id"];
  auto denied = daemon_->request("POST", "/v1/environments/" + ownId + "/processes", R"({"cmd":["id"]})", false,
                                 {{"Authorization", "Bearer " + readOnly["token"].get<std::string>()}});
  EXPECT_EQ(denied.status, 403);
}

TEST_F(Processes, TooManyRunningIsACapacityAnswer) {
  for (int i = 0; i < 32; ++i) start({{"cmd", {"sleep", "100"}}, {"stdin", false}});
  EXPECT_EQ(start({{"cmd", {"sleep", "100"}}}, 429)["error"]["code"], "capacity");
  EXPECT_EQ(call("GET", base(), nullptr, 200)["processes"].size(), 32u);
}

TEST_F(Processes, EndedRecordsReadToTheEndAreTheFirstToGo) {
  // One nobody followed: its output is still wanted.
  json unread = start({{"cmd", {"echo", "keep me"}}, {"stdin", false}});
  ASSERT_EQ(waitEnded(unread["id"])["state"], "exited");
  // More followed to their exit than the environment keeps ended (16).
  for (int i = 0; i < 17; ++i) {
    json p = start({{"cmd", {"echo", std::to_string(i)}}, {"stdin", false}, {"lossless", true}});
    auto s = daemon_->stream(base() + "/" + std::to_string(p["id"].get<int>()) + "/output?follow=1");
    ASSERT_EQ(readToEnd(s).back()["type"], "exit");
  }
  start({{"cmd", {"true"}}, {"stdin", false}});  // a new one starts: the table is pruned
  json list = call("GET", base(), nullptr, 200)["processes"];
  EXPECT_EQ(list.front()["id"], unread["id"]) << "the unread record outlived the delivered ones";
  auto out = daemon_->request("GET", base() + "/" + std::to_string(unread["id"].get<int>()) + "/output");
  EXPECT_NE(out.body.find("keep me"), std::string::npos) << out.body;
  EXPECT_LE(list.size(), 16u + 1u);
}

}  // namespace
}  // namespace moat::test
