// moatd end to end: a real daemon on a fresh state directory, spoken to over
// HTTP on its unix socket.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/unique_fd.h"
#include "isolation/cgroup/layout.h"
#include "moat_process.h"
#include "moatd_fixture.h"
#include "moatd_process.h"
#include "os/file.h"

namespace moat::test {
namespace {

using json = nlohmann::json;

class MoatdApi : public MoatdFixture {};

TEST_F(MoatdApi, HealthzNeedsNoTokenButEverythingElseDoes) {
  EXPECT_EQ(daemon_->request("GET", "/healthz", "", false).status, 200);
  auto missing = daemon_->request("GET", "/v1/environments", "", false);
  EXPECT_EQ(missing.status, 401);
  EXPECT_NE(missing.body.find("unauthorized"), std::string::npos);
  auto wrong =
      daemon_->request("GET", "/v1/environments", "", false, {{"Authorization", "Bearer " + std::string(64, 'a')}});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(daemon_->request("GET", "/metrics", "", false).status, 401);
}

TEST_F(MoatdApi, MasterTokenFileIsPrivate) {
  struct stat st;
  ASSERT_EQ(::stat((daemon_->stateDir() + "/master-token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(daemon_->token().size(), 64u);
}

TEST_F(MoatdApi, CreateExecDestroy) {
  json env = call("POST", "/v1/environments",
                  {{"task_id", "agent-task-1"},
                   {"spec", {{"cpus", 1}, {"ram_mb", 256}, {"storage_gb", 1}, {"pids", 128}}},
                   {"labels", {{"team", "a"}}},
                   {"ttl_s", 600}},
                  201);
  std::string id = env["id"];
  EXPECT_EQ(id.size(), 12u);
  EXPECT_EQ(env["state"], "running");
  EXPECT_EQ(env["task_id"], "agent-task-1");
  EXPECT_EQ(env["spec"]["ram_mb"], 256);
  EXPECT_EQ(env["labels"]["team"], "a");
  EXPECT_TRUE(env.contains("created_at") && env.contains("expires_at"));

  json r =
      exec(id, {{"cmd", {"python3", "-c", "import sys; print('hi'); print('oops', file=sys.stderr); sys.exit(3)"}}});
  EXPECT_EQ(r["exit_code"], 3);
  EXPECT_EQ(r["stdout"], "hi\n");
  EXPECT_EQ(r["stderr"], "oops\n");
  EXPECT_EQ(r["timed_out"], false);
  EXPECT_EQ(r["encoding"], "utf8");

  // State carries over between commands of one environment.
  exec(id, {{"cmd", {"sh", "-c", "echo kept > /workspace/f"}}});
  EXPECT_EQ(exec(id, {{"cmd", {"cat", "/workspace/f"}}})["stdout"], "kept\n");

  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "running");
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204);
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204) << "idempotent";
  json gone = call("GET", "/v1/environments/" + id, nullptr, 200);
  EXPECT_EQ(gone["state"], "gone");
  auto late = daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["true"]})");
  EXPECT_EQ(late.status, 409) << late.body;
}

TEST_F(MoatdApi, ExecStdinTimeoutNotFoundAndBinaryOutput) {
  std::string id = createEnv();
  EXPECT_EQ(exec(id, {{"cmd", {"cat"}}, {"stdin", "piped in"}})["stdout"], "piped in");
  json t = exec(id, {{"cmd", {"sleep", "30"}}, {"timeout_ms", 200}});
  EXPECT_EQ(t["timed_out"], true);
  json nf = exec(id, {{"cmd", {"no-such-command"}}});
  EXPECT_EQ(nf["exit_code"], 127);
  EXPECT_NE(nf["stderr"].get<std::string>().find("not found"), std::string::npos);
  json bin = exec(id, {{"cmd", {"printf", "\\377\\376ok"}}});
  EXPECT_EQ(bin["encoding"], "base64");
  EXPECT_EQ(bin["stdout"], "//5vaw==");
  json env = exec(id, {{"cmd", {"sh", "-c", "echo $GREETING"}}, {"env", {{"GREETING", "hello"}}}});
  EXPECT_EQ(env["stdout"], "hello\n");
  // Commands start with default signal dispositions, whatever moatd ignores.
  EXPECT_EQ(exec(id, {{"cmd", {"sh", "-c", "kill -TERM $$"}}})["exit_code"], 128 + 15);
  EXPECT_EQ(exec(id, {{"cmd", {"grep", "SigIgn", "/proc/self/status"}}})["stdout"], "SigIgn:\t0000000000000000\n");
}

// policy/seccomp/moatd.policy holds on every thread moatd runs (API,
// egress proxy, resolver, audit writer...), not just the first.
TEST_F(MoatdApi, EveryMoatdThreadRunsUnderItsSeccompProfile) {
  createEnv();  // the manager's, the pool's and the connections' threads exist
  std::string task = "/proc/" + std::to_string(daemon_->pid()) + "/task";
  size_t threads = 0;
  for (const auto& entry : std::filesystem::directory_iterator(task)) {
    auto status = os::readFile((entry.path() / "status").string());
    if (!status.ok()) continue;  // a thread that ended meanwhile
    ++threads;
    EXPECT_NE(status->find("Seccomp:\t2\n"), std::string::npos) << entry.path() << ":\n" << status.value();
  }
  EXPECT_GT(threads, 3u);
}

// Each live environment has a host uid range of its own: sharing one would
// let two environments' processes count against each other's per-uid limits
// and own each other's files on the host.
TEST_F(MoatdApi, LiveEnvironmentsNeverShareAHostIdRange) {
  std::set<std::string> maps;
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    ids.push_back(createEnv());
    std::string map = exec(ids.back(), {{"cmd", {"cat", "/proc/self/uid_map"}}})["stdout"];
    ASSERT_FALSE(map.empty());
    EXPECT_TRUE(maps.insert(map).second) << "two environments share " << map;
  }
  for (const auto& id : ids) EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204);
}

// The spawner makes network namespaces ahead of the creates that join them:
// each environment still gets one of its own, used by nobody before, with
// only its loopback (up), and what listens in one is out of reach of the
// next, also across destroys.
TEST_F(MoatdApi, EveryEnvironmentGetsAFreshNetworkNamespaceOfItsOwn) {
  struct stat host;
  ASSERT_EQ(::stat("/proc/self/ns/net", &host), 0);
  const std::string hostNs = "net:[" + std::to_string(host.st_ino) + "]";
  // Listens on 127.0.0.1:7000 (in the background) and says when it does.
  const json listen = {{"cmd",
                        {"python3", "-c",
                         "import socket,os,sys\n"
                         "s=socket.socket(); s.bind(('127.0.0.1',7000)); s.listen()\n"
                         "if os.fork(): print('listening'); sys.exit(0)\n"
                         "os.setsid(); s.accept()\n"}}};
  const json probe = {{"cmd",
                       {"python3", "-c",
                        "import socket\n"
                        "try: socket.create_connection(('127.0.0.1',7000),timeout=2); print('reached')\n"
                        "except OSError as e: print(type(e).__name__)\n"}}};
  // Namespace numbers are compared only between namespaces alive at once:
  // the kernel gives a destroyed environment's number to a later namespace.
  std::string previous, previousNs;
  for (int i = 0; i < 6; ++i) {
    std::string id = createEnv();
    std::string ns = exec(id, {{"cmd", {"readlink", "/proc/self/ns/net"}}})["stdout"];
    ASSERT_FALSE(ns.empty());
    EXPECT_NE(ns, hostNs + "\n") << "the host's network namespace";
    EXPECT_NE(ns, previousNs) << "two live environments share " << ns;
    previousNs = ns;
    std::string devices =
        exec(id, {{"cmd", {"sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}}})["stdout"];
    EXPECT_EQ(devices, "lo\n");
    EXPECT_EQ(exec(id, probe)["stdout"], "ConnectionRefusedError\n") << "reached a listener of an earlier environment";
    EXPECT_EQ(exec(id, listen)["stdout"], "listening\n");
    EXPECT_EQ(exec(id, probe)["stdout"], "reached\n") << "its own loopback is not up";
    if (!previous.empty()) {
      EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + previous).status, 204);
    }
    previous = id;
  }
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + previous).status, 204);
}

// moatd's spawner makes user namespaces (each with its id range) ahead of
// the creates that take them: none may be handed out twice, and every
// environment alive at once has a range of its own, never the host's ids.
TEST_F(MoatdApi, EveryEnvironmentGetsAUserNamespaceAndIdRangeOfItsOwn) {
  struct stat host;
  ASSERT_EQ(::stat("/proc/self/ns/user", &host), 0);
  const std::string hostNs = "user:[" + std::to_string(host.st_ino) + "]\n";
  std::set<std::string> namespaces, ranges;
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) {
    // One created, one destroyed and created again: ready namespaces are
    // taken in turns and refilled between requests.
    std::string id = createEnv();
    if (i % 2 == 1) {
      EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204);
      id = createEnv();
    }
    ids.push_back(id);
    std::string ns = exec(id, {{"cmd", {"readlink", "/proc/self/ns/user"}}})["stdout"];
    std::string map = exec(id, {{"cmd", {"cat", "/proc/self/uid_map"}}})["stdout"];
    EXPECT_NE(ns, hostNs) << "the host's user namespace";
    EXPECT_TRUE(namespaces.insert(ns).second) << "two live environments share " << ns;
    std::istringstream fields(map);
    uint64_t inside = 1, outside = 0, count = 0;
    fields >> inside >> outside >> count;
    EXPECT_EQ(inside, 0u) << map;
    EXPECT_GE(outside, 0x40000000u) << map;
    EXPECT_EQ(count, 65536u) << map;
    EXPECT_TRUE(ranges.insert(std::to_string(outside)).second) << "two live environments map " << outside;
    std::string gidMap = exec(id, {{"cmd", {"cat", "/proc/self/gid_map"}}})["stdout"];
    EXPECT_EQ(gidMap, map) << "uids and gids map alike";
  }
  for (const auto& id : ids) EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204);
}

// moat-init launches commands on threads that count against the pids limit.
// With the limit reached by the environment's own processes, concurrent
// execs get a clear "cannot run" (fork fails) and pid 1 survives: it once
// died on a thread it could not start, and the environment with it.
TEST_F(MoatdApi, ExecsAtAFullPidsLimitFailCleanlyAndTheEnvironmentSurvives) {
  std::string id = createEnv({{"spec", {{"pids", 16}}}});
  // The shell starts sleepers until it cannot fork (and exits 2 then). They
  // hold the pids for 10 s: long enough for the execs below on a slow,
  // loaded machine (3 s was not, under the sanitizers beside other work).
  json filled =
      exec(id, {{"cmd", {"sh", "-c", "i=0; while [ $i -lt 40 ]; do sleep 10 & i=$((i+1)); done 2>/dev/null"}}});
  ASSERT_EQ(filled["exit_code"], 2) << "the pids limit did not stop the shell: " << filled.dump();
  std::vector<std::thread> clients;
  std::vector<int> statuses(8, 0);
  std::vector<int> exitCodes(8, -1);
  for (size_t k = 0; k < statuses.size(); ++k) {
    clients.emplace_back([&, k] {
      auto r = daemon_->request("POST", "/v1/environments/" + id + "/exec", json{{"cmd", {"true"}}}.dump());
      statuses[k] = r.status;
      auto j = json::parse(r.body, nullptr, false);
      if (j.is_object() && j.contains("exit_code")) exitCodes[k] = j["exit_code"];
    });
  }
  for (auto& c : clients) c.join();
  int refused = 0;
  for (size_t k = 0; k < statuses.size(); ++k) {
    EXPECT_EQ(statuses[k], 200) << "exec " << k;
    EXPECT_TRUE(exitCodes[k] == 0 || exitCodes[k] == 126) << "exec " << k << ": " << exitCodes[k];
    refused += exitCodes[k] == 126;
  }
  EXPECT_GT(refused, 0) << "the pids limit did not hold";
  // Once the sleepers end, the environment runs commands again.
  bool alive = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!alive && std::chrono::steady_clock::now() < deadline) {
    auto r = daemon_->request("POST", "/v1/environments/" + id + "/exec", json{{"cmd", {"echo", "alive"}}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    alive = json::parse(r.body)["stdout"] == "alive\n";
    if (!alive) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the sleepers hold the pids for 10 s
  }
  EXPECT_TRUE(alive) << "the environment never ran a command again";
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "running");
}

// Output of control bytes is valid UTF-8 but six times its size as JSON
// text: it comes as base64 (a third larger at most) instead.
TEST_F(MoatdApi, ControlByteOutputComesAsBase64NotSixfold) {
  std::string id = createEnv();
  auto r =
      daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["head","-c","1000000","/dev/zero"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_LT(r.body.size(), 1400000u);
  json j = json::parse(r.body);
  EXPECT_EQ(j["encoding"], "base64");
  EXPECT_EQ(j["stdout"].get<std::string>().size(), 1333336u);
  // Ordinary text stays text.
  EXPECT_EQ(exec(id, {{"cmd", {"printf", "a\\tb\\n"}}})["encoding"], "utf8");
}

TEST_F(MoatdApi, HugeOutputIsCappedAndSaysSo) {
  std::string id = createEnv();
  json r = exec(id, {{"cmd", {"sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x"}}});
  EXPECT_EQ(r["stdout"].get<std::string>().size(), 1u << 20);
  EXPECT_EQ(r["stdout_truncated"], true);
  // The daemon keeps serving.
  EXPECT_EQ(exec(id, {{"cmd", {"echo", "after"}}})["stdout"], "after\n");
}

TEST_F(MoatdApi, FilesRoundTripAndStayInsideTheEnvironment) {
  std::string id = createEnv();
  std::string base = "/v1/environments/" + id + "/files";
  auto put = daemon_->request("PUT", base + "?path=/workspace/dir/a.txt", "hello file");
  EXPECT_EQ(put.status, 200) << put.body;
  auto get = daemon_->request("GET", base + "?path=/workspace/dir/a.txt");
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, "hello file");
  json list = call("GET", base + "/list?path=/workspace/dir", nullptr, 200);
  ASSERT_EQ(list["entries"].size(), 1u);
  EXPECT_EQ(list["entries"][0]["name"], "a.txt");
  json stat = call("GET", base + "/stat?path=/workspace/dir/a.txt", nullptr, 200);
  EXPECT_EQ(stat["size"], 10);
  call("POST", base + "/move", {{"from", "/workspace/dir/a.txt"}, {"to", "/workspace/b.txt"}}, 200);
  EXPECT_EQ(daemon_->request("GET", base + "?path=/workspace/b.txt").body, "hello file");
  EXPECT_EQ(daemon_->request("GET", base + "?path=/workspace/dir/a.txt").status, 404);

  // Traversal and symlinks resolve inside the environment's root.
  auto passwd = daemon_->request("GET", base + "?path=/workspace/../../../../etc/passwd");
  EXPECT_EQ(passwd.status, 200);
  EXPECT_EQ(passwd.body.find("daemon:"), std::string::npos) << "host passwd leaked";
  exec(id, {{"cmd", {"ln", "-s", "/", "/workspace/rootlink"}}});
  auto shadow = daemon_->request("GET", base + "?path=/workspace/rootlink/etc/shadow");
  EXPECT_EQ(shadow.status, 200);
  EXPECT_EQ(shadow.body, "") << "the environment's shadow is empty; the host's is not";
  auto relative = daemon_->request("GET", base + "?path=etc/passwd");
  EXPECT_EQ(relative.status, 400);
  // Query parameters are validated like body fields.
  auto unknown = daemon_->request("GET", base + "/stat?path=/workspace/b.txt&bogus=1");
  EXPECT_EQ(unknown.status, 400);
  EXPECT_EQ(json::parse(unknown.body)["error"]["field"], "bogus");
  EXPECT_EQ(daemon_->request("PUT", base + "?path=/workspace/m&mode=9999", "x").status, 400);
  EXPECT_EQ(daemon_->request("PUT", base + "?path=/workspace/m&mode=4755", "x").status, 400);
  EXPECT_EQ(daemon_->request("GET", base + "?path=/workspace/b.txt&offset=abc").status, 400);
  EXPECT_EQ(daemon_->request("PUT", base + "?path=/workspace/b.txt&append=true", " more").status, 200);
  EXPECT_EQ(daemon_->request("GET", base + "?path=/workspace/b.txt&offset=6&length=4").body, "file");
  EXPECT_EQ(daemon_->request("GET", base + "?path=/workspace/b.txt").body, "hello file more");
  EXPECT_EQ(daemon_->request("POST", base + "/mkdir", R"({"path":"/workspace/x/y","parents":"yes"})").status, 400);
  EXPECT_EQ(daemon_->request("GET", "/v1/environments/" + id + "?verbose=1").status, 400);
  auto ro = daemon_->request("PUT", base + "?path=/usr/bin/evil", "x");
  EXPECT_NE(ro.status, 200);
}

// skip_holes=1: a sparse file's holes are not sent; X-Moat-Offset says
// where the bytes begin, X-Moat-File-Size how large the file is. A hostile
// file (a FIFO, a kernel file, a link out) is refused as for any read.
TEST_F(MoatdApi, AReadThatSkipsHolesSendsOnlyTheData) {
  std::string id = createEnv();
  std::string base = "/v1/environments/" + id + "/files?path=";
  exec(id, {{"cmd",
             {"sh", "-c",
              "truncate -s 1G /workspace/sparse && printf data | dd of=/workspace/sparse bs=1M seek=512 "
              "conv=notrunc 2>/dev/null && mkfifo /workspace/fifo && ln -s /proc/self/pagemap /workspace/pm"}}});
  auto first = daemon_->request("GET", base + "/workspace/sparse&skip_holes=1&length=8388608");
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(first.headers["x-moat-offset"], std::to_string(512u << 20));
  EXPECT_EQ(first.headers["x-moat-file-size"], std::to_string(1u << 30));
  EXPECT_EQ(first.body.substr(0, 4), "data");
  EXPECT_LT(first.body.size(), 1u << 20) << "the hole after the data was sent";
  auto end = daemon_->request(
      "GET", base + "/workspace/sparse&skip_holes=1&offset=" + std::to_string((512u << 20) + first.body.size()));
  ASSERT_EQ(end.status, 200) << end.body;
  EXPECT_EQ(end.body, "");
  EXPECT_EQ(end.headers["x-moat-offset"], std::to_string(1u << 30));
  // Without it, zeros as before, from the offset asked for.
  auto plain = daemon_->request("GET", base + "/workspace/sparse&offset=7&length=3");
  EXPECT_EQ(plain.body, std::string(3, '\0'));
  EXPECT_EQ(plain.headers["x-moat-offset"], "7");
  // The audit says where the bytes read began.
  std::string events = eventsUntil("?type=file.read&environment=" + id, std::to_string(512u << 20));
  EXPECT_NE(events.find("\"offset\":" + std::to_string(512u << 20)), std::string::npos) << events;
  for (const std::string path : {"/workspace/fifo", "/workspace/pm", "/proc/self/pagemap"}) {
    auto refused = daemon_->request("GET", base + path + "&skip_holes=1");
    EXPECT_EQ(refused.status, 400) << path << ": " << refused.body.substr(0, 200);
    EXPECT_EQ(json::parse(refused.body)["error"]["code"], "file_error") << path;
  }
  auto bad = daemon_->request("GET", base + "/workspace/sparse&skip_holes=yes");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(json::parse(bad.body)["error"]["field"], "skip_holes");
  auto huge = daemon_->request("GET", base + "/workspace/sparse&skip_holes=1&offset=9007199254740993");
  EXPECT_EQ(huge.status, 400) << huge.body.substr(0, 200);
  // The environment and moatd keep serving.
  EXPECT_EQ(exec(id, {{"cmd", {"true"}}})["exit_code"], 0);
}

TEST_F(MoatdApi, BadInputGetsClearErrorsAndTheDaemonKeepsServing) {
  auto r = daemon_->request("POST", "/v1/environments", "{not json");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("bad_json"), std::string::npos);
  r = daemon_->request("POST", "/v1/environments", R"({"spec":{"cpus":1,"gpus":2}})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["field"], "spec.gpus");
  r = daemon_->request("POST", "/v1/environments", R"({"spec":{"ram_mb":"lots"}})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["field"], "spec.ram_mb");
  r = daemon_->request("POST", "/v1/environments", R"({"spec":{"pids":0}})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["field"], "spec.pids");
  r = daemon_->request("POST", "/v1/environments", R"({"ttl_s":-5})");
  EXPECT_EQ(r.status, 400);
  r = daemon_->request("POST", "/v1/environments", "[1,2]");
  EXPECT_EQ(r.status, 400);
  r = daemon_->request("POST", "/v1/environments", std::string(2u << 20, ' '));
  EXPECT_EQ(r.status, 413);
  r = daemon_->request("GET", "/v1/environments/000000000000");
  EXPECT_EQ(r.status, 404);
  r = daemon_->request("GET", "/v1/nothing");
  EXPECT_EQ(r.status, 404);
  r = daemon_->request("PATCH", "/v1/environments");
  EXPECT_EQ(r.status, 405);
  std::string id = createEnv();
  r = daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":[]})");
  EXPECT_EQ(r.status, 400);
  r = daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["ls", 5]})");
  EXPECT_EQ(json::parse(r.body)["error"]["field"], "cmd[1]");
  r = daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["ls"],"shell":true})");
  EXPECT_EQ(json::parse(r.body)["error"]["field"], "shell");
  EXPECT_EQ(exec(id, {{"cmd", {"echo", "still fine"}}})["stdout"], "still fine\n");
  auto metrics = daemon_->request("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("moat_exec_total 1"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("moat_api_errors_total{code=\"invalid_request\"}"), std::string::npos);
}

TEST_F(MoatdApi, ListFiltersByLabelTaskAndState) {
  std::string a = createEnv({{"task_id", "t1"}, {"labels", {{"k", "x"}}}});
  std::string b = createEnv({{"task_id", "t2"}, {"labels", {{"k", "y"}}}});
  json byLabel = call("GET", "/v1/environments?label=k%3Dx", nullptr, 200);
  ASSERT_EQ(byLabel["environments"].size(), 1u);
  EXPECT_EQ(byLabel["environments"][0]["id"], a);
  json byTask = call("GET", "/v1/environments?task_id=t2", nullptr, 200);
  ASSERT_EQ(byTask["environments"].size(), 1u);
  EXPECT_EQ(byTask["environments"][0]["id"], b);
  EXPECT_EQ(call("GET", "/v1/environments?state=running", nullptr, 200)["environments"].size(), 2u);
  EXPECT_EQ(daemon_->request("GET", "/v1/environments?colour=red").status, 400);
}

TEST_F(MoatdApi, TtlExpiryDestroysWithAReasonAndTimeoutExtends) {
  std::string shortLived = createEnv({{"ttl_s", 1}});
  std::string extended = createEnv({{"ttl_s", 1}});
  json longer = call("POST", "/v1/environments/" + extended + "/timeout", {{"ttl_s", 600}}, 200);
  EXPECT_EQ(longer["state"], "running");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  json env;
  while (std::chrono::steady_clock::now() < deadline) {
    env = call("GET", "/v1/environments/" + shortLived, nullptr, 200);
    if (env["state"] == "gone") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(env["state"], "gone");
  EXPECT_EQ(env.value("reason", ""), "expired");
  EXPECT_EQ(call("GET", "/v1/environments/" + extended, nullptr, 200)["state"], "running");
}

TEST_F(MoatdApi, ScopedKeysTouchOnlyTheirOwnEnvironments) {
  json agent =
      call("POST", "/v1/keys", {{"name", "agent"}, {"scopes", {"create", "read", "exec", "files", "destroy"}}}, 201);
  std::string token = agent["token"];
  EXPECT_EQ(token.rfind("moat_" + agent["id"].get<std::string>() + "_", 0), 0u);
  json reader = call("POST", "/v1/keys", {{"name", "reader"}, {"scopes", {"read"}}}, 201);
  auto as = [&](const std::string& t, const std::string& method, const std::string& target,
                const std::string& body = "") {
    return daemon_->request(method, target, body, false, {{"Authorization", "Bearer " + t}});
  };
  // The agent key creates and runs commands in its own environment.
  auto created = as(token, "POST", "/v1/environments", "{}");
  ASSERT_EQ(created.status, 201) << created.body;
  std::string mine = json::parse(created.body)["id"];
  auto ran = as(token, "POST", "/v1/environments/" + mine + "/exec", R"({"cmd":["echo","agent"]})");
  EXPECT_EQ(ran.status, 200);
  EXPECT_EQ(json::parse(ran.body)["stdout"], "agent\n");
  // It cannot see or touch the master's environment: to it, that does not exist.
  std::string masters = createEnv();
  EXPECT_EQ(as(token, "GET", "/v1/environments/" + masters).status, 404);
  EXPECT_EQ(as(token, "POST", "/v1/environments/" + masters + "/exec", R"({"cmd":["true"]})").status, 404);
  EXPECT_EQ(as(token, "DELETE", "/v1/environments/" + masters).status, 404);
  json listed = json::parse(as(token, "GET", "/v1/environments").body);
  ASSERT_EQ(listed["environments"].size(), 1u);
  EXPECT_EQ(listed["environments"][0]["id"], mine);
  // Scopes hold: the read-only key cannot create or exec, and no key manages keys.
  std::string readToken = reader["token"];
  auto denied = as(readToken, "POST", "/v1/environments", "{}");
  EXPECT_EQ(denied.status, 403);
  EXPECT_NE(denied.body.find("'create'"), std::string::npos);
  EXPECT_EQ(as(token, "POST", "/v1/keys", R"({"scopes":["read"]})").status, 403);
  // The store keeps only a hash of each token.
  auto db = os::readFile(daemon_->stateDir() + "/moat.db", 64u << 20);
  auto wal = os::readFile(daemon_->stateDir() + "/moat.db-wal", 64u << 20);
  std::string secret = token.substr(18);
  EXPECT_EQ(db.value().find(secret), std::string::npos);
  EXPECT_EQ(wal.ok() ? wal.value().find(secret) : std::string::npos, std::string::npos);
  // Revoked keys are refused; forged ones too.
  EXPECT_EQ(daemon_->request("DELETE", "/v1/keys/" + agent["id"].get<std::string>()).status, 204);
  auto revoked = as(token, "GET", "/v1/environments");
  EXPECT_EQ(revoked.status, 401);
  EXPECT_NE(revoked.body.find("revoked"), std::string::npos);
  std::string forged = token;
  forged.back() = forged.back() == 'a' ? 'b' : 'a';
  EXPECT_EQ(as(forged, "GET", "/v1/environments").status, 401);
  json keys = call("GET", "/v1/keys", nullptr, 200);
  EXPECT_EQ(keys["keys"].size(), 2u);
  EXPECT_EQ(keys.dump().find(secret), std::string::npos) << "tokens are shown once";
  EXPECT_EQ(daemon_->request("POST", "/v1/keys", R"({"scopes":["root"]})").status, 400);
}

TEST_F(MoatdApi, RevokingAKeyEndsItsOpenStreams) {
  // From then on the key's token is 401: that holds for streams it opened
  // before too (an event follow, an output follow), not only new requests.
  json agent = call("POST", "/v1/keys", {{"name", "agent"}, {"scopes", {"create", "read", "exec", "audit"}}}, 201);
  const std::map<std::string, std::string> auth = {{"Authorization", "Bearer " + agent["token"].get<std::string>()}};
  auto created = daemon_->request("POST", "/v1/environments", "{}", false, auth);
  ASSERT_EQ(created.status, 201) << created.body;
  std::string id = json::parse(created.body)["id"];
  auto started =
      daemon_->request("POST", "/v1/environments/" + id + "/processes",
                       R"({"cmd":["sh","-c","while read line; do echo got $line; done"],"stdin":true})", false, auth);
  ASSERT_EQ(started.status, 201) << started.body;
  std::string process = std::to_string(json::parse(started.body)["id"].get<int>());
  const std::string processPath = "/v1/environments/" + id + "/processes/" + process;
  auto events = daemon_->stream("/v1/events?follow=1&environment=" + id, auth, false);
  auto output = daemon_->stream(processPath + "/output?follow=1", auth, false);
  ASSERT_EQ(events.status(), 200);
  ASSERT_EQ(output.status(), 200);
  std::string line;
  ASSERT_TRUE(events.nextLine(line)) << "the environment's first event";
  call("POST", processPath + "/stdin", {{"data", "before\n"}}, 204);
  bool before = false;
  while (!before && output.nextLine(line)) before = line.find("got before") != std::string::npos;
  ASSERT_TRUE(before);
  EXPECT_EQ(daemon_->request("DELETE", "/v1/keys/" + agent["id"].get<std::string>()).status, 204);
  // The process goes on (it is the environment's); the key's streams end.
  call("POST", processPath + "/stdin", {{"data", "after\n"}}, 204);
  // Read until the stream ends, or for 20 s (a stream that goes on sends
  // heartbeats for ever).
  auto readToEnd = [&line](EventStream& s) {
    std::string seen;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until && s.nextLine(line, 5000)) seen += line + "\n";
    return seen;
  };
  std::string seen = readToEnd(output);
  EXPECT_NE(seen.find("was revoked"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("got after"), std::string::npos) << "nothing after the revocation: " << seen;
  seen = readToEnd(events);
  EXPECT_NE(seen.find("was revoked"), std::string::npos) << seen;
  auto master = daemon_->stream(processPath + "/output?follow=1");
  bool after = false;
  while (!after && master.nextLine(line)) after = line.find("got after") != std::string::npos;
  EXPECT_TRUE(after) << "the master still follows it";
}

TEST_F(MoatdApi, EnvironmentVariablesFromCreateSurviveARestart) {
  std::string id = createEnv({{"env", {{"PROJECT", "moat"}}}});
  EXPECT_EQ(exec(id, {{"cmd", {"sh", "-c", "echo $PROJECT"}}})["stdout"], "moat\n");
  daemon_->kill9();
  daemon_->restart();
  EXPECT_EQ(exec(id, {{"cmd", {"sh", "-c", "echo $PROJECT"}}})["stdout"], "moat\n");
}

// One unlabelled value from moatd's /metrics; -1 when it is not there.
long metricOf(Moatd& daemon, const std::string& name) {
  auto body = daemon.request("GET", "/metrics").body;
  auto at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stol(body.substr(at + name.size() + 2));
}

// Waits up to 30 s for the warm pools to hold n ready environments; returns
// how many they hold.
long waitWarmReady(Moatd& daemon, long n) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (metricOf(daemon, "moat_warm_pool_ready") != n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return metricOf(daemon, "moat_warm_pool_ready");
}

TEST(MoatdWarmPool, CreateClaimsAReadyEnvironmentAndThePoolRefills) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon({"--warm-pool", "2"});
  auto metric = [&](const std::string& name) { return metricOf(daemon, name); };
  auto waitReady = [&](long n) { return waitWarmReady(daemon, n); };
  ASSERT_EQ(waitReady(2), 2);
  auto created = daemon.request("POST", "/v1/environments", R"({"task_id":"warm","env":{"A":"1"}})");
  ASSERT_EQ(created.status, 201) << created.body;
  json env = json::parse(created.body);
  EXPECT_EQ(env["task_id"], "warm");
  EXPECT_EQ(metric("moat_warm_pool_claims_total"), 1);
  std::string id = env["id"];
  auto r = daemon.request("POST", "/v1/environments/" + id + "/exec",
                          R"({"cmd":["sh","-c","echo $A $(hostname); ls -A /workspace | wc -l"]})");
  EXPECT_EQ(json::parse(r.body)["stdout"], "1 " + id + "\n0\n");
  // A spec other than the pool's is created fresh, not claimed.
  auto custom = daemon.request("POST", "/v1/environments", R"({"spec":{"ram_mb":300}})");
  EXPECT_EQ(custom.status, 201);
  EXPECT_EQ(metric("moat_warm_pool_claims_total"), 1);
  EXPECT_EQ(waitReady(2), 2) << "the pool refills in the background";
}

// A claim whose record the store refuses (a full disk, say) is an error that
// names it; the environment goes back to the pool and moatd keeps serving.
// Before, the failed claim left its thread blocked on moatd's own lock and
// every later request hung.
TEST(MoatdWarmPool, AClaimTheStoreRefusesIsAClearErrorAndMoatdKeepsServing) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon({"--warm-pool", "1"});
  ASSERT_EQ(waitWarmReady(daemon, 1), 1);
  auto sql = [&](const std::string& statement) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open_v2((daemon.stateDir() + "/moat.db").c_str(), &db, SQLITE_OPEN_READWRITE, nullptr),
              SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    EXPECT_EQ(sqlite3_exec(db, statement.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close_v2(db);
  };
  sql("CREATE TRIGGER refuse_environments BEFORE INSERT ON environments "
      "BEGIN SELECT RAISE(ABORT, 'no room on the disk (the test says so)'); END");
  // Answered in time, or moatd hangs (the request runs aside, so that the
  // test fails rather than waits for ever).
  auto within = [&](const std::string& method, const std::string& target, const std::string& body = "") {
    auto answer =
        std::async(std::launch::async, [&, method, target, body] { return daemon.request(method, target, body); });
    if (answer.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << method << " " << target << ": no answer in 30 s";
      daemon.kill9();  // ends the request's read
      return HttpResult{};
    }
    return answer.get();
  };
  auto refused = within("POST", "/v1/environments", "{}");
  EXPECT_GE(refused.status, 500) << refused.body;
  EXPECT_NE(refused.body.find("no room on the disk"), std::string::npos) << refused.body;
  EXPECT_EQ(within("GET", "/healthz").status, 200);
  sql("DROP TRIGGER refuse_environments");
  auto claimed = within("POST", "/v1/environments", "{}");
  ASSERT_EQ(claimed.status, 201) << claimed.body;
  EXPECT_EQ(metricOf(daemon, "moat_warm_pool_claims_total"), 1) << "the pool environment was kept for the next claim";
  std::string id = json::parse(claimed.body)["id"];
  EXPECT_EQ(json::parse(within("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["true"]})").body)["exit_code"],
            0);
}

// One pool per (template, spec): a create claims only from the pool of
// exactly its spec, and the environment it gets has that spec's limits.
TEST(MoatdWarmPool, EachSpecHasItsOwnPoolAndACreateClaimsOnlyItsOwn) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon({"--warm-pool", "1", "--warm-pool", "2:ram_mb=256,pids=128", "--warm-pool", "1:ram_mb=256,pids=128"});
  auto metric = [&](const std::string& name) { return metricOf(daemon, name); };
  auto waitReady = [&](long n) { return waitWarmReady(daemon, n); };
  ASSERT_EQ(waitReady(4), 4) << "1 of the default spec, 2 + 1 of the small one";
  auto small = daemon.request("POST", "/v1/environments", R"({"spec":{"ram_mb":256,"pids":128}})");
  ASSERT_EQ(small.status, 201) << small.body;
  EXPECT_EQ(metric("moat_warm_pool_claims_total"), 1);
  json env = json::parse(small.body);
  EXPECT_EQ(env["spec"]["ram_mb"], 256);
  EXPECT_EQ(env["spec"]["pids"], 128);
  // The claimed environment's cgroup has the small spec's limits.
  auto layout = isolation::cgroup::detectHostLayout();
  ASSERT_TRUE(layout.ok());
  std::string cg = "moat-" + env["id"].get<std::string>();
  bool v2 = layout->version == isolation::cgroup::Version::kV2;
  auto memory = os::readFile(v2 ? layout->v2Parent + "/" + cg + "/memory.max"
                                : layout->v1Parents.at("memory") + "/" + cg + "/memory.limit_in_bytes");
  auto pids = os::readFile((v2 ? layout->v2Parent : layout->v1Parents.at("pids")) + "/" + cg + "/pids.max");
  ASSERT_TRUE(memory.ok() && pids.ok());
  EXPECT_EQ(memory.value(), std::to_string(256ull << 20) + "\n");
  EXPECT_EQ(pids.value(), "128\n");
  // The default spec claims from its own pool; another spec is created fresh.
  ASSERT_EQ(daemon.request("POST", "/v1/environments", "{}").status, 201);
  EXPECT_EQ(metric("moat_warm_pool_claims_total"), 2);
  ASSERT_EQ(daemon.request("POST", "/v1/environments", R"({"spec":{"ram_mb":256}})").status, 201);
  EXPECT_EQ(metric("moat_warm_pool_claims_total"), 2) << "ram_mb 256 with the default pids is not the pool's spec";
  EXPECT_EQ(waitReady(4), 4) << "each pool refills";
  // Per pool (the two small ones are one pool of 3), as resolved.
  auto body = daemon.request("GET", "/metrics").body;
  const std::string small_ =
      R"({template="host",cpus="1",ram_mb="256",storage_gb="4",pids="128",isolation="namespaces"})";
  const std::string default_ =
      R"({template="host",cpus="1",ram_mb="1024",storage_gb="4",pids="1024",isolation="namespaces"})";
  EXPECT_NE(body.find("\nmoat_warm_pool_ready_by_spec" + small_ + " 3\n"), std::string::npos) << body;
  EXPECT_NE(body.find("\nmoat_warm_pool_ready_by_spec" + default_ + " 1\n"), std::string::npos) << body;
  EXPECT_NE(body.find("\nmoat_warm_pool_claims_by_spec_total" + small_ + " 1\n"), std::string::npos) << body;
  EXPECT_NE(body.find("\nmoat_warm_pool_claims_by_spec_total" + default_ + " 1\n"), std::string::npos) << body;
}

// A new environment of `body` and its GET .../stats: read now, or read
// until `done` says the reading is the one awaited (at most 20 s).
class EnvironmentStats {
 public:
  EnvironmentStats(Moatd& daemon, const std::string& body) : daemon_(daemon) {
    auto created = daemon.request("POST", "/v1/environments", body);
    EXPECT_EQ(created.status, 201) << created.body;
    id = json::parse(created.body).value("id", "");
  }
  json read() {
    auto r = daemon_.request("GET", "/v1/environments/" + id + "/stats");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  }
  json until(const std::function<bool(const json&)>& done) {
    json now;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (now = read(); !done(now) && std::chrono::steady_clock::now() < deadline; now = read()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return now;
  }
  std::string id;

 private:
  Moatd& daemon_;
};

// GET .../stats reads the environment's own cgroup: what runs inside moves
// it, and its limits are the environment's spec.
TEST(MoatdStats, WhatRunsInsideMovesItsUseAndTheLimitsAreItsSpec) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon;
  EnvironmentStats stats(daemon, R"({"spec":{"ram_mb":512,"pids":64,"cpus":0.5}})");
  const std::string id = stats.id;
  ASSERT_FALSE(id.empty());
  json before = stats.read();
  EXPECT_EQ(before["memory_limit_bytes"], 512ull << 20);
  EXPECT_EQ(before["pids_limit"], 64);
  EXPECT_EQ(before["cpus"], 0.5);
  EXPECT_GE(before["pids"].get<uint64_t>(), 1u) << "moat-init";
  EXPECT_EQ(before["oom_kills"], 0);
  // CPU time is counted wherever the host can: v2, or v1 with cpuacct.
  auto layout = isolation::cgroup::detectHostLayout();
  ASSERT_TRUE(layout.ok());
  bool cpuCounted = layout->version == isolation::cgroup::Version::kV2 || layout->v1Parents.count("cpuacct") ||
                    os::exists(layout->v1Parents.at("cpu") + "/cpuacct.usage");
  ASSERT_EQ(cpuCounted, !before["cpu_usec"].is_null()) << before.dump();

  // 96 MiB held by a process that stays.
  auto started = daemon.request(
      "POST", "/v1/environments/" + id + "/processes",
      R"J({"cmd":["python3","-c","import time; b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(120)"]})J");
  ASSERT_EQ(started.status, 201) << started.body;
  json held = stats.until([&](const json& s) {
    return s["memory_bytes"].get<uint64_t>() >= before["memory_bytes"].get<uint64_t>() + (90ull << 20);
  });
  EXPECT_GE(held["memory_bytes"].get<uint64_t>(), before["memory_bytes"].get<uint64_t>() + (90ull << 20))
      << before.dump() << " -> " << held.dump();
  EXPECT_GT(held["pids"].get<uint64_t>(), before["pids"].get<uint64_t>());
  if (cpuCounted) {
    auto busy = daemon.request("POST", "/v1/environments/" + id + "/exec",
                               R"({"cmd":["sh","-c","i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"]})");
    ASSERT_EQ(busy.status, 200) << busy.body;
    json after = stats.read();
    EXPECT_GT(after["cpu_usec"].get<uint64_t>(), held["cpu_usec"].get<uint64_t>() + 50000)
        << "a busy loop of ~0.1 s or more: " << held.dump() << " -> " << after.dump();
  }
}

// Storage and network bytes are the host's own counts (the volume's qgroup,
// the egress veth's counters), which nothing inside can set: writes move
// the first, traffic the second, and a link taken away and given back
// (mode none, then open) keeps what the first carried.
TEST(MoatdStats, StorageAndNetworkBytesAreTheHostsCountsAndOutliveALinkTakenAway) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon;
  EnvironmentStats stats(daemon, R"({"spec":{"storage_gb":1},"network":"open"})");
  const std::string id = stats.id;
  ASSERT_FALSE(id.empty());
  // A quiet neighbour, linked too: none of this one's writes or traffic is
  // counted as its own.
  EnvironmentStats neighbour(daemon, R"({"spec":{"storage_gb":1},"network":"open"})");
  ASSERT_FALSE(neighbour.id.empty());
  const json neighbourBefore = neighbour.read();
  const std::string base = "/v1/environments/" + id;
  auto run = [&](const std::string& script) {
    auto r = daemon.request("POST", base + "/exec", json{{"cmd", {"sh", "-c", script}}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
  };
  json before = stats.read();
  EXPECT_EQ(before["storage_limit_bytes"], 1ull << 30);
  ASSERT_TRUE(before["storage_bytes"].is_number()) << before.dump();
  ASSERT_TRUE(before["network_sent_bytes"].is_number()) << before.dump();
  const uint64_t storedBefore = before["storage_bytes"];

  run("head -c 8388608 /dev/urandom > /workspace/blob && sync");  // btrfs counts it at its next commit
  json written = stats.until([&](const json& s) { return s["storage_bytes"] >= storedBefore + (8ull << 20); });
  EXPECT_GE(written["storage_bytes"].get<uint64_t>(), storedBefore + (8ull << 20)) << written.dump();
  run("rm /workspace/blob && sync");
  json removed = stats.until([&](const json& s) { return s["storage_bytes"] < storedBefore + (1ull << 20); });
  EXPECT_LT(removed["storage_bytes"].get<uint64_t>(), storedBefore + (1ull << 20)) << removed.dump();

  // A request to moatd's proxy (refused or failed upstream: bytes either way).
  const std::string talk = "curl -s -m 5 -o /dev/null http://stats.invalid/ || true";
  run(talk);
  json talked = stats.read();
  EXPECT_GT(talked["network_sent_bytes"].get<uint64_t>(), before["network_sent_bytes"].get<uint64_t>());
  EXPECT_GT(talked["network_received_bytes"].get<uint64_t>(), before["network_received_bytes"].get<uint64_t>());
  ASSERT_EQ(daemon.request("PUT", base + "/network", R"({"network":"none"})").status, 200);
  // (At least: the proxy's side of the connection may close a moment later.)
  json cut = stats.read();
  EXPECT_GE(cut["network_sent_bytes"].get<uint64_t>(), talked["network_sent_bytes"].get<uint64_t>())
      << "a detach lost bytes";
  EXPECT_GE(cut["network_received_bytes"].get<uint64_t>(), talked["network_received_bytes"].get<uint64_t>());
  ASSERT_EQ(daemon.request("PUT", base + "/network", R"({"network":"open"})").status, 200);
  run(talk);
  json again = stats.read();
  EXPECT_GT(again["network_sent_bytes"].get<uint64_t>(), cut["network_sent_bytes"].get<uint64_t>());
  EXPECT_GT(again["network_received_bytes"].get<uint64_t>(), cut["network_received_bytes"].get<uint64_t>());
  const json neighbourAfter = neighbour.read();
  for (const char* key : {"network_sent_bytes", "network_received_bytes"}) {
    EXPECT_EQ(neighbourAfter[key], neighbourBefore[key]) << key << ": another's traffic counted as the neighbour's";
  }
  EXPECT_LT(neighbourAfter["storage_bytes"].get<uint64_t>(),
            neighbourBefore["storage_bytes"].get<uint64_t>() + (1ull << 20))
      << "another's writes counted as the neighbour's";
  auto metrics = daemon.request("GET", "/metrics");
  EXPECT_NE(metrics.body.find("moat_environment_network_sent_bytes_total{id=\"" + id + "\"} "), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("moat_environment_network_received_bytes_total{id=\"" + id + "\"} "), std::string::npos);
  EXPECT_NE(metrics.body.find("moat_environment_storage_bytes{id=\"" + id + "\"} "), std::string::npos);
  EXPECT_NE(metrics.body.find("moat_environment_storage_limit_bytes{id=\"" + id + "\"} 1073741824\n"),
            std::string::npos);
}

TEST(MoatdCapacity, MaxEnvironmentsIsAFlagAndEnvironmentsKeepTheUsualOpenFilesLimit) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon({"--max-environments", "2"});
  const std::string spec = R"({"spec":{"ram_mb":64}})";
  auto first = daemon.request("POST", "/v1/environments", spec);
  ASSERT_EQ(first.status, 201) << first.body;
  ASSERT_EQ(daemon.request("POST", "/v1/environments", spec).status, 201);
  auto third = daemon.request("POST", "/v1/environments", spec);
  EXPECT_EQ(third.status, 429) << third.body;
  EXPECT_EQ(json::parse(third.body)["error"]["code"], "capacity");
  std::string id = json::parse(first.body)["id"];
  EXPECT_EQ(daemon.request("DELETE", "/v1/environments/" + id).status, 204);
  EXPECT_EQ(daemon.request("POST", "/v1/environments", spec).status, 201);
  // moatd and its spawner raise their own soft limit; environments get the
  // one moatd was started with (this test's).
  struct rlimit files;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  auto listed = json::parse(daemon.request("GET", "/v1/environments").body);
  std::string live = listed["environments"][0]["id"];
  auto r = daemon.request("POST", "/v1/environments/" + live + "/exec", R"({"cmd":["sh","-c","ulimit -n"]})");
  EXPECT_EQ(json::parse(r.body)["stdout"], std::to_string(files.rlim_cur) + "\n");
}

// moatd serves at most --max-connections clients at once. An idle one makes
// room for a newcomer; with every one busy (here two shells' WebSockets) a
// newcomer is told to retry (503, counted in /metrics), and once one is
// free moatd serves again.
TEST(MoatdCapacity, BeyondMaxConnectionsTheIdleMakeRoomAndWithAllBusyANewcomerIsToldToRetry) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon({"--max-connections", "2"});
  auto created = daemon.request("POST", "/v1/environments", R"({"spec":{"ram_mb":64}})");
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string shell = "/v1/environments/" + json::parse(created.body)["id"].get<std::string>() + "/shell";
  HttpConnection idle(daemon.socketPath());
  ASSERT_EQ(idle.request("GET", "/healthz", daemon.token()).status, 200);
  // A connection whose answer has reached its client is busy until its
  // thread has marked it idle, a moment later (longer in a sanitized build
  // on a loaded machine): a shell refused then is told to retry, and does.
  int refused = 0;
  auto openShell = [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      auto u = daemon.websocket(shell);
      if (u.status != 503 || std::chrono::steady_clock::now() > until) return u;
      ::close(u.fd);
      ++refused;
    }
  };
  auto a = openShell();
  ASSERT_EQ(a.status, 101) << a.rest;
  auto b = openShell();  // takes the idle connection's place
  ASSERT_EQ(b.status, 101) << b.rest;
  EXPECT_ANY_THROW(idle.request("GET", "/healthz", daemon.token())) << "the idle connection was closed";
  // moatd answers a connection it refuses at once and closes it unread: the
  // request's write may find it closed, and the answer is read all the same.
  auto onANewConnection = [&](const std::string& target) {
    HttpConnection c(daemon.socketPath());
    try {
      return c.request("GET", target, daemon.token());
    } catch (const std::exception&) {
      return c.raw("");
    }
  };
  for (int i = 0; i < 3; ++i) {
    auto r = onANewConnection("/healthz");
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_NE(r.body.find("too many connections; retry later"), std::string::npos) << r.body;
    refused += r.status == 503;
  }
  ::close(a.fd);  // one shell's viewer goes: its connection is free again
  HttpResult served;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    served = onANewConnection("/metrics");
    if (served.status != 503) break;
    ++refused;
  }
  ASSERT_EQ(served.status, 200) << served.body;
  EXPECT_NE(served.body.find("moat_api_errors_total{code=\"unavailable\"} " + std::to_string(refused) + "\n"),
            std::string::npos)
      << "every refused connection counted: " << refused << "\n"
      << served.body;
  ::close(b.fd);
}

// After a refusal moatd drops what the client still sends (so that it can
// read the answer; MoatdApi.ARefusedUploadStillGetsItsAnswer), but such a
// connection counts as idle: one that never stops sending holds no place a
// newcomer needs.
TEST(MoatdCapacity, ARefusedClientThatKeepsSendingMakesRoomLikeAnIdleOne) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon({"--max-connections", "1"});
  const std::string head =
      "PUT /v1/environments/abcdefabcdef/files?path=/x HTTP/1.1\r\nHost: moatd\r\n"
      "Authorization: Bearer not-a-token\r\nContent-Length: 10000000\r\n\r\n";
  // The fixture's own readiness request may still hold the one place for a
  // moment: a connection refused then (503, closed) is tried again.
  int fd = -1;
  std::string answer;
  auto connectBy = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    if (fd >= 0) {
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    fd = connectUnix(daemon.socketPath());
    ASSERT_GE(fd, 0);
    struct timeval wait = {10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    char buf[4096];
    ssize_t n = ::send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size())
                    ? ::recv(fd, buf, sizeof buf, 0)
                    : -1;
    answer = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  } while (answer.compare(0, 12, "HTTP/1.1 401") != 0 && std::chrono::steady_clock::now() < connectBy);
  ASSERT_EQ(answer.substr(0, 12), "HTTP/1.1 401") << answer;
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    const std::string drip(1024, 'x');
    while (!stop && ::send(fd, drip.data(), drip.size(), MSG_NOSIGNAL) > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  // The answer can reach the client a moment before moatd marks the
  // connection idle: a newcomer then is told to retry, and does.
  HttpResult r;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    HttpConnection newcomer(daemon.socketPath());
    try {
      r = newcomer.request("GET", "/healthz", daemon.token());
    } catch (const std::exception&) {
      r = newcomer.raw("");
    }
  } while (r.status == 503 && std::chrono::steady_clock::now() < deadline &&
           (std::this_thread::sleep_for(std::chrono::milliseconds(20)), true));
  stop = true;
  sender.join();
  ::close(fd);
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(MoatdCapacity, AKeyBeyondItsRateWaitsItsTurnOrIsToldWhenToComeBackAndKeepsItsConnection) {
  MOAT_REQUIRE_ROOT();
  // 1 request per second, bursts of 2, a turn at most 2 s away.
  Moatd daemon({"--key-rate", "1"});
  auto keyToken = [&daemon] {
    auto r = daemon.request("POST", "/v1/keys", R"({"scopes":["read"]})");
    EXPECT_EQ(r.status, 201) << r.body;
    return json::parse(r.body)["token"].get<std::string>();
  };
  const std::string flooder = keyToken(), neighbour = keyToken();
  // Eight at once: two go through, two wait their turn (1 s and 2 s), the
  // rest would wait longer and are refused with when to come back.
  constexpr int kAtOnce = 8;
  std::vector<std::unique_ptr<HttpConnection>> connections;
  for (int i = 0; i < kAtOnce; ++i) connections.push_back(std::make_unique<HttpConnection>(daemon.socketPath()));
  std::vector<HttpResult> results(kAtOnce);
  std::vector<std::thread> threads;
  for (int i = 0; i < kAtOnce; ++i) {
    threads.emplace_back([&, i] {
      try {
        results[i] = connections[i]->request("GET", "/v1/environments", flooder);
      } catch (const std::exception& e) {
        results[i].body = e.what();  // status 0: fails the checks below, not the whole test binary
      }
    });
  }
  for (auto& t : threads) t.join();
  int answered = 0;
  int refused = -1;
  for (int i = 0; i < kAtOnce; ++i) {
    if (results[i].status == 200) {
      ++answered;
      continue;
    }
    ASSERT_EQ(results[i].status, 429) << results[i].body;
    EXPECT_EQ(json::parse(results[i].body)["error"]["code"], "capacity");
    EXPECT_NE(results[i].body.find("--key-rate"), std::string::npos) << results[i].body;
    ASSERT_FALSE(results[i].retryAfter.empty());
    EXPECT_GE(std::stoi(results[i].retryAfter), 1);
    EXPECT_TRUE(results[i].keepAlive) << "a refused request without a large body keeps its connection";
    refused = i;
  }
  EXPECT_GE(answered, 2);
  // Each second of the test lets one more through; all eight never are.
  EXPECT_LE(answered, 5);
  ASSERT_GE(refused, 0) << "none of " << kAtOnce << " requests at once was refused";
  // Another key has a bucket of its own, and the master token has none.
  EXPECT_EQ(HttpConnection(daemon.socketPath()).request("GET", "/v1/environments", neighbour).status, 200);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(daemon.request("GET", "/v1/environments").status, 200);
  // The refused request's connection still serves: the last waiter's turn
  // has passed (the threads joined after it), so the next one's turn is at
  // most a second away and it waits for it.
  EXPECT_EQ(connections[refused]->request("GET", "/v1/environments", flooder).status, 200);
  // A bad value is named.
  auto bad = runProcess({binDir() + "/moatd", "--key-rate", "fast"});
  EXPECT_EQ(bad.exitCode, 1);
  EXPECT_NE(bad.err.find("--key-rate needs a number"), std::string::npos) << bad.err;
}

// Every numeric flag refuses what is not a number in its range, by name,
// before moatd touches anything.
// What moatd left of itself on `stateDir`: processes whose command line
// names it (a spawner is a fork of moatd's), mounts under it (the egress
// namespace).
std::vector<std::string> leftOf(const std::string& stateDir) {
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    auto cmdline = os::readFile("/proc/" + pid + "/cmdline");
    if (!cmdline.ok()) continue;
    std::string text = cmdline.value();
    for (char& c : text) c = c == '\0' ? ' ' : c;
    if (text.find(stateDir) != std::string::npos) left.push_back("process " + pid + ": " + text);
  }
  auto mounts = os::readFile("/proc/self/mountinfo", 16 << 20);
  std::istringstream lines(mounts.ok() ? mounts.value() : "");
  for (std::string line; std::getline(lines, line);) {
    if (line.find(stateDir) != std::string::npos) left.push_back("mount: " + line);
  }
  return left;
}

// A moatd whose start fails after its spawner and egress namespace exist
// (its address in use; microVMs asked for on a host without them) says why
// and leaves neither behind.
TEST(MoatdStart, AStartThatFailsLeavesNoSpawnerAndNoEgressNamespace) {
  if (!isRoot()) GTEST_SKIP() << "needs root: moatd creates namespaces, cgroups and mounts (CI runs as root)";
  UniqueFd held(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof at;
  ASSERT_EQ(::bind(held.get(), reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
  ASSERT_EQ(::listen(held.get(), 1), 0);
  ASSERT_EQ(::getsockname(held.get(), reinterpret_cast<sockaddr*>(&at), &length), 0);
  const std::string inUse = "127.0.0.1:" + std::to_string(ntohs(at.sin_port));
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"MOAT_STORAGE_GB=8", "--listen", inUse}, "Address already in use"},
      {{"MOAT_STORAGE_GB=8", "MOAT_GUEST_KERNEL=/nonexistent/vmlinuz", "--listen", "127.0.0.1:0", "--isolation",
        "microvm"},
       "this host runs no microVMs"},
  };
  for (const auto& c : cases) {
    char dir[] = "/tmp/moatd-start-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    const std::string state = std::string(dir) + "/state";
    // env(1) sets moatd's variables and a PATH with the sbin directories.
    std::vector<std::string> argv = {"/usr/bin/env",
                                     "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
    std::vector<std::string> flags;
    for (const auto& a : c.args) (a.find('=') != std::string::npos && a[0] != '-' ? argv : flags).push_back(a);
    argv.push_back(binDir() + "/moatd");
    argv.push_back("--state");
    argv.push_back(state);
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto r = runProcess(argv);
    EXPECT_EQ(r.exitCode, 1) << c.says << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(leftOf(state), std::vector<std::string>{}) << c.says;
    (void)os::removeTree(dir);
  }
}

// A second signal while moatd stops (make run's Ctrl-C, then its script's
// TERM) hurries the stop but does not abandon it: the spawner destroys the
// environments and exits, the egress namespace goes.
// /metrics: a series per running environment, labelled by id, of those the
// caller sees: a key's scrape names its own environments and no other's.
TEST_F(MoatdApi, MetricsHaveEachRunningEnvironmentTheCallerSees) {
  std::string mine = createEnv();
  auto key = daemon_->request("POST", "/v1/keys", R"({"scopes": ["create", "read"]})");
  ASSERT_EQ(key.status, 201) << key.body;
  std::string token = nlohmann::json::parse(key.body)["token"];
  auto theirs = daemon_->request("POST", "/v1/environments", "{}", false, {{"Authorization", "Bearer " + token}});
  ASSERT_EQ(theirs.status, 201) << theirs.body;
  std::string keys = nlohmann::json::parse(theirs.body)["id"];
  auto all = daemon_->request("GET", "/metrics");
  ASSERT_EQ(all.status, 200);
  for (const std::string& id : {mine, keys}) {
    EXPECT_NE(all.body.find("moat_environment_memory_bytes{id=\"" + id + "\"} "), std::string::npos) << all.body;
    EXPECT_NE(all.body.find("moat_environment_memory_limit_bytes{id=\"" + id + "\"} "), std::string::npos);
    EXPECT_NE(all.body.find("moat_environment_pids{id=\"" + id + "\"} "), std::string::npos);
  }
  EXPECT_NE(all.body.find("moat_environment_series_omitted 0\n"), std::string::npos);
  EXPECT_EQ(all.body.find("e+"), std::string::npos) << "a number in scientific notation: " << all.body;
  auto own = daemon_->request("GET", "/metrics", "", false, {{"Authorization", "Bearer " + token}});
  ASSERT_EQ(own.status, 200) << own.body;
  EXPECT_NE(own.body.find("{id=\"" + keys + "\"}"), std::string::npos) << own.body;
  EXPECT_EQ(own.body.find("{id=\"" + mine + "\"}"), std::string::npos) << "a key saw another's environment";
}

// --log-format json: every line moatd writes is one JSON object; with
// --access-log one of them per request, with its status, duration and
// caller, never the query or the token. --log-level warn leaves out info.
TEST(MoatdLog, JsonLinesAndAnAccessLineForEveryRequest) {
  if (!isRoot()) GTEST_SKIP() << "needs root: moatd creates namespaces, cgroups and mounts (CI runs as root)";
  std::vector<nlohmann::json> lines;
  {
    Moatd daemon({"--log-format", "json", "--access-log"});
    EXPECT_EQ(daemon.request("GET", "/healthz", "", false).status, 200);
    auto created = daemon.request("POST", "/v1/environments", "{}");
    ASSERT_EQ(created.status, 201) << created.body;
    std::string id = nlohmann::json::parse(created.body)["id"];
    EXPECT_EQ(daemon.request("GET", "/v1/environments/" + id + "/files?path=/secret-name-in-query").status, 404);
    EXPECT_EQ(daemon.request("GET", "/v1/environments", "", false, {{"Authorization", "Bearer wrong"}}).status, 401);
    daemon.stop();
    std::string log = daemon.log();
    EXPECT_EQ(log.find(daemon.token()), std::string::npos) << "the master token in the log";
    EXPECT_EQ(log.find("secret-name-in-query"), std::string::npos) << "a query in the log: " << log;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      ASSERT_TRUE(j.is_object()) << "not a JSON line: " << line;
      EXPECT_TRUE(j["time"].is_string() && j["level"].is_string() && j["msg"].is_string()) << line;
      lines.push_back(j);
    }
  }
  auto access = [&](const std::string& method, const std::string& prefix, int status) -> nlohmann::json {
    for (const auto& j : lines) {
      if (j.value("kind", "") == "access" && j["method"] == method && j["status"] == status &&
          j["path"].get<std::string>().rfind(prefix, 0) == 0) {
        return j;
      }
    }
    return nullptr;
  };
  auto health = access("GET", "/healthz", 200);
  ASSERT_TRUE(health.is_object()) << "no access line for /healthz";
  EXPECT_EQ(health["caller"], "-");
  EXPECT_NE(health["peer"].get<std::string>().find("unix"), std::string::npos) << health;
  auto create = access("POST", "/v1/environments", 201);
  ASSERT_TRUE(create.is_object()) << "no access line for the create";
  EXPECT_EQ(create["caller"], "master");
  EXPECT_TRUE(create["duration_ms"].is_number()) << create;
  auto missing = access("GET", "/v1/environments/", 404);
  ASSERT_TRUE(missing.is_object());
  EXPECT_EQ(missing["path"].get<std::string>().find('?'), std::string::npos) << missing;
  EXPECT_TRUE(access("GET", "/v1/environments", 401).is_object()) << "a refused request has its line too";
  bool serving = false;
  for (const auto& j : lines)
    serving = serving || (j["level"] == "info" && j["msg"].get<std::string>().rfind("serving", 0) == 0);
  EXPECT_TRUE(serving) << "the start's info line";

  // Without the board too; and in text, a path with a newline (decoded from
  // %0A, the client's to choose) forges no line of moatd's.
  Moatd plain({"--no-board", "--access-log"});
  EXPECT_EQ(plain.request("GET", "/v1/x%0Amoatd:%20forged", "", false).status, 401);
  plain.stop();
  EXPECT_NE(plain.log().find("moatd: access GET /v1/x\\x0amoatd: forged 401"), std::string::npos) << plain.log();
  EXPECT_EQ(plain.log().find("\nmoatd: forged"), std::string::npos) << plain.log();

  // warn and above only; no access lines without --access-log.
  Moatd quiet({"--log-level", "warn"});
  EXPECT_EQ(quiet.request("GET", "/healthz", "", false).status, 200);
  quiet.stop();
  EXPECT_EQ(quiet.log().find("serving"), std::string::npos) << quiet.log();
  EXPECT_EQ(quiet.log().find("access"), std::string::npos) << quiet.log();
}

TEST(MoatdStop, ASecondSignalHurriesTheStopAndLeavesNothingBehind) {
  if (!isRoot()) GTEST_SKIP() << "needs root: moatd creates namespaces, cgroups and mounts (CI runs as root)";
  Moatd daemon;
  auto created = daemon.request("POST", "/v1/environments", R"({"network": "open"})");
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string id = nlohmann::json::parse(created.body)["id"];
  auto started = daemon.request("POST", "/v1/environments/" + id + "/processes", R"({"cmd": ["sleep", "600"]})");
  ASSERT_EQ(started.status, 201) << started.body;
  const std::string state = daemon.stateDir();
  // Two different signals: both are pending at once, one for each sigwait.
  ASSERT_EQ(::kill(daemon.pid(), SIGINT), 0);
  ASSERT_EQ(::kill(daemon.pid(), SIGTERM), 0);
  const int status = daemon.waitExit();
  EXPECT_TRUE(WIFEXITED(status)) << status;
  // The storage pool stays mounted, as after any stop (templates and
  // snapshots live in it); nothing else may.
  auto left = [&] {
    auto all = leftOf(state);
    std::erase_if(all, [&](const std::string& l) { return l.find(" " + state + "/storage") != std::string::npos; });
    return all;
  };
  for (int i = 0; i < 200 && !left().empty(); ++i) ::usleep(25000);  // bounded: the spawner exits right after its reply
  EXPECT_EQ(left(), std::vector<std::string>{});
  EXPECT_NE(daemon.log().find("again, ending now (the spawner destroys the environments)"), std::string::npos)
      << daemon.log();
}

TEST(MoatdFlags, ANumberOutOfRangeOrNotANumberIsRefusedByName) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"--warm-pool",
       {"-1", "10000", "four", "", "2:ram_mb=8", "2:bogus=1", "2:cpus=fast", "2:pids=1.5", "2:template=Relative/dir",
        "2:template=/nonexistent", "2:ram_mb", "2:", "2:cpus=1,cpus=2"}},
      {"--max-environments", {"0", "100001", "1e3"}},
      {"--max-connections", {"0", "100001", "many", "99999999999"}},
      {"--key-rate", {"100001", "fast"}},
      {"--approval-timeout", {"0", "86401", "2m"}},
      {"--lossless-wait", {"0", "86401", "30s"}},
      {"--back-to-disk-after", {"0", "86401", "1m"}},
      {"--audit-retention-days", {"36501", "forever"}},
      {"--audit-max-events", {"999", "1000000001", " 1000"}},
      {"--egress-head-timeout", {"0", "3601", "30s"}},
  };
  for (const auto& [flag, values] : cases) {
    for (const auto& value : values) {
      auto r = runProcess({binDir() + "/moatd", "--state", "/nonexistent/moat", flag, value});
      EXPECT_EQ(r.exitCode, 1) << flag << " " << value;
      EXPECT_NE(r.err.find(flag + " needs"), std::string::npos) << flag << " '" << value << "': " << r.err;
    }
  }
}

TEST(MoatdCapacity, RequestsWaitingTheirTurnAreCountedAndNotLetThroughWhenMoatdStops) {
  MOAT_REQUIRE_ROOT();
  Moatd daemon({"--key-rate", "1"});  // bursts of 2; the next turns are 1 s and 2 s away
  auto created = daemon.request("POST", "/v1/keys", R"({"scopes":["read"]})");
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string key = json::parse(created.body)["token"];
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(HttpConnection(daemon.socketPath()).request("GET", "/v1/environments", key).status, 200);
  }
  std::vector<std::unique_ptr<HttpConnection>> connections;
  for (int i = 0; i < 2; ++i) connections.push_back(std::make_unique<HttpConnection>(daemon.socketPath()));
  std::vector<HttpResult> results(2);
  std::vector<std::thread> waiting;
  for (int i = 0; i < 2; ++i) {
    waiting.emplace_back([&, i] {
      try {
        results[i] = connections[i]->request("GET", "/v1/environments", key);
      } catch (const std::exception& e) {
        results[i].body = e.what();
      }
    });
  }
  // Both are waiting in moatd before it is told to stop (their turns are a
  // second and more away; the master token's /metrics is not limited).
  auto waitingNow = [&daemon] { return metricOf(daemon, "moat_api_requests_waiting"); };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(900);
  while (waitingNow() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(waitingNow(), 2) << "both requests should be waiting for their turn";
  daemon.stop();  // also fails this test unless moatd exits 0
  for (auto& t : waiting) t.join();
  // Neither was let through: each got 503 "moatd is stopping" (the server
  // lets a busy connection write its answer before it closes it).
  for (const auto& r : results) {
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_NE(r.body.find("moatd is stopping"), std::string::npos) << r.status << " " << r.body;
  }
}

TEST_F(MoatdApi, TemplatesCannotExposeTheHostToKeysOrTheStateToAnyone) {
  json key = call("POST", "/v1/keys", {{"scopes", {"create", "read", "files"}}}, 201);
  auto asKey = daemon_->request("POST", "/v1/environments", json{{"template", daemon_->stateDir()}}.dump(), false,
                                {{"Authorization", "Bearer " + key["token"].get<std::string>()}});
  EXPECT_EQ(asKey.status, 403) << asKey.body;
  EXPECT_EQ(json::parse(asKey.body)["error"]["field"], "template");
  // Not even the master may show the state directory (tokens, keys, volumes).
  createEnv();  // so that <state>/templates exists
  for (const std::string& t : {daemon_->stateDir(), daemon_->stateDir() + "/templates", std::string("/tmp")}) {
    auto r = daemon_->request("POST", "/v1/environments", json{{"template", t}}.dump());
    EXPECT_EQ(r.status, 400) << t << " -> " << r.body;
    EXPECT_NE(r.body.find("state directory"), std::string::npos) << r.body;
  }
}

TEST_F(MoatdApi, UnauthenticatedBodiesAreRefusedBeforeTheyAreRead) {
  auto r = daemon_->request("PUT", "/v1/environments/000000000000/files?path=/x", std::string(64u << 10, 'x'), false);
  EXPECT_EQ(r.status, 401);
  auto big = daemon_->request("POST", "/v1/environments", std::string(3u << 20, ' '));
  EXPECT_EQ(big.status, 413);
  // A small refused body is read and dropped, so the connection goes on...
  HttpConnection c(daemon_->socketPath());
  auto small = c.raw(
      "POST /v1/environments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
      "Content-Length: 5\r\n\r\nhello");
  EXPECT_EQ(small.status, 401);
  EXPECT_TRUE(small.keepAlive);
  EXPECT_EQ(c.request("GET", "/v1/environments", daemon_->token()).status, 200);
  // ...but a client waiting for "100 Continue" before its body is answered at
  // once, and one that declares a large body is not read: both connections close.
  HttpConnection waiting(daemon_->socketPath());
  auto expect = waiting.raw(
      "PUT /v1/environments/000000000000/files?path=/x HTTP/1.1\r\nHost: x\r\n"
      "Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n");
  EXPECT_EQ(expect.status, 401);
  EXPECT_FALSE(expect.keepAlive);
  HttpConnection large(daemon_->socketPath());
  auto declared = large.raw(
      "PUT /v1/environments/000000000000/files?path=/x HTTP/1.1\r\nHost: x\r\n"
      "Content-Length: 10000000\r\n\r\n");
  EXPECT_EQ(declared.status, 401);
  EXPECT_FALSE(declared.keepAlive);
  // A body framed other than by Content-Length or chunked would be read as
  // the next request: refused, and the connection closed.
  HttpConnection framed(daemon_->socketPath());
  auto gzip = framed.raw("POST /v1/environments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + daemon_->token() +
                         "\r\nTransfer-Encoding: gzip\r\n\r\nGET /v1/environments HTTP/1.1\r\n\r\n");
  EXPECT_EQ(gzip.status, 400) << gzip.body;
  EXPECT_NE(gzip.body.find("Transfer-Encoding"), std::string::npos) << gzip.body;
  EXPECT_FALSE(gzip.keepAlive);
}

TEST_F(MoatdApi, DeleteDuringCreateLeavesAConsistentState) {
  for (int round = 0; round < 5; ++round) {
    std::string before = call("GET", "/v1/environments", nullptr, 200).dump();
    HttpResult created;
    std::thread creator([&] { created = daemon_->request("POST", "/v1/environments", "{}"); });
    // Whatever id shows up first gets deleted while it may still be creating.
    std::string id;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (id.empty() && std::chrono::steady_clock::now() < deadline) {
      json list = json::parse(daemon_->request("GET", "/v1/environments?state=creating").body);
      if (!list["environments"].empty()) id = list["environments"][0]["id"];
      if (id.empty()) {
        json running = json::parse(daemon_->request("GET", "/v1/environments?state=running").body);
        if (!running["environments"].empty()) id = running["environments"][0]["id"];
      }
    }
    ASSERT_FALSE(id.empty());
    auto deleted = daemon_->request("DELETE", "/v1/environments/" + id);
    creator.join();
    EXPECT_EQ(deleted.status, 204);
    json env = call("GET", "/v1/environments/" + id, nullptr, 200);
    EXPECT_EQ(env["state"], "gone") << "create said " << created.status << " " << created.body;
    auto late = daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["true"]})");
    EXPECT_EQ(late.status, 409);
  }
  // Nothing was left reserved: environments can still be made.
  std::string fresh = createEnv();
  EXPECT_EQ(exec(fresh, {{"cmd", {"true"}}})["exit_code"], 0);
}

TEST_F(MoatdApi, SigtermEndsWaitingExecsAndStopsPromptly) {
  std::string id = createEnv();
  HttpResult longExec;
  std::thread waiter([&] {
    try {
      longExec = daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["sleep","1000"]})");
    } catch (const std::exception&) {
      longExec.status = -1;  // the connection closed: also an end
    }
  });
  // The exec is running once a sleep shows up in the environment.
  ASSERT_TRUE(waitForProcess(id, "sleep"));
  auto start = std::chrono::steady_clock::now();
  ::kill(daemon_->pid(), SIGTERM);
  int exited = daemon_->waitExit();
  EXPECT_TRUE(WIFEXITED(exited) && WEXITSTATUS(exited) == 0) << "moatd's wait status after SIGTERM: " << exited;
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  // An answer that says why, not a connection cut under it.
  EXPECT_NE(longExec.status, -1) << "the exec's connection was closed before its answer";
  EXPECT_NE(longExec.status, 200);
  EXPECT_NE(longExec.body.find("shutting down"), std::string::npos) << longExec.status << " " << longExec.body;
  EXPECT_FALSE(longExec.keepAlive) << "an answer written while moatd stops says it closes the connection";
  daemon_->restart();
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "gone");
}

// SIGTERM while moatd writes a large answer to a client that has not read it
// yet: the answer still arrives whole (a busy connection may finish), while
// an idle connection is closed at once.
TEST_F(MoatdApi, SigtermLetsAnAnswerBeingWrittenArriveWhole) {
  std::string id = createEnv();
  constexpr size_t kOut = 8u << 20;  // far beyond a socket's buffer: moatd blocks writing it
  int busy = connectUnix(daemon_->socketPath());
  int idle = connectUnix(daemon_->socketPath());
  ASSERT_GE(busy, 0);
  ASSERT_GE(idle, 0);
  struct timeval wait = {30, 0};
  ::setsockopt(busy, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  std::string body = json{
      {"cmd", {"sh", "-c", "head -c " + std::to_string(kOut) + " /dev/zero | tr '\\0' a"}},
      {"output_limit",
       kOut}}.dump();
  std::string request =
      "POST /v1/environments/" + id + "/exec HTTP/1.1\r\nHost: moatd\r\nAuthorization: Bearer " + daemon_->token() +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(busy, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  struct pollfd started = {busy, POLLIN, 0};
  ASSERT_EQ(::poll(&started, 1, 30000), 1) << "no answer started";
  ::kill(daemon_->pid(), SIGTERM);
  // The server is stopping once it has closed the idle connection.
  struct pollfd closed = {idle, POLLIN, 0};
  ASSERT_EQ(::poll(&closed, 1, 10000), 1) << "the idle connection was not closed";
  char c;
  EXPECT_EQ(::recv(idle, &c, 1, 0), 0);
  std::string answer;
  char buf[65536];
  for (ssize_t n; (n = ::recv(busy, buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<size_t>(n));
  ::close(busy);
  ::close(idle);
  int exited = daemon_->waitExit();
  EXPECT_TRUE(WIFEXITED(exited) && WEXITSTATUS(exited) == 0) << "moatd's wait status after SIGTERM: " << exited;
  auto headEnd = answer.find("\r\n\r\n");
  ASSERT_NE(headEnd, std::string::npos) << answer.substr(0, 200);
  EXPECT_EQ(answer.compare(0, 12, "HTTP/1.1 200"), 0) << answer.substr(0, 200);
  auto j = json::parse(answer.substr(headEnd + 4), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "the answer was cut after " << answer.size() << " bytes";
  EXPECT_EQ(j["stdout"].get<std::string>(), std::string(kOut, 'a'));
}

// A client that sends its whole request before it reads (Python's
// http.client does) must get the refusal, not a reset: moatd answers before
// the body and must not close with the body unread under it.
TEST_F(MoatdApi, ARefusedUploadStillGetsItsAnswer) {
  constexpr size_t kBody = 64u << 20;  // beyond the body limit and far beyond a socket's buffer
  const std::string chunk(1u << 20, 'x');
  for (const std::string& token : {std::string("not-a-token"), daemon_->token()}) {
    int fd = connectUnix(daemon_->socketPath());
    ASSERT_GE(fd, 0);
    struct timeval wait = {30, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait);
    std::string head =
        "PUT /v1/environments/abcdefabcdef/files?path=/big HTTP/1.1\r\nHost: moatd\r\n"
        "Authorization: Bearer " +
        token + "\r\nContent-Length: " + std::to_string(kBody) + "\r\n\r\n";
    ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
    size_t sent = 0;
    while (sent < kBody) {
      ssize_t n = ::send(fd, chunk.data(), std::min(chunk.size(), kBody - sent), MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    EXPECT_EQ(sent, kBody) << "sending the body failed: " << std::strerror(errno);
    std::string answer;
    char buf[65536];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<size_t>(n));
    ::close(fd);
    EXPECT_TRUE(answer.compare(0, 12, "HTTP/1.1 413") == 0 || answer.compare(0, 12, "HTTP/1.1 401") == 0)
        << "answer: '" << answer.substr(0, 200) << "' (" << std::strerror(errno) << ")";
    EXPECT_NE(answer.find("\"error\""), std::string::npos) << answer.substr(0, 200);
  }
  EXPECT_EQ(daemon_->request("GET", "/healthz").status, 200) << "moatd keeps serving";
}

TEST_F(MoatdApi, ASecondMoatdOnTheSameStateRefusesToStart) {
  auto r = runProcess({binDir() + "/moatd", "--state", daemon_->stateDir(), "--listen", "127.0.0.1:0"});
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.err.find("another moatd"), std::string::npos) << r.err;
  EXPECT_EQ(exec(createEnv(), {{"cmd", {"true"}}})["exit_code"], 0) << "the first one is unharmed";
}

TEST_F(MoatdApi, KillNineDuringAnExecLosesNothing) {
  std::string id = createEnv();
  std::thread waiter([&] {
    try {
      (void)daemon_->request("POST", "/v1/environments/" + id + "/exec",
                             R"({"cmd":["sh","-c","sleep 2; echo finished > /workspace/done"]})");
    } catch (const std::exception&) {
      // the daemon dies under this request: its connection breaks
    }
  });
  ASSERT_TRUE(waitForProcess(id, "sleep"));
  daemon_->kill9();
  waiter.join();
  daemon_->restart();
  EXPECT_EQ(call("GET", "/v1/environments/" + id, nullptr, 200)["state"], "running");
  // The command went on without moatd and did its work.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string done;
  while (done.empty() && std::chrono::steady_clock::now() < deadline) {
    auto r = daemon_->request("GET", "/v1/environments/" + id + "/files?path=/workspace/done");
    if (r.status == 200) done = r.body;
  }
  EXPECT_EQ(done, "finished\n");
}

TEST_F(MoatdApi, DestroyDuringExecEndsTheExecCleanly) {
  std::string id = createEnv();
  HttpResult longExec;
  std::thread waiter(
      [&] { longExec = daemon_->request("POST", "/v1/environments/" + id + "/exec", R"({"cmd":["sleep","1000"]})"); });
  ASSERT_TRUE(waitForProcess(id, "sleep"));
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204);
  waiter.join();
  EXPECT_EQ(longExec.status, 409) << longExec.body;
  EXPECT_NE(longExec.body.find("the environment was destroyed"), std::string::npos) << longExec.body;
  EXPECT_EQ(exec(createEnv(), {{"cmd", {"true"}}})["exit_code"], 0) << "the daemon keeps serving";
}

TEST_F(MoatdApi, AKilledMoatdLosesNothingTheNextOneReattaches) {
  std::string id = createEnv();
  std::string files = "/v1/environments/" + id + "/files";
  ASSERT_EQ(daemon_->request("PUT", files + "?path=/workspace/notes.txt", "written before the crash").status, 200);
  exec(id, {{"cmd", {"sh", "-c", "nohup sleep 300 >/dev/null 2>&1 & echo $! > /workspace/bg.pid"}}});
  daemon_->kill9();
  daemon_->restart();
  json env = call("GET", "/v1/environments/" + id, nullptr, 200);
  EXPECT_EQ(env["state"], "running") << env.dump();
  EXPECT_EQ(daemon_->request("GET", files + "?path=/workspace/notes.txt").body, "written before the crash");
  // The background process started before the crash is still alive.
  json alive = exec(id, {{"cmd", {"sh", "-c", "kill -0 $(cat /workspace/bg.pid) && echo alive"}}});
  EXPECT_EQ(alive["stdout"], "alive\n") << alive.dump();
  // And the new daemon creates environments as before.
  std::string fresh = createEnv();
  EXPECT_EQ(exec(fresh, {{"cmd", {"true"}}})["exit_code"], 0);
}

TEST_F(MoatdApi, Sigusr1LeavesEnvironmentsRunningForTheNextMoatd) {
  std::string id = createEnv();
  exec(id, {{"cmd", {"sh", "-c", "echo kept > /workspace/k"}}});
  ::kill(daemon_->pid(), SIGUSR1);
  int exited = daemon_->waitExit();
  EXPECT_TRUE(WIFEXITED(exited) && WEXITSTATUS(exited) == 0) << "moatd's wait status after SIGUSR1: " << exited;
  daemon_->restart();
  EXPECT_EQ(exec(id, {{"cmd", {"cat", "/workspace/k"}}})["stdout"], "kept\n");
}

TEST_F(MoatdApi, TheEnvironmentsOfMcpSessionsAKilledMoatdHeldAreDestroyedByTheNextOne) {
  // An MCP session over moatd's /mcp lives in moatd: killed, its session is
  // gone, and so must its default environment be (not left to its TTL). An
  // environment a `moat mcp` (stdio) session made is that process's to end.
  const std::map<std::string, std::string> mcp = {{"Accept", "application/json, text/event-stream"},
                                                  {"Content-Type", "application/json"}};
  auto opened = daemon_->request("POST", "/mcp",
                                 R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":)"
                                 R"("2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}})",
                                 true, mcp);
  ASSERT_EQ(opened.status, 200) << opened.body;
  ASSERT_FALSE(opened.mcpSessionId.empty()) << opened.body;
  auto inSession = mcp;
  inSession["Mcp-Session-Id"] = opened.mcpSessionId;
  inSession["MCP-Protocol-Version"] = "2025-06-18";
  auto ran = daemon_->request("POST", "/mcp",
                              R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_command",)"
                              R"("arguments":{"command":"echo hi"}}})",
                              true, inSession);
  ASSERT_EQ(ran.status, 200) << ran.body;
  json sessions = call("GET", "/v1/environments?label=moat-mcp=moatd-session", nullptr, 200)["environments"];
  ASSERT_EQ(sessions.size(), 1u) << sessions.dump();
  std::string held = sessions[0]["id"];
  std::string stdio = createEnv({{"labels", {{"moat-mcp", "session"}}}});
  // A fork of it is the caller's own: it does not carry the session's mark.
  json fork = call("POST", "/v1/environments/" + held + "/fork", json::object(), 201);
  EXPECT_FALSE(fork["labels"].contains("moat-mcp")) << fork.dump();
  daemon_->kill9();
  daemon_->restart();
  json gone = call("GET", "/v1/environments/" + held, nullptr, 200);
  EXPECT_EQ(gone["state"], "gone") << gone.dump();
  EXPECT_EQ(gone.value("reason", ""), "its MCP session ended with the moatd that held it") << gone.dump();
  EXPECT_EQ(call("GET", "/v1/environments/" + stdio, nullptr, 200)["state"], "running");
  EXPECT_EQ(call("GET", "/v1/environments/" + fork["id"].get<std::string>(), nullptr, 200)["state"], "running");
  std::string events = daemon_->request("GET", "/v1/events?environment=" + held).body;
  EXPECT_NE(events.find("its MCP session ended"), std::string::npos) << events;
}

TEST_F(MoatdApi, SigtermDestroysEnvironments) {
  std::string id = createEnv();
  daemon_->stop();
  daemon_->restart();
  json env = call("GET", "/v1/environments/" + id, nullptr, 200);
  EXPECT_EQ(env["state"], "gone");
  EXPECT_EQ(env.value("reason", ""), "moatd stopped");
}

}  // namespace
}  // namespace moat::test

namespace moat::test {
namespace {

// Any process whose command line mentions `needle` (moatd and its spawner
// carry the state directory in theirs).
bool processMentions(const std::string& needle) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    // A process that exits meanwhile (other tests run alongside) fails the
    // read with ESRCH: it mentions nothing.
    auto cmdline = os::readFile((entry.path() / "cmdline").string());
    if (cmdline.ok() && cmdline->find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(MoatdStart, ABrokenStoreFailsClearlyAndLeavesNoSpawner) {
  MOAT_REQUIRE_ROOT();
  char tmpl[] = "/tmp/moatd-broken-XXXXXX";
  std::string state = ::mkdtemp(tmpl);
  { std::ofstream(state + "/moat.db") << "this is not a database"; }
  auto r = runProcess({binDir() + "/moatd", "--state", state, "--listen", "127.0.0.1:0"});
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.err.find("not a database"), std::string::npos) << r.err;
  EXPECT_FALSE(processMentions(state)) << "the spawner moatd started must not outlive a failed start";
  std::filesystem::remove_all(state);
}

}  // namespace
}  // namespace moat::test
