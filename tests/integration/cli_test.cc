// `moat env` and `moat exec` end to end: the built moat binary against a real
// moatd, as a user or a script would call them.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "common/encoding.h"
#include "common/sanitizer.h"
#include "common/scope_exit.h"
#include "moat_process.h"
#include "moatd_process.h"
#include "os/file.h"

namespace moat::test {
namespace {

using json = nlohmann::json;

// Tests that need no daemon point moat here: if it tried to call moatd, the
// answer would be exit 125 instead of what they expect.
constexpr const char* kNoDaemon = "unix:/nonexistent.sock";

ProcessResult moat(const std::vector<std::string>& args, const std::string& input = "",
                   const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {binDir() + "/moat"};
  argv.insert(argv.end(), args.begin(), args.end());
  return runProcess(argv, input, env);
}

std::string describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exitCode) + "\nstdout: " + r.out + "\nstderr: " + r.err;
}

std::string unique(const std::string& prefix) {
  static int n = 0;
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
}

// One moatd for the suite: starting one per test would cost more than the tests.
class MoatCli : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { daemon_.reset(); }

  static Moatd& daemon() {
    if (!daemon_) daemon_ = std::make_unique<Moatd>();
    return *daemon_;
  }

  // moat with MOAT_STATE at the daemon's state directory: the default socket
  // and token file are found there.
  static ProcessResult client(const std::vector<std::string>& args, const std::string& input = "",
                              std::map<std::string, std::string> env = {}) {
    env.emplace("MOAT_STATE", daemon().stateDir());
    return moat(args, input, env);
  }

  static std::string createEnv(const std::vector<std::string>& flags = {}) {
    std::vector<std::string> args = {"env", "create"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = client(args);
    EXPECT_EQ(r.exitCode, 0) << describe(r);
    std::string id = r.out;
    if (!id.empty() && id.back() == '\n') id.pop_back();
    EXPECT_TRUE(std::regex_match(id, std::regex("[0-9a-f]{12}"))) << "not an id alone: '" << r.out << "'";
    return id;
  }

  // moat running while the test talks to it (stdin, stdout lines, signals).
  static std::unique_ptr<RunningProcess> startClient(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {binDir() + "/moat"};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<RunningProcess>(argv,
                                            std::map<std::string, std::string>{{"MOAT_STATE", daemon().stateDir()}});
  }

  // The states of environment `id`'s processes, oldest first.
  static std::vector<std::string> processStates(const std::string& id) {
    auto list = daemon().request("GET", "/v1/environments/" + id + "/processes");
    json j = json::parse(list.body, nullptr, false);
    std::vector<std::string> states;
    if (!j.is_object() || !j.contains("processes")) return states;
    for (const auto& p : j["processes"]) states.push_back(p.value("state", ""));
    return states;
  }

  static int stillRunning(const std::string& id) {
    int n = 0;
    for (const auto& s : processStates(id)) n += s == "running" || s == "starting";
    return n;
  }

  static inline std::unique_ptr<Moatd> daemon_;
};

TEST_F(MoatCli, CreateExecListGetRemove) {
  MOAT_REQUIRE_ROOT();
  std::string run = unique("run");
  std::string id = createEnv({"--task-id", "cli-task", "--label", "suite=cli", "--label", "run=" + run, "--memory",
                              "256", "--cpus", "0.5", "-e", "GREETING=hello"});
  ASSERT_FALSE(id.empty());

  auto r = client({"exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(r.exitCode, 3) << describe(r);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");

  r = client({"exec", id, "-i", "--", "cat"}, "piped in\n");
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(r.out, "piped in\n");

  r = client({"exec", id, "-e", "NAME=world", "--", "sh", "-c", "echo $GREETING $NAME"});
  EXPECT_EQ(r.out, "hello world\n") << describe(r);

  r = client({"exec", id, "-w", "/tmp", "pwd"});  // options end at the command, as with moat run
  EXPECT_EQ(r.out, "/tmp\n") << describe(r);

  // State carries over between commands.
  client({"exec", id, "--", "sh", "-c", "echo kept > /workspace/f"});
  EXPECT_EQ(client({"exec", id, "--", "cat", "/workspace/f"}).out, "kept\n");

  r = client({"env", "ls", "--label", "run=" + run});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^ID +STATE +TASK +CPUS +MEM +CREATED +EXPIRES +LABELS\n"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(id +
                                                  " +running +cli-task +0.5 +256M +\\d+s ago +in \\d+[smhd] +"
                                                  "run=" +
                                                  run + ",suite=cli\n")))
      << r.out;

  r = client({"env", "ls", "--json"});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  json all = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(all.is_array()) << r.out;
  bool listed = false;
  for (const auto& e : all) listed |= e.value("id", "") == id;
  EXPECT_TRUE(listed) << r.out;
  r = client({"env", "ls", "--json", "--label", "run=" + unique("other")});
  EXPECT_EQ(json::parse(r.out, nullptr, false), json::array()) << "the label filter is sent: " << r.out;
  r = client({"env", "ls", "--json", "--task-id", "cli-task", "--state", "running"});
  EXPECT_NE(r.out.find(id), std::string::npos) << r.out;
  r = client({"env", "ls", "--json", "--state", "failed"});
  EXPECT_EQ(r.out.find(id), std::string::npos) << r.out;

  r = client({"env", "get", id});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_NE(r.out.find("id: " + id + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("state: running\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("task_id: cli-task\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ram_mb: 256\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("labels: run=" + run + ",suite=cli\n"), std::string::npos) << r.out;
  r = client({"env", "get", id, "--json"});
  json got = json::parse(r.out, nullptr, false);
  EXPECT_EQ(got.value("id", ""), id) << r.out;
  EXPECT_EQ(got["spec"].value("ram_mb", 0), 256) << r.out;
  r = client({"env", "stats", id});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_NE(r.out.find(" of 256.0 MiB ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\npids: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cpu time: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nstorage: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nnetwork: "), std::string::npos) << r.out;
  r = client({"env", "stats", id, "--json"});
  EXPECT_GT(json::parse(r.out, nullptr, false).value("memory_bytes", 0), 0) << r.out;

  r = client({"env", "rm", id});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(r.out, id + "\n");
  r = client({"env", "get", id});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_NE(r.out.find("state: gone\n"), std::string::npos) << r.out;
  EXPECT_EQ(client({"env", "ls"}).out.find(id), std::string::npos) << "gone ones are not listed";
  r = client({"exec", id, "--", "true"});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(r.err.find("(conflict)"), std::string::npos) << r.err;
  r = client({"env", "stats", id});
  EXPECT_NE(r.exitCode, 0);
  EXPECT_NE(r.err.find("is gone"), std::string::npos) << r.err;
}

TEST_F(MoatCli, CreateWithJsonAndRemoveSeveral) {
  MOAT_REQUIRE_ROOT();
  auto r = client({"env", "create", "--json", "--ttl", "600", "--pids", "64", "--storage", "0.5"});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  json created = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(created.is_object()) << r.out;
  EXPECT_EQ(created.value("state", ""), "running");
  EXPECT_EQ(created["spec"].value("pids", 0), 64);
  std::string first = created.value("id", "");
  std::string second = createEnv();
  r = client({"env", "rm", first, second});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(r.out, first + "\n" + second + "\n");
  for (const auto& id : {first, second}) {
    EXPECT_NE(client({"env", "get", id}).out.find("state: gone"), std::string::npos) << id;
  }
}

TEST_F(MoatCli, ExecPassesBytesTimeoutsAndExitCodesThrough) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  auto r = client({"exec", id, "--", "printf", "\\377"});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(r.out, "\xff") << "the raw byte, not base64";

  std::string binary("\xff\x00\x01 text\xfe", 9);
  r = client({"exec", id, "-i", "--", "cat"}, binary);
  EXPECT_EQ(r.out, binary) << "stdin that is not UTF-8 travels as base64";
  r = client({"exec", id, "--", "sh", "-c", "printf '\\376' >&2"});
  EXPECT_EQ(r.err, "\xfe");

  r = client({"exec", id, "--timeout", "0.3", "--", "sleep", "30"});
  EXPECT_EQ(r.exitCode, 124) << describe(r);
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << r.err;

  r = client({"exec", id, "--", "no-such-command"});
  EXPECT_EQ(r.exitCode, 127) << describe(r);
  EXPECT_NE(r.err.find("not found"), std::string::npos) << r.err;

  r = client({"exec", id, "--", "sh", "-c", "kill -KILL $$"});
  EXPECT_EQ(r.exitCode, 128 + 9) << describe(r);

  r = client({"exec", id, "--json", "--", "sh", "-c", "echo hi; exit 4"});
  EXPECT_EQ(r.exitCode, 4) << describe(r);
  json whole = json::parse(r.out, nullptr, false);
  EXPECT_EQ(whole.value("stdout", ""), "hi\n") << r.out;
  EXPECT_EQ(whole.value("exit_code", -1), 4) << r.out;
}

TEST_F(MoatCli, ExecPrintsOutputWhileTheCommandRuns) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  auto exec = startClient({"exec", id, "--", "sh", "-c",
                           "mkfifo /tmp/go && echo first && echo to-stderr >&2 && read x < /tmp/go && "
                           "echo \"second $x\" && exit 7"});
  // The command waits on the fifo: this line can only have come while it runs.
  EXPECT_EQ(exec->readLine(), "first\n");
  EXPECT_EQ(client({"exec", id, "--", "sh", "-c", "echo now > /tmp/go"}).exitCode, 0);
  auto r = exec->wait();
  EXPECT_EQ(r.exitCode, 7) << describe(r);
  EXPECT_EQ(r.out, "second now\n");
  EXPECT_EQ(r.err, "to-stderr\n");
}

TEST_F(MoatCli, ExecSendsStdinAsItComes) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  auto exec = startClient({"exec", id, "-i", "--", "sh", "-c", "read a; echo got $a; read b; echo got $b; cat"});
  ASSERT_TRUE(exec->write("one\n"));
  // The answer to the first line comes before the second line is written.
  EXPECT_EQ(exec->readLine(), "got one\n");
  ASSERT_TRUE(exec->write("two\nrest"));
  EXPECT_EQ(exec->readLine(), "got two\n");
  auto r = exec->wait();  // closes our stdin: cat sees its end
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(r.out, "rest");
}

// moatd holds at most 1 MiB of input a command has not read; moat sends
// the rest as the command reads it, however long it waits first. Before,
// moat-init held all moat sent meanwhile, in the environment's memory: a
// 32 MB environment died of it here (moat-init killed) within the 3 s.
TEST_F(MoatCli, ExecFeedsACommandThatReadsItsInputLate) {
  MOAT_REQUIRE_ROOT();
  // A sanitized moat-init keeps what it frees in AddressSanitizer's
  // quarantine (256 MB by default): its environment needs room for that.
  std::string id = createEnv({"--memory", MOAT_ASAN ? "512" : "32"});
  const std::string input(64u << 20, 'j');
  auto r = client({"exec", id, "-i", "--", "sh", "-c", "sleep 3; exec wc -c"}, input);
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(r.out, std::to_string(input.size()) + "\n");
  EXPECT_EQ(r.err, "");
}

TEST_F(MoatCli, ExecPassesSignalsOnAndASecondInterruptKills) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  auto exec =
      startClient({"exec", id, "--", "sh", "-c", "trap 'echo got INT' INT; echo ready; while :; do sleep 1; done"});
  ASSERT_EQ(exec->readLine(), "ready\n");
  ::kill(exec->pid(), SIGINT);
  EXPECT_EQ(exec->readLine(), "got INT\n") << "the command heard the first ^C and went on";
  ::kill(exec->pid(), SIGINT);
  auto r = exec->wait();
  EXPECT_EQ(r.exitCode, 128 + SIGKILL) << describe(r);
  EXPECT_EQ(stillRunning(id), 0);

  exec = startClient(
      {"exec", id, "--", "sh", "-c", "trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 1; done"});
  ASSERT_EQ(exec->readLine(), "ready\n");
  ::kill(exec->pid(), SIGTERM);
  r = exec->wait();
  EXPECT_EQ(r.exitCode, 3) << describe(r);
  EXPECT_EQ(r.out, "got TERM\n");

  // A signal ignored when moat started (nohup, a script's `&`) stays ignored:
  // the INT does not reach the command, the TERM after it does.
  exec = std::make_unique<RunningProcess>(std::vector<std::string>{"/bin/bash", "-c",
                                                                   "trap '' INT; exec " + binDir() + "/moat exec " +
                                                                       id + " -- sh -c 'echo ready; sleep 1000'"},
                                          std::map<std::string, std::string>{{"MOAT_STATE", daemon().stateDir()}});
  ASSERT_EQ(exec->readLine(), "ready\n");
  ::kill(exec->pid(), SIGINT);
  ::kill(exec->pid(), SIGTERM);
  r = exec->wait();
  EXPECT_EQ(r.exitCode, 128 + SIGTERM) << describe(r);
}

TEST_F(MoatCli, ExecLeavesAtTheThirdInterruptEvenWhenMoatdDoesNotAnswer) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  auto exec = startClient({"exec", id, "--", "sh", "-c", "trap '' INT; echo ready; sleep 1000"});
  ASSERT_EQ(exec->readLine(), "ready\n");
  ::kill(daemon().pid(), SIGSTOP);  // the first ^C's request to moatd now hangs
  ScopeExit resume([&] { ::kill(daemon().pid(), SIGCONT); });
  bool left = false;
  // Signals do not queue: one more ^C until moat has counted three.
  for (int i = 0; i < 100 && !left; ++i) {
    ::kill(exec->pid(), SIGINT);
    left = exec->exitsWithin(100);
  }
  resume.run();
  ASSERT_TRUE(left);
  auto r = exec->wait();
  EXPECT_EQ(r.exitCode, 128 + SIGINT) << describe(r);
  EXPECT_NE(r.err.find("moat: left without waiting: process "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(id + " may still be running"), std::string::npos) << r.err;
  EXPECT_EQ(client({"env", "rm", id}).exitCode, 0);
}

TEST_F(MoatCli, ExecGivesTheCommandSigpipeWhenItsReaderGoesAway) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  auto r = runProcess(
      {"/bin/bash", "-c", binDir() + "/moat exec " + id + " -- yes | head -n 2; echo \"moat ${PIPESTATUS[0]}\" >&2"},
      "", {{"MOAT_STATE", daemon().stateDir()}});
  EXPECT_EQ(r.out, "y\ny\n");
  EXPECT_EQ(r.err, "moat " + std::to_string(128 + SIGPIPE) + "\n") << "yes died of SIGPIPE, as it would here";
  EXPECT_EQ(stillRunning(id), 0);
}

TEST_F(MoatCli, ExecLosesNothingToASlowReader) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  constexpr size_t kBytes = 8u << 20;  // eight times what moatd keeps of a stream
  auto exec = startClient(
      {"exec", id, "--", "sh", "-c", "head -c " + std::to_string(kBytes) + " /dev/zero; touch /tmp/wrote-all"});
  // Nobody reads moat's stdout yet: once the pipes and moatd's window are
  // full, the command waits in its writes, as it would on a full pipe here.
  uint64_t held = 0;
  for (int i = 0; i < 2000 && held < (256u << 10); ++i) {
    auto list = json::parse(daemon().request("GET", "/v1/environments/" + id + "/processes").body, nullptr, false);
    if (list.is_object() && !list["processes"].empty()) held = list["processes"].back().value("stdout_bytes", 0);
    if (held < (256u << 10)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(held, 256u << 10);
  EXPECT_EQ(client({"exec", id, "--", "test", "-e", "/tmp/wrote-all"}).exitCode, 1)
      << "the command went on without its reader";
  auto r = exec->wait();
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.err, "") << "nothing lost, nothing to report";
  EXPECT_EQ(r.out.size(), kBytes);
  EXPECT_EQ(r.out.find_first_not_of('\0'), std::string::npos) << "no bytes but the command's";
}

TEST_F(MoatCli, ExecSaysWhenTheEnvironmentGoesAwayUnderIt) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  auto exec = startClient({"exec", id, "--", "sh", "-c", "echo ready; sleep 1000"});
  ASSERT_EQ(exec->readLine(), "ready\n");
  EXPECT_EQ(client({"env", "rm", id}).exitCode, 0);
  auto r = exec->wait();
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(r.err.find("moat: the command can no longer be followed: "), std::string::npos) << r.err;
}

TEST_F(MoatCli, MoatdErrorsAreOneLineAndExit125) {
  MOAT_REQUIRE_ROOT();
  // The message is moatd's own, with its code.
  auto api = daemon().request("POST", "/v1/environments/000000000000/exec", R"({"cmd":["true"]})");
  ASSERT_EQ(api.status, 404) << api.body;
  std::string message = json::parse(api.body)["error"]["message"];
  auto r = client({"exec", "000000000000", "--", "true"});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_EQ(r.err, "moat: " + message + " (not_found)\n");
  EXPECT_EQ(r.out, "");

  r = client({"env", "get", "000000000000"});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_EQ(r.err, "moat: " + message + " (not_found)\n");

  r = client({"env", "create", "--pids", "1"});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(r.err.find("(invalid_request, field spec.pids)\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "nothing a script would take for an id";

  // --to-disk asks moatd for a checkpoint, which a namespace environment
  // cannot have: moatd's refusal, and the environment runs on.
  std::string id = createEnv({});
  ASSERT_FALSE(id.empty());
  r = client({"env", "pause", "--to-disk", id});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(r.err.find("need CRIU"), std::string::npos) << r.err;
  EXPECT_EQ(client({"env", "get", id, "--json"}).out.find("\"paused\""), std::string::npos);
  EXPECT_EQ(client({"env", "pause", "--to-disk=yes", id}).exitCode, 2) << "the flag takes no value";
  EXPECT_EQ(client({"env", "resume", "--to-disk", id}).exitCode, 2) << "a resume has no such flag";
  client({"env", "rm", id});
}

TEST_F(MoatCli, AWrongOrMissingTokenIsExplained) {
  MOAT_REQUIRE_ROOT();
  auto r = client({"env", "ls", "--token", std::string(64, 'a')});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_EQ(r.err, "moat: invalid token (unauthorized)\n");
  r = client({"env", "ls"}, "", {{"MOAT_TOKEN", "nope"}});
  EXPECT_EQ(r.err, "moat: invalid token (unauthorized)\n");
  EXPECT_EQ(client({"env", "ls"}, "", {{"MOAT_TOKEN", daemon().token()}}).exitCode, 0);

  // A state directory without a token file, and moatd found by --url.
  char tmpl[] = "/tmp/moat-cli-notoken-XXXXXX";
  std::string empty = ::mkdtemp(tmpl);
  r = moat({"env", "ls", "--url", "unix:" + daemon().socketPath()}, "",
           {{"MOAT_STATE", empty}, {"HOME", empty}, {"XDG_CONFIG_HOME", ""}});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(
      r.err.find("no token for moatd: pass --token, set MOAT_TOKEN, put a key in " + empty +
                 "/.config/moat/token (moat keys create --for-user), or make " + empty + "/master-token readable"),
      std::string::npos)
      << r.err;
  (void)os::removeTree(empty);
}

TEST_F(MoatCli, TalksToMoatdOverTcpToo) {
  MOAT_REQUIRE_ROOT();
  std::smatch m;
  std::string log = daemon().log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("serving http://127\\.0\\.0\\.1:(\\d+)"))) << log;
  std::string url = "http://127.0.0.1:" + m[1].str();
  auto r = client({"env", "create", "--url", url});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::string id = r.out.substr(0, r.out.find('\n'));
  r = client({"exec", id, "--", "echo", "over tcp"}, "", {{"MOAT_URL", url}});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(r.out, "over tcp\n");
  EXPECT_EQ(client({"env", "rm", "--url", "http://localhost:" + m[1].str(), id}).exitCode, 0);
}

TEST_F(MoatCli, CpCopiesFilesBothWaysInPieces) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  std::string dir = daemon().stateDir() + "/cp-test";
  ASSERT_TRUE(os::makeDirs(dir).ok());
  // 20 MiB of varied bytes: more than one 8 MiB piece, not valid UTF-8.
  std::string data(20u << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131) ^ (i >> 9));
  ASSERT_TRUE(os::writeFile(dir + "/big.bin", data).ok());
  auto up = client({"cp", dir + "/big.bin", id + ":/workspace/sub/big.bin"});
  ASSERT_EQ(up.exitCode, 0) << describe(up);
  EXPECT_EQ(up.err, "") << "no progress unless stderr is a terminal or it is asked for";
  // --progress: a line per piece, with the total.
  const std::string progress =
      "moat cp: 8.0 MiB of 20.0 MiB (40%)\nmoat cp: 16.0 MiB of 20.0 MiB (80%)\nmoat cp: 20.0 MiB of 20.0 MiB (100%)\n";
  up = client({"cp", "--progress", dir + "/big.bin", id + ":/workspace/sub/big.bin"});
  ASSERT_EQ(up.exitCode, 0) << describe(up);
  EXPECT_EQ(up.err, progress);
  auto size = client({"exec", id, "--", "stat", "-c", "%s", "/workspace/sub/big.bin"});
  EXPECT_EQ(size.out, std::to_string(data.size()) + "\n");
  auto down = client({"cp", "--progress", id + ":/workspace/sub/big.bin", dir + "/back.bin"});
  ASSERT_EQ(down.exitCode, 0) << describe(down);
  EXPECT_EQ(down.err, progress);
  auto back = os::readFile(dir + "/back.bin", 64u << 20);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back.value() == data) << "round trip changed the bytes";
  // stdin and stdout as `-`.
  auto piped = client({"cp", "--progress", "-", id + ":/workspace/s.txt"}, "from stdin");
  EXPECT_EQ(piped.exitCode, 0) << describe(piped);
  EXPECT_EQ(piped.err, "") << "one piece: over before a progress line would help";
  EXPECT_EQ(client({"cp", id + ":/workspace/s.txt", "-"}).out, "from stdin");
  // Clear errors.
  auto missing = client({"cp", id + ":/workspace/none", dir + "/x"});
  EXPECT_EQ(missing.exitCode, 125);
  EXPECT_NE(missing.err.find("not_found"), std::string::npos) << describe(missing);
  EXPECT_EQ(client({"cp", dir + "/a", dir + "/b"}).exitCode, 2);
  EXPECT_EQ(client({"cp", dir, id + ":/workspace/d"}).exitCode, 2);
  EXPECT_EQ(client({"cp", "--progress=yes", dir + "/big.bin", id + ":/workspace/d"}).exitCode, 2);
  (void)os::removeTree(dir);
}

TEST_F(MoatCli, KeysCreateListRemoveAndAKeyWorksForItsOwnEnvironments) {
  MOAT_REQUIRE_ROOT();
  auto created =
      client({"keys", "create", "--scope", "create", "--scope", "exec", "--scope", "read", "--name", "agent"});
  ASSERT_EQ(created.exitCode, 0) << describe(created);
  std::string token = created.out.substr(0, created.out.find('\n'));
  ASSERT_TRUE(std::regex_match(token, std::regex("moat_[0-9a-f]{12}_[0-9a-f]{64}"))) << token;
  std::string keyId = token.substr(5, 12);
  auto ls = client({"keys", "ls"});
  EXPECT_NE(ls.out.find(keyId), std::string::npos);
  EXPECT_NE(ls.out.find("create,exec,read"), std::string::npos) << ls.out;
  EXPECT_EQ(ls.out.find(token.substr(18)), std::string::npos) << "the secret is shown once";
  // The key drives its own environment, with MOAT_TOKEN.
  auto env = client({"env", "create"}, "", {{"MOAT_TOKEN", token}});
  ASSERT_EQ(env.exitCode, 0) << describe(env);
  std::string id = env.out.substr(0, 12);
  auto ran = client({"exec", id, "--", "echo", "as key"}, "", {{"MOAT_TOKEN", token}});
  EXPECT_EQ(ran.out, "as key\n");
  auto noDestroy = client({"env", "rm", id}, "", {{"MOAT_TOKEN", token}});
  EXPECT_EQ(noDestroy.exitCode, 125);
  EXPECT_NE(noDestroy.err.find("'destroy'"), std::string::npos) << describe(noDestroy);
  auto notMaster = client({"keys", "ls"}, "", {{"MOAT_TOKEN", token}});
  EXPECT_EQ(notMaster.exitCode, 125);
  EXPECT_NE(notMaster.err.find("forbidden"), std::string::npos);
  EXPECT_EQ(client({"keys", "rm", keyId}).exitCode, 0);
  auto revoked = client({"env", "ls"}, "", {{"MOAT_TOKEN", token}});
  EXPECT_EQ(revoked.exitCode, 125);
  EXPECT_NE(revoked.err.find("revoked"), std::string::npos) << describe(revoked);
  EXPECT_EQ(client({"keys", "create"}).exitCode, 2);
  EXPECT_EQ(client({"env", "rm", id}).exitCode, 0);
}

// A stand-in for moatd on a unix socket: answers the start of a process
// (POST .../processes), then opens its output stream and hands it to
// `stream`; records whether moat hung up.
class FakeMoatd {
 public:
  explicit FakeMoatd(std::function<void(int fd)> stream) : stream_(std::move(stream)) {
    path_ = "/tmp/moat-fake-" + std::to_string(::getpid()) + ".sock";
    ::unlink(path_.c_str());
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    ok_ = listener_ >= 0 && ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
          ::listen(listener_, 4) == 0;
    if (ok_) thread_ = std::thread([this] { serve(); });
  }
  ~FakeMoatd() {
    if (thread_.joinable()) thread_.join();
    if (listener_ >= 0) ::close(listener_);
    ::unlink(path_.c_str());
  }
  bool ok() const { return ok_; }
  std::string url() const { return "unix:" + path_; }
  void join() { thread_.join(); }
  bool hungUp() const { return hungUp_; }

  static void send(int fd, const std::string& text) { (void)!::write(fd, text.data(), text.size()); }
  static std::string chunk(const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return size + data + "\r\n";
  }

 private:
  static void readHead(int fd) {
    std::string in;
    char buf[4096];
    while (in.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
    }
  }
  void serve() {
    int first = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    readHead(first);
    send(first,
         "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 8\r\n"
         "Connection: close\r\n\r\n{\"id\":1}");
    ::close(first);
    int second = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    readHead(second);
    send(second, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n");
    stream_(second);
    // Bounded: a moat that never hangs up fails the test instead of hanging it.
    pollfd p = {second, POLLIN, 0};
    char byte;
    hungUp_ = ::poll(&p, 1, 20000) == 1 && ::read(second, &byte, 1) == 0;
    ::close(second);
  }
  std::function<void(int)> stream_;
  std::string path_;
  int listener_ = -1;
  bool ok_ = false;
  std::atomic<bool> hungUp_{false};
  std::thread thread_;
};

// As a connection lost without a reset looks: moat gives up after
// MOAT_STREAM_IDLE_S instead of waiting for good.
TEST(MoatCliWithoutDaemon, AStreamThatFallsSilentIsTakenForLost) {
  FakeMoatd fake([](int) {});  // then silence
  ASSERT_TRUE(fake.ok());
  auto r = moat({"exec", "abc", "--", "sleep", "1000"}, "",
                {{"MOAT_URL", fake.url()}, {"MOAT_TOKEN", "t"}, {"MOAT_STREAM_IDLE_S", "1"}});
  fake.join();
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(r.err.find("sent nothing for 1 s, not even a heartbeat: the connection is taken for lost"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("(the command may still be running)"), std::string::npos) << r.err;
  EXPECT_TRUE(fake.hungUp()) << "moat closed its end";
}

// The time moat's own reader takes is not the connection's silence: moat
// blocked on a full stdout for longer than the limit still gets the rest.
TEST(MoatCliWithoutDaemon, ASlowReaderOfMoatIsNotASilentStream) {
  const std::string data(256u << 10, 'x');  // more than a pipe holds
  std::atomic<bool> release{false};
  FakeMoatd fake([&](int fd) {
    FakeMoatd::send(fd, FakeMoatd::chunk(json{{"data", base64Encode(data)},
                                              {"encoding", "base64"},
                                              {"offset", 0},
                                              {"stream", "stdout"},
                                              {"type", "output"}}
                                             .dump() +
                                         "\n"));
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    FakeMoatd::send(fd, FakeMoatd::chunk(json{{"type", "exit"},
                                              {"offset", data.size()},
                                              {"state", "exited"},
                                              {"exit_code", 0},
                                              {"signal", 0},
                                              {"timed_out", false}}
                                             .dump() +
                                         "\n") +
                            "0\r\n\r\n");
  });
  ASSERT_TRUE(fake.ok());
  RunningProcess exec({binDir() + "/moat", "exec", "abc", "--", "cat", "big"},
                      {{"MOAT_URL", fake.url()}, {"MOAT_TOKEN", "t"}, {"MOAT_STREAM_IDLE_S", "1"}});
  // Nobody reads moat's stdout for twice the limit: a wait on time itself.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  release = true;
  auto r = exec.wait();
  fake.join();
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out.size(), data.size());
  EXPECT_EQ(r.err, "");
}

// moat doctor on this host (CI's: everything moatd needs is there, KVM may
// not be): every check answers, none fails, and the moatd line says what
// it found: nothing at a socket, a refused token, a daemon serving.
TEST_F(MoatCli, DoctorChecksTheHostAndSaysWhatToDo) {
  MOAT_REQUIRE_ROOT();
  auto statusOf = [](const json& report, const std::string& name) -> json {
    for (const auto& c : report["checks"]) {
      if (c["name"] == name) return c;
    }
    return json();
  };
  auto alone = moat({"doctor", "--json", "--url", kNoDaemon});
  json report = json::parse(alone.out, nullptr, false);
  ASSERT_TRUE(report.is_object()) << describe(alone);
  EXPECT_EQ(alone.exitCode, 0) << "a check failed on the host the suite runs on: " << alone.out;
  for (const char* name : {"kernel", "root", "user namespaces", "cgroups", "overlayfs", "btrfs", "seccomp", "landlock",
                           "egress", "lxcfs", "templates", "microvm", "criu", "scale", "moatd"}) {
    json c = statusOf(report, name);
    ASSERT_TRUE(c.is_object()) << "no check " << name << ": " << alone.out;
    EXPECT_TRUE(c["status"] == "ok" || c["status"] == "warn") << c;
    EXPECT_FALSE(c["detail"].get<std::string>().empty()) << c;
    if (c["status"] == "warn" && name != std::string("microvm")) {
      EXPECT_FALSE(c["fix"].get<std::string>().empty()) << "a warning without what to do: " << c;
    }
  }
  EXPECT_EQ(statusOf(report, "moatd")["status"], "warn");
  EXPECT_NE(statusOf(report, "moatd")["detail"].get<std::string>().find("/nonexistent.sock"), std::string::npos);
  EXPECT_EQ(statusOf(report, "root")["status"], "ok");
  EXPECT_EQ(statusOf(report, "egress")["status"], "ok") << "the egress tests of this suite make veth pairs";

  auto refused = client({"doctor", "--json"}, "", {{"MOAT_TOKEN", "moat_000000000000_bogus"}});
  json c = statusOf(json::parse(refused.out, nullptr, false), "moatd");
  EXPECT_EQ(c["status"], "warn") << refused.out;
  EXPECT_NE(c["detail"].get<std::string>().find("this token is refused"), std::string::npos) << c;
  EXPECT_NE(c["fix"].get<std::string>().find("--for-user"), std::string::npos) << c;

  auto serving = client({"doctor"});
  EXPECT_EQ(serving.exitCode, 0) << describe(serving);
  EXPECT_NE(serving.out.find("ok    moatd            serving at unix:"), std::string::npos) << serving.out;
  EXPECT_EQ(moat({"doctor", "--bogus"}).exitCode, 2);
}

TEST(MoatCliWithoutDaemon, AMissingDaemonIsNamed) {
  char tmpl[] = "/tmp/moat-cli-state-XXXXXX";
  std::string state = ::mkdtemp(tmpl);
  // No token either: the unreachable daemon is the problem to report first.
  auto r = moat({"env", "ls"}, "", {{"MOAT_URL", kNoDaemon}, {"MOAT_STATE", state}});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_EQ(r.err, std::string("moat: cannot reach moatd at ") + kNoDaemon +
                       ": No such file or directory (is moatd running?)\n");
  r = moat({"exec", "abc", "--", "true"}, "", {{"MOAT_STATE", state}});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_EQ(r.err, "moat: cannot reach moatd at unix:" + state +
                       "/moatd.sock: No such file or directory (is moatd running?)\n")
      << "the default socket is <state>/moatd.sock";
  r = moat({"env", "ls", "--url", "http://127.0.0.1:1"}, "", {{"MOAT_STATE", state}});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(r.err.find("cannot reach moatd at http://127.0.0.1:1: Connection refused"), std::string::npos) << r.err;
  (void)os::removeTree(state);
}

TEST(MoatCliWithoutDaemon, BadUsageExits2AndNamesTheProblem) {
  const std::map<std::string, std::string> env = {{"MOAT_URL", kNoDaemon}};
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"env", "create", "--bogus"}, "moat env create: unknown option --bogus\n"},
      {{"env", "create", "--cpus", "lots"}, "moat env create: --cpus: 'lots' is not a number\n"},
      {{"env", "create", "--memory=1.5"}, "moat env create: --memory: '1.5' is not a whole number\n"},
      {{"env", "create", "--label", "novalue"}, "moat env create: --label: expected KEY=VALUE, got 'novalue'\n"},
      {{"env", "create", "--ttl"}, "moat env create: --ttl needs a value\n"},
      {{"env", "create", "stray"}, "moat env create: unexpected argument 'stray'\n"},
      {{"env", "ls", "-x"}, "moat env ls: unknown option -x\n"},
      {{"env", "get"}, "moat env get: missing environment id (usage: moat env get ID)\n"},
      {{"env", "rm"}, "moat env rm: missing environment id (usage: moat env rm ID...)\n"},
      {{"env", "frob"},
       "moat env: unknown command 'frob' (create, ls, get, stats, network, ttl, pause, resume or rm; see moat env "
       "--help)\n"},
      {{"exec"}, "moat exec: missing environment id (usage: moat exec ENV [options] -- COMMAND...)\n"},
      {{"exec", "abc"}, "moat exec: missing command (usage: moat exec ENV [options] -- COMMAND...)\n"},
      {{"exec", "abc", "--frob", "--", "true"}, "moat exec: unknown option --frob\n"},
      {{"exec", "abc", "-i=1", "true"}, "moat exec: unknown option -i=1\n"},
      {{"exec", "abc", "--interactive=yes", "true"}, "moat exec: --interactive takes no value\n"},
      {{"exec", "abc", "-w", "rel", "true"}, "moat exec: -w: working directory must be absolute: rel\n"},
      {{"exec", "abc", "--timeout", "0", "true"}, "moat exec: --timeout: 0 is out of range (0.001 to 86400 seconds)\n"},
      {{"exec", "a/b", "true"}, "moat exec: 'a/b' is not an environment id\n"},
      {{"exec", "abc", "printf", "\xff"}, "moat exec: the command's argument 1 is not valid UTF-8\n"},
      {{"env", "create", "--label", "k=\xff"}, "moat env create: values must be valid UTF-8 (moatd's API is JSON)\n"},
      {{"exec", "abc", "--url", "ftp://x", "true"},
       "moat exec: --url: unknown scheme (expected http://HOST:PORT or unix:/path/to.sock), got "
       "'ftp://x'\n"},
  };
  for (const auto& c : cases) {
    auto r = moat(c.args, "", env);
    std::string shown;
    for (const auto& a : c.args) shown += a + " ";
    EXPECT_EQ(r.exitCode, 2) << shown << describe(r);
    EXPECT_EQ(r.err, c.message) << shown;
  }
  auto r = moat({"env", "ls"}, "", {{"MOAT_URL", "http://nohost"}});
  EXPECT_EQ(r.exitCode, 2) << describe(r);
  EXPECT_NE(r.err.find("MOAT_URL: needs a port"), std::string::npos) << r.err;
}

// Every binary says its version (the project's and git's description of
// the build, cmake/version.cmake), with no root, state or daemon needed;
// moatd's --help names the flag.
TEST(MoatCliWithoutDaemon, EveryBinarySaysItsVersion) {
  std::string first;
  for (const std::string name : {"moatd", "moat", "moat-init"}) {
    auto r = runProcess({binDir() + "/" + name, "--version"});
    EXPECT_EQ(r.exitCode, 0) << name << ": " << r.err;
    EXPECT_EQ(r.out.rfind(name + " 0.", 0), 0u) << name << ": " << r.out;
    ASSERT_FALSE(r.out.empty());
    EXPECT_EQ(r.out.back(), '\n');
    const std::string version = r.out.substr(name.size() + 1);
    if (first.empty()) first = version;
    EXPECT_EQ(version, first) << name << " was built from the same tree as moatd";
  }
  if (::access(MOAT_SOURCE_DIR "/.git", F_OK) == 0) {
    EXPECT_NE(first.find('+'), std::string::npos) << "a git checkout's build names its commit: " << first;
  }
  auto help = runProcess({binDir() + "/moatd", "--help"});
  EXPECT_NE(help.out.find("moatd --version"), std::string::npos) << help.out;
}

// docs/CLI.md is the CLI's reference: every command `moat --help` lists has
// a heading there, and every flag a command's --help names is in it.
TEST(MoatCliWithoutDaemon, TheCliReferenceKeepsUpWithEveryHelp) {
  auto reference = os::readFile(MOAT_SOURCE_DIR "/docs/CLI.md", 1 << 20);
  ASSERT_TRUE(reference.ok()) << reference.error().message();
  std::string headings;
  std::istringstream lines(reference.value());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind('#', 0) == 0) headings += line + "\n";
  }
  auto top = runProcess({binDir() + "/moat", "--help"});
  const std::string listed = top.out + top.err;
  std::vector<std::string> commands;
  std::istringstream help(listed.substr(listed.find("commands:")));
  const std::regex command("^  ([a-z]+) +\\S");
  for (std::string line; std::getline(help, line);) {
    std::smatch m;
    if (std::regex_search(line, m, command)) commands.push_back(m[1]);
  }
  ASSERT_GE(commands.size(), 10u) << listed;
  const std::regex flag("--[a-z][a-z0-9-]+");
  for (const auto& name : commands) {
    const std::string heading = name == "version" ? "moat --version" : "moat " + name;
    EXPECT_NE(headings.find(heading), std::string::npos) << "no heading names '" << heading << "' in docs/CLI.md";
    if (name == "version") continue;
    auto r = runProcess({binDir() + "/moat", name, "--help"});
    const std::string text = r.out + r.err;
    for (std::sregex_iterator it(text.begin(), text.end(), flag), end; it != end; ++it) {
      const std::string named = it->str();
      if (named == "--help") continue;
      EXPECT_NE(reference->find(named), std::string::npos)
          << "moat " << name << " --help names " << named << ", docs/CLI.md does not";
    }
  }
}

TEST(MoatCliWithoutDaemon, HelpListsTheClientCommands) {
  auto r = moat({"--help"});
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\n  env +")) && std::regex_search(r.out, std::regex("\n  exec +")))
      << r.out;
  r = moat({"env", "--help"});
  EXPECT_EQ(r.exitCode, 0);
  for (const char* word : {"create", "ls", "get", "rm", "--url", "MOAT_TOKEN"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << "\n" << r.out;
  }
  r = moat({"exec", "--help"});
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_NE(r.out.find("usage: moat exec ENV"), std::string::npos) << r.out;
  EXPECT_EQ(moat({"env", "create", "--help"}, "", {{"MOAT_URL", kNoDaemon}}).exitCode, 0);
}

// --url, --token and --state before the command stand for the variables;
// `moat env ttl` sets an environment's time left; moatd's refusals are put
// in the flags' words; a usual slip of a flag names the one meant.
TEST_F(MoatCli, FlagsBeforeTheCommandTheTtlAndErrorsInTheFlagsWords) {
  MOAT_REQUIRE_ROOT();
  const std::string id = createEnv();
  // Only the flags lead to the daemon: the variables point nowhere.
  const std::map<std::string, std::string> nowhere = {{"MOAT_URL", kNoDaemon}, {"MOAT_STATE", "/nonexistent"}};
  auto listed = moat({"--url", "unix:" + daemon().socketPath(), "--token=" + daemon().token(), "env", "ls", "--json"},
                     "", nowhere);
  ASSERT_EQ(listed.exitCode, 0) << describe(listed);
  EXPECT_NE(listed.out.find(id), std::string::npos) << describe(listed);
  auto state = moat({"--state", daemon().stateDir(), "env", "get", id}, "", {{"MOAT_STATE", "/nonexistent"}});
  EXPECT_EQ(state.exitCode, 0) << describe(state);
  // The same flag after the command wins.
  auto after = moat({"--url", "unix:" + daemon().socketPath(), "env", "ls", "--url", kNoDaemon}, "", nowhere);
  EXPECT_EQ(after.exitCode, 125) << describe(after);
  auto bad = moat({"--url", "ftp://x", "env", "ls"});
  EXPECT_EQ(bad.exitCode, 2) << describe(bad);
  EXPECT_EQ(moat({"--token"}).exitCode, 2);
  // The time left, longer or shorter.
  auto ttl = client({"env", "ttl", id, "60"});
  ASSERT_EQ(ttl.exitCode, 0) << describe(ttl);
  json env = json::parse(daemon().request("GET", "/v1/environments/" + id).body);
  EXPECT_EQ(ttl.out, env["expires_at"].get<std::string>() + "\n");
  EXPECT_EQ(client({"env", "ttl", id}).exitCode, 2);
  EXPECT_EQ(client({"env", "ttl", id, "soon"}).exitCode, 2);
  auto zero = client({"env", "ttl", id, "0"});
  EXPECT_EQ(zero.exitCode, 125) << describe(zero);
  EXPECT_NE(zero.err.find("--ttl"), std::string::npos) << describe(zero);
  // moatd names spec.ram_mb; the caller typed --memory.
  auto small = client({"env", "create", "--memory", "8"});
  EXPECT_EQ(small.exitCode, 125) << describe(small);
  EXPECT_NE(small.err.find("--memory (MB): "), std::string::npos) << describe(small);
  auto slip = client({"env", "create", "--cpu", "2"});
  EXPECT_EQ(slip.exitCode, 2) << describe(slip);
  EXPECT_NE(slip.err.find("unknown option --cpu (did you mean --cpus?)"), std::string::npos) << describe(slip);
}

TEST_F(MoatCli, ShellRunsWhatItIsFedAndExitsWithTheShellsStatus) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv();
  // Input from a pipe, not a person: the terminal still echoes and answers.
  auto r = client({"shell", id}, "echo hi-$((1+2))\nstty size\nexit 7\n");
  EXPECT_EQ(r.exitCode, 7) << describe(r);
  EXPECT_NE(r.out.find("hi-3"), std::string::npos) << describe(r);
  EXPECT_NE(r.out.find("24 80"), std::string::npos) << "not a terminal: default size\n" << describe(r);
  // Without ENV: a throwaway environment, gone afterwards.
  auto before = client({"env", "ls", "--label", "moat=shell", "--json"});
  auto t = client({"shell"}, "hostname > /dev/null; exit 0\n");
  EXPECT_EQ(t.exitCode, 0) << describe(t);
  auto after = client({"env", "ls", "--label", "moat=shell", "--json"});
  EXPECT_EQ(json::parse(after.out).size(), json::parse(before.out).size())
      << "the throwaway environment must be destroyed";
  // Errors are one line and 125; usage errors 2.
  auto missing = client({"shell", "000000000000"});
  EXPECT_EQ(missing.exitCode, 125) << describe(missing);
  EXPECT_NE(missing.err.find("no environment"), std::string::npos) << describe(missing);
  EXPECT_EQ(client({"shell", "--process", "0", id}).exitCode, 2);
  EXPECT_EQ(client({"shell", id, "extra"}).exitCode, 2);
}

TEST_F(MoatCli, ApprovalsAreDecidedFromTheTerminal) {
  MOAT_REQUIRE_ROOT();
  std::string id = createEnv(
      {"--permissions", R"({"run_command": [{"match": ["echo", "*"], "action": "ask"}, {"action": "allow"}]})"});
  auto pendingId = [&]() -> std::string {
    for (int i = 0; i < 200; ++i) {
      auto ls = client({"approvals", "ls", "--state", "pending", "--env", id, "--json"});
      json list = json::parse(ls.out, nullptr, false);
      if (list.is_array() && !list.empty()) return list[0]["id"];
    }
    return "";
  };
  ProcessResult approved;
  std::thread asker([&] { approved = client({"exec", id, "--", "echo", "approved"}); });
  std::string first = pendingId();
  ASSERT_FALSE(first.empty());
  auto table = client({"approvals"});
  EXPECT_NE(table.out.find("echo approved"), std::string::npos) << describe(table);
  auto yes = client({"approvals", "approve", first, "--reason", "looks fine"});
  EXPECT_EQ(yes.exitCode, 0) << describe(yes);
  asker.join();
  EXPECT_EQ(approved.exitCode, 0) << describe(approved);
  EXPECT_EQ(approved.out, "approved\n");

  ProcessResult refused;
  std::thread asker2([&] { refused = client({"exec", id, "--", "echo", "refused"}); });
  std::string second = pendingId();
  ASSERT_FALSE(second.empty());
  EXPECT_EQ(client({"approvals", "deny", second, "--remember"}).exitCode, 0);
  asker2.join();
  EXPECT_EQ(refused.exitCode, 125) << describe(refused);
  EXPECT_NE(refused.err.find("denied_by_policy"), std::string::npos) << describe(refused);
  // Remembered: the same command is now denied without asking.
  auto again = client({"exec", id, "--", "echo", "refused"});
  EXPECT_EQ(again.exitCode, 125);
  EXPECT_NE(again.err.find("rule 1"), std::string::npos) << describe(again);
  // Deciding twice is an error; so is nonsense.
  EXPECT_EQ(client({"approvals", "approve", second}).exitCode, 125);
  EXPECT_EQ(client({"approvals", "approve"}).exitCode, 2);
  EXPECT_EQ(client({"approvals", "frobnicate"}).exitCode, 2);

  // watch: answers come from stdin, one line per pending approval.
  ProcessResult watched;
  std::thread asker3([&] { watched = client({"exec", id, "--", "echo", "watched"}); });
  ASSERT_FALSE(pendingId().empty());
  auto w = client({"approvals", "watch", "--env", id}, "y\n");
  asker3.join();
  EXPECT_NE(w.out.find("approved"), std::string::npos) << describe(w);
  EXPECT_EQ(watched.exitCode, 0) << describe(watched);
}

TEST_F(MoatCli, SnapshotRestoreAndForkFromTheCommandLine) {
  MOAT_REQUIRE_ROOT();
  auto r = client({"env", "create"});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::string id = r.out.substr(0, r.out.find('\n'));
  ASSERT_EQ(client({"exec", id, "--", "sh", "-c", "echo one > /workspace/f"}).exitCode, 0);
  r = client({"snapshot", "create", id, "--name", "first"});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::string snap = r.out.substr(0, r.out.find('\n'));
  EXPECT_EQ(snap.rfind("snap-", 0), 0u) << r.out;
  r = client({"snapshot", "ls", id});
  EXPECT_NE(r.out.find(snap), std::string::npos) << describe(r);
  EXPECT_NE(r.out.find("first"), std::string::npos) << describe(r);
  ASSERT_EQ(client({"exec", id, "--", "sh", "-c", "echo two > /workspace/f"}).exitCode, 0);
  r = client({"snapshot", "restore", id, snap});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(client({"exec", id, "--", "cat", "/workspace/f"}).out, "one\n");
  r = client({"snapshot", "fork", id, "--task-id", "branch", "--label", "k=v"});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::string fork = r.out.substr(0, r.out.find('\n'));
  EXPECT_EQ(client({"exec", fork, "--", "cat", "/workspace/f"}).out, "one\n");
  // Several from one moment: an id a line.
  r = client({"snapshot", "fork", id, "--count", "2"});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::istringstream ids(r.out);
  std::vector<std::string> twins;
  for (std::string line; std::getline(ids, line);) twins.push_back(line);
  ASSERT_EQ(twins.size(), 2u) << r.out;
  for (const auto& twin : twins) EXPECT_EQ(client({"exec", twin, "--", "cat", "/workspace/f"}).out, "one\n");
  EXPECT_EQ(client({"env", "rm", twins[0], twins[1]}).exitCode, 0);
  // With memory: a namespace environment's is refused by name.
  r = client({"snapshot", "fork", id, "--memory"});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(r.err.find("CRIU"), std::string::npos) << r.err;
  r = client({"env", "create", "--snapshot", snap});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::string third = r.out.substr(0, r.out.find('\n'));
  EXPECT_EQ(client({"exec", third, "--", "cat", "/workspace/f"}).out, "one\n");
  EXPECT_EQ(client({"snapshot", "rm", snap}).exitCode, 0);
  // Mistakes: usage errors (2) that say what is wrong; moatd's refusals (125).
  r = client({"snapshot", "restore", id, "../../envs/x"});
  EXPECT_EQ(r.exitCode, 2) << describe(r);
  EXPECT_NE(r.err.find("not a snapshot id"), std::string::npos) << r.err;
  r = client({"snapshot", "create"});
  EXPECT_EQ(r.exitCode, 2) << describe(r);
  r = client({"snapshot", "restore", id, snap});
  EXPECT_EQ(r.exitCode, 125) << describe(r);
  EXPECT_NE(r.err.find("no snapshot"), std::string::npos) << r.err;
  r = client({"snapshot", "frobnicate"});
  EXPECT_EQ(r.exitCode, 2) << describe(r);
  EXPECT_EQ(client({"env", "rm", id, fork, third}).exitCode, 0);
}

TEST_F(MoatCli, NetworkPolicyAndSecretsFromTheCommandLine) {
  MOAT_REQUIRE_ROOT();
  // The secret's value comes from the caller's variable, never from argv.
  auto r =
      client({"env", "create", "--allow", "*.pypi.org", "--allow", "api.example.com:443", "--deny", "upload.pypi.org",
              "--secret", "API_TOKEN@api.example.com", "--secret-header", "API_TOKEN=Authorization: Bearer {value}"},
             "", {{"API_TOKEN", "never-in-argv"}});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::string id = r.out.substr(0, r.out.find('\n'));
  r = client({"env", "network", id});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["network"]["mode"], "allowlist");
  EXPECT_EQ(j["network"]["allow"], nlohmann::json({"*.pypi.org", "api.example.com:443"}));
  EXPECT_EQ(j["network"]["deny"], nlohmann::json({"upload.pypi.org"}));
  EXPECT_TRUE(j.contains("link")) << r.out;
  r = client({"exec", id, "--", "sh", "-c", "echo $API_TOKEN"});
  EXPECT_EQ(r.out.rfind("moat-secret-", 0), 0u) << describe(r);
  r = client({"env", "get", id, "--json"});
  EXPECT_EQ(r.out.find("never-in-argv"), std::string::npos);
  EXPECT_NE(r.out.find("API_TOKEN"), std::string::npos) << r.out;

  r = client({"env", "network", id, "--network", "none"});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(nlohmann::json::parse(r.out)["network"]["mode"], "none");
  EXPECT_FALSE(nlohmann::json::parse(r.out).contains("link"));

  // Mistakes are usage errors that name the flag.
  r = client({"env", "create", "--secret", "UNSET_VARIABLE_X@h.example"});
  EXPECT_EQ(r.exitCode, 2) << describe(r);
  EXPECT_NE(r.err.find("UNSET_VARIABLE_X"), std::string::npos) << r.err;
  r = client({"env", "create", "--network", "open", "--allow", "x.example"});
  EXPECT_EQ(r.exitCode, 2) << describe(r);
  r = client({"env", "network", id, "--allow", "[::1]"});
  EXPECT_NE(r.exitCode, 0);
  EXPECT_NE(r.err.find("network.allow[0]"), std::string::npos) << r.err;
  client({"env", "rm", id});
}

}  // namespace
}  // namespace moat::test
