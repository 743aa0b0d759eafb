// The shell WebSocket: a real terminal in an environment, several viewers,
// resize, hang-up when the last viewer leaves, and what abuse gets.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "moatd_fixture.h"
#include "moatd_process.h"
#include "websocket/connection.h"

namespace moat::test {
namespace {

using json = nlohmann::json;

// A client end of a shell session, as a program would hold it.
class Viewer {
 public:
  explicit Viewer(Moatd::Upgrade u) : fd_(u.fd), status_(u.status), socket_(u.fd, true, u.rest) {}
  ~Viewer() { ::close(fd_); }
  int status() const { return status_; }
  websocket::Connection& socket() { return socket_; }
  // Reads until the terminal output contains `text`; text messages are kept.
  bool waitFor(const std::string& text) {
    websocket::Message m;
    while (output_.find(text) == std::string::npos) {
      if (!socket_.receive(m)) return false;
      if (m.opcode == websocket::Opcode::kBinary)
        output_ += m.data;
      else
        controls_.push_back(json::parse(m.data));
    }
    return true;
  }
  // Reads to the end of the session; returns the final control message.
  json finish() {
    websocket::Message m;
    while (socket_.receive(m)) {
      if (m.opcode == websocket::Opcode::kBinary)
        output_ += m.data;
      else
        controls_.push_back(json::parse(m.data));
    }
    return controls_.empty() ? json() : controls_.back();
  }
  bool type(const std::string& keys) { return socket_.sendBinary(keys); }
  const std::vector<json>& controls() const { return controls_; }

 private:
  int fd_;
  int status_;
  websocket::Connection socket_;
  std::string output_;
  std::vector<json> controls_;
};

class Shell : public MoatdFixture {
 protected:
  void SetUp() override {
    MoatdFixture::SetUp();
    if (daemon_) env_ = createEnv();
  }
  std::string shellPath(const std::string& query = "") const {
    return "/v1/environments/" + env_ + "/shell" + (query.empty() ? "" : "?" + query);
  }
  uint64_t shellProcessId() {
    json list = call("GET", "/v1/environments/" + env_ + "/processes", nullptr, 200);
    for (const auto& p : list["processes"]) {
      if (p["kind"] == "shell") return p["id"];
    }
    return 0;
  }
  std::string env_;
};

TEST_F(Shell, ARealTerminalThatFollowsItsSize) {
  Viewer v(daemon_->websocket(shellPath("rows=30&cols=100")));
  ASSERT_EQ(v.status(), 101);
  ASSERT_TRUE(v.type("tty; stty size\n"));
  EXPECT_TRUE(v.waitFor("/dev/pts/"));
  EXPECT_TRUE(v.waitFor("30 100"));
  ASSERT_TRUE(v.socket().sendText(R"({"type":"resize","rows":40,"cols":120})"));
  ASSERT_TRUE(v.type("stty size\n"));
  EXPECT_TRUE(v.waitFor("40 120"));
  ASSERT_FALSE(v.controls().empty());
  EXPECT_EQ(v.controls().front()["type"], "hello") << "the first message names the process";
  EXPECT_EQ(v.controls().front()["process"], shellProcessId());
  EXPECT_EQ(v.controls().front()["cmd"][0], "/bin/bash");
  ASSERT_TRUE(v.type("exit 3\n"));
  json last = v.finish();
  EXPECT_EQ(last["type"], "exit");
  EXPECT_EQ(last["exit_code"], 3);
}

TEST_F(Shell, SeveralViewersShareOneTerminal) {
  Viewer a(daemon_->websocket(shellPath()));
  ASSERT_EQ(a.status(), 101);
  ASSERT_TRUE(a.type("echo first-$((6*7))\n"));
  ASSERT_TRUE(a.waitFor("first-42"));
  uint64_t id = shellProcessId();
  ASSERT_NE(id, 0u);
  Viewer b(daemon_->websocket(shellPath("process=" + std::to_string(id))));
  ASSERT_EQ(b.status(), 101);
  EXPECT_TRUE(b.waitFor("first-42")) << "a new viewer sees the recent screen";
  ASSERT_TRUE(b.type("echo from-$((2+3))-b\n"));
  EXPECT_TRUE(a.waitFor("from-5-b"));
  EXPECT_TRUE(b.waitFor("from-5-b"));
  ASSERT_TRUE(a.type("exit\n"));
  EXPECT_EQ(a.finish()["type"], "exit");
  EXPECT_EQ(b.finish()["type"], "exit");
}

TEST_F(Shell, TheLastViewerLeavingHangsTheShellUp) {
  uint64_t id = 0;
  {
    Viewer v(daemon_->websocket(shellPath()));
    ASSERT_EQ(v.status(), 101);
    ASSERT_TRUE(v.type("echo ready\n"));
    ASSERT_TRUE(v.waitFor("ready"));
    id = shellProcessId();
    v.socket().abort();  // gone without a goodbye
  }
  ASSERT_NE(id, 0u);
  json p;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    p = call("GET", "/v1/environments/" + env_ + "/processes/" + std::to_string(id), nullptr, 200);
    if (p["state"] != "running") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(p["state"], "exited");
  // SIGHUP, or SIGKILL when the shell was still there after the grace period.
  EXPECT_TRUE(p["exit_code"] == 128 + SIGHUP || p["exit_code"] == 128 + SIGKILL) << p.dump();
}

// Every input is an event (issue 24): `echo pwned > /workspace/f` typed
// into an attached terminal left no trace in the log, nor did text written
// to a process's stdin, its signals, or an exec's input.
TEST_F(Shell, EveryInputIsAnEvent) {
  auto eventsOf = [&](const std::string& type, const std::string& needle) {
    return eventsUntil("?type=" + type + "&environment=" + env_, needle);
  };
  {
    Viewer v(daemon_->websocket(shellPath()));
    ASSERT_EQ(v.status(), 101);
    ASSERT_TRUE(v.type("echo pwned > /workspace/f\r"));
    ASSERT_TRUE(v.type("echo done\r"));
    ASSERT_TRUE(v.waitFor("done"));
    (void)v.socket().sendText(R"({"type":"signal","signal":"WINCH"})");
    v.socket().close(1000, "bye");
    v.finish();
  }
  EXPECT_NE(eventsOf("terminal.input", "pwned").find("echo pwned > /workspace/f"), std::string::npos);
  EXPECT_NE(eventsOf("terminal.attached", "terminal.attached").find("terminal.attached"), std::string::npos);
  EXPECT_NE(eventsOf("terminal.detached", "terminal.detached").find("terminal.detached"), std::string::npos);
  EXPECT_NE(eventsOf("process.signal", "terminal").find("\"via\":\"terminal\""), std::string::npos);
  // A process's stdin, written through the API, and a signal to it.
  json p = call("POST", "/v1/environments/" + env_ + "/processes", {{"cmd", {"cat"}}, {"stdin", true}}, 201);
  std::string process = "/v1/environments/" + env_ + "/processes/" + std::to_string(p["id"].get<int>());
  call("POST", process + "/stdin", {{"data", "rm -rf /workspace\n"}}, 204);
  call("POST", process + "/stdin", {{"data", std::string(300, 'x')}}, 204);
  call("POST", process + "/signal", {{"signal", "TERM"}}, 204);
  std::string inputs = eventsOf("process.input", "\"bytes\":300");
  EXPECT_NE(inputs.find("\"text\":\"rm -rf /workspace\\n\""), std::string::npos) << inputs;
  EXPECT_NE(inputs.find("\"bytes\":300"), std::string::npos) << "long input: its size and hash" << inputs;
  EXPECT_NE(eventsOf("process.signal", "\"signal\":15").find("\"signal\":15"), std::string::npos);
  // An exec's stdin.
  exec(env_, {{"cmd", {"cat"}}, {"stdin", "given to read"}});
  EXPECT_NE(eventsOf("exec.started", "given to read").find("\"text\":\"given to read\""), std::string::npos);
}

TEST_F(Shell, DestroyingTheEnvironmentEndsTheSessionWithAReason) {
  Viewer v(daemon_->websocket(shellPath()));
  ASSERT_EQ(v.status(), 101);
  ASSERT_TRUE(v.type("echo up\n"));
  ASSERT_TRUE(v.waitFor("up"));
  call("DELETE", "/v1/environments/" + env_, nullptr, 204);
  json last = v.finish();
  EXPECT_EQ(last["type"], "end");
  EXPECT_NE(last.value("reason", "").find("destroyed"), std::string::npos);
}

TEST_F(Shell, RefusalsComeBeforeTheUpgrade) {
  auto plain = daemon_->request("GET", shellPath());
  EXPECT_EQ(plain.status, 426);
  EXPECT_EQ(plain.upgrade, "websocket") << "a 426 says what to upgrade to";
  EXPECT_NE(plain.body.find("upgrade_required"), std::string::npos);
  auto noToken = daemon_->websocket(shellPath(), false);
  EXPECT_EQ(noToken.status, 401);
  ::close(noToken.fd);
  auto badRows = daemon_->websocket(shellPath("rows=0"));
  EXPECT_EQ(badRows.status, 400);
  ::close(badRows.fd);
  auto unknown = daemon_->websocket(shellPath("command=sh"));
  EXPECT_EQ(unknown.status, 400);
  ::close(unknown.fd);
  json p = call("POST", "/v1/environments/" + env_ + "/processes", {{"cmd", {"sleep", "100"}}}, 201);
  auto noTerminal = daemon_->websocket(shellPath("process=" + std::to_string(p["id"].get<int>())));
  EXPECT_EQ(noTerminal.status, 400);
  ::close(noTerminal.fd);
  // Another key's environment does not exist for this key.
  json key = call("POST", "/v1/keys", {{"scopes", {"create", "read", "exec"}}}, 201);
  auto other = daemon_->request("GET", shellPath(), "", false,
                                {{"Authorization", "Bearer " + key["token"].get<std::string>()},
                                 {"Upgrade", "websocket"},
                                 {"Connection", "Upgrade"},
                                 {"Sec-WebSocket-Version", "13"},
                                 {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}});
  EXPECT_EQ(other.status, 404);
}

TEST_F(Shell, ProtocolAbuseClosesThatSessionOnly) {
  // Unmasked client frames break RFC 6455: moatd closes with 1002.
  auto raw = daemon_->websocket(shellPath());
  ASSERT_EQ(raw.status, 101);
  std::string unmasked = websocket::encodeFrame(websocket::Opcode::kBinary, "echo hi\n", false);
  ASSERT_EQ(::send(raw.fd, unmasked.data(), unmasked.size(), MSG_NOSIGNAL), static_cast<ssize_t>(unmasked.size()));
  {
    websocket::Connection c(raw.fd, true, raw.rest);
    websocket::Message m;
    while (c.receive(m)) {
    }
    EXPECT_NE(c.closeReason().find("closed"), std::string::npos) << c.closeReason();
  }
  ::close(raw.fd);
  // A message over the 1 MiB limit, and nonsense control messages.
  Viewer v(daemon_->websocket(shellPath()));
  ASSERT_EQ(v.status(), 101);
  ASSERT_TRUE(v.socket().sendText("not json"));
  ASSERT_TRUE(v.socket().sendText(R"({"type":"resize","rows":0,"cols":5})"));
  ASSERT_TRUE(v.socket().sendText(R"({"type":"teleport"})"));
  ASSERT_TRUE(v.type("echo still-$((1+1))\n"));
  EXPECT_TRUE(v.waitFor("still-2")) << "bad control messages are answered, the session goes on";
  int errors = 0;
  for (const auto& c : v.controls()) errors += c["type"] == "error";
  EXPECT_EQ(errors, 3) << "and only those: hello is not an error";
  (void)v.socket().sendBinary(std::string((1u << 20) + 10, 'x'));
  v.finish();
  // The daemon keeps serving.
  EXPECT_EQ(exec(env_, {{"cmd", {"true"}}})["exit_code"], 0);
}

}  // namespace
}  // namespace moat::test
