// Ports and previews end to end (docs/PORTS.md): servers inside a real
// environment reached through moatd's API and preview hosts, and what must
// not be reached: another key's environment, the API from a preview host,
// a preview after its end. No host port is opened for any of it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "common/encoding.h"
#include "moat_process.h"
#include "moatd_fixture.h"
#include "moatd_process.h"
#include "websocket/connection.h"

namespace moat::test {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The servers inside: an HTTP app (8001), a WebSocket echo (8002) and three
// abusive ones: silent after accepting (8003), an endless response head
// (8004), an endless body (8005). `python3 -m http.server` serves
// /workspace on 8000 beside them.
constexpr const char* kServers = R"PY(
import base64, hashlib, http.server, json, socket, socketserver, threading, time

class App(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, code, body, headers=()):
        self.send_response(code)
        for k, v in headers: self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD": self.wfile.write(body)
    def do_GET(self):
        if self.path.startswith("/redirect?to="):
            self.reply(302, b"", [("Location", self.path[len("/redirect?to="):])])
        elif self.path == "/cookies":
            self.reply(200, b"ok", [("Set-Cookie", "app=1; Path=/"),
                                    ("Set-Cookie", "moat_session=evil; Domain=localhost; Path=/")])
        else:
            self.reply(200, json.dumps({"path": self.path, "headers": dict(self.headers.items())}).encode(),
                       [("Content-Type", "application/json")])
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.reply(201, b"got %d: " % len(body) + body[:32], [("Content-Type", "text/plain")])

class Threaded(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

def listener(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(64)
    return s

def recv_exact(c, buf, n):
    while len(buf) < n:
        chunk = c.recv(65536)
        if not chunk: raise EOFError
        buf += chunk
    return buf

def websocket_echo(c):
    data = b""
    while b"\r\n\r\n" not in data:
        data = recv_exact(c, data, len(data) + 1)
    head, buf = data.split(b"\r\n\r\n", 1)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        buf = recv_exact(c, buf, 2)
        op, n = buf[0] & 0x0F, buf[1] & 0x7F
        header = 2 + (2 if n == 126 else 0) + 4
        buf = recv_exact(c, buf, header)
        if n == 126: n = int.from_bytes(buf[2:4], "big")
        mask = buf[header - 4:header]
        buf = recv_exact(c, buf, header + n)
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(buf[header:header + n]))
        buf = buf[header + n:]
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        reply = b"echo:" + payload
        c.sendall(bytes([0x81, len(reply)]) + reply)

def silent(c):
    time.sleep(3600)

def endless_head(c):
    c.recv(65536)
    c.sendall(b"HTTP/1.1 200 OK\r\n")
    while True: c.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")

def endless_body(c):
    c.recv(65536)
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    while True: c.sendall(b"x" * 65536)

def accept_loop(s, handler):
    while True:
        c, _ = s.accept()
        def run(c=c):
            try: handler(c)
            except Exception: pass
            finally: c.close()
        threading.Thread(target=run, daemon=True).start()

app = Threaded(("127.0.0.1", 8001), App)
raw = [(listener(8002), websocket_echo), (listener(8003), silent), (listener(8004), endless_head),
       (listener(8005), endless_body)]
for s, h in raw: threading.Thread(target=accept_loop, args=(s, h), daemon=True).start()
open("/tmp/servers-ready", "w").close()
app.serve_forever()
)PY";

// A TCP connection to 127.0.0.1:port that sends `request` and reads the
// answer until the server closes (at most 10 s).
std::string overTcp(int port, const std::string& request) {
  int fd = connectLoopbackTcp(port);
  if (fd < 0) return "";
  ssize_t sent = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  (void)sent;
  std::string out;
  char buf[65536];
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// What listens in the host's network namespace that the proxy could have
// opened: moatd's own TCP listeners, and anything on the ports proxied
// here (8000-8005, 9999). Other engineers' daemons come and go beside
// these tests, so the rest of the host is not compared.
std::string hostListeners(pid_t moatd) {
  auto r = runProcess({"/usr/bin/ss", "-ltnpH"}, "", {});
  std::vector<std::string> found;
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string state, recvq, sendq, local;
    fields >> state >> recvq >> sendq >> local;
    const std::string port = local.substr(local.rfind(':') + 1);
    const bool proxied = port == "9999" || (port.size() == 4 && port.rfind("800", 0) == 0 && port[3] <= '5');
    if (proxied || line.find("pid=" + std::to_string(moatd) + ",") != std::string::npos) found.push_back(local);
  }
  std::sort(found.begin(), found.end());
  std::string out;
  for (const auto& s : found) out += s + "\n";
  return out;
}

// A WebSocket handshake on moatd's unix socket with this Host (the
// fixture's helper always sends Host: localhost).
Moatd::Upgrade websocketWithHost(const std::string& socketPath, const std::string& host, const std::string& target) {
  Moatd::Upgrade u;
  u.fd = connectUnix(socketPath);
  const std::string req = "GET " + target + " HTTP/1.1\r\nHost: " + host +
                          "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
  if (u.fd < 0 || ::send(u.fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return u;
  std::string got;
  char c;
  while (got.find("\r\n\r\n") == std::string::npos && ::read(u.fd, &c, 1) == 1) got += c;
  if (got.size() > 12) u.status = std::atoi(got.substr(9, 3).c_str());
  return u;
}

class Ports : public MoatdFixture {
 protected:
  void SetUp() override {
    if (!isRoot()) GTEST_SKIP() << "needs root: moatd creates namespaces, cgroups and mounts (CI runs as root)";
    daemon_ = std::make_unique<Moatd>(std::vector<std::string>{"--port-timeout", "2"});
  }

  // An environment running the servers above; the test fails if they do
  // not come up.
  std::string envWithServers(const json& body = json::object()) {
    std::string id = createEnv(body);
    startServers(id);
    return id;
  }

  // An environment that `key` (with the create scope) made, running the
  // servers above; "" when it could not be made (the test fails).
  std::string keysEnvWithServers(const json& key) {
    auto made = as(key["token"], "POST", "/v1/environments", "{}");
    EXPECT_EQ(made.status, 201) << made.body;
    if (made.status != 201) return "";
    std::string id = json::parse(made.body)["id"];
    startServers(id);
    return id;
  }

  // A preview of `port` of environment `id`, made by `key`.
  json previewAs(const json& key, const std::string& id, int port) {
    auto made = as(key["token"], "POST", "/v1/environments/" + id + "/previews", json{{"port", port}}.dump());
    EXPECT_EQ(made.status, 201) << made.body;
    return json::parse(made.body, nullptr, false);
  }

  // The servers above in environment `id` (the master token reaches any).
  void startServers(const std::string& id) {
    exec(id, {{"cmd", {"sh", "-c", "cat > /workspace/servers.py; echo 'hello from inside' > /workspace/hello.txt"}},
              {"stdin", kServers}});
    call("POST", "/v1/environments/" + id + "/processes", {{"cmd", {"python3", "/workspace/servers.py"}}}, 201);
    call("POST", "/v1/environments/" + id + "/processes",
         {{"cmd", {"python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/workspace"}}}, 201);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    bool up = false;
    while (!up && Clock::now() < deadline) {
      up = daemon_->request("GET", port(id, 8000) + "/hello.txt").status == 200 &&
           daemon_->request("GET", port(id, 8001) + "/").status == 200;
    }
    EXPECT_TRUE(up) << "the servers inside did not come up";
  }

  static std::string port(const std::string& id, int port) {
    return "/v1/environments/" + id + "/ports/" + std::to_string(port);
  }

  HttpResult as(const std::string& token, const std::string& method, const std::string& target,
                const std::string& body = "", std::map<std::string, std::string> headers = {}) {
    headers["Authorization"] = "Bearer " + token;
    return daemon_->request(method, target, body, false, headers);
  }

  // Polls (at most 10 s) until the audit events of `query` hold `needle`:
  // events are written by moatd's writer thread, and a connection's event
  // once moatd has let go of it.
  // Whether the log came to hold `needle`; when not, what it held of the
  // environment is in the failure.
  ::testing::AssertionResult eventSeen(const std::string& query, const std::string& needle) {
    if (eventsUntil(query, needle).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "no " << needle << " in " << query
                                         << "; the log held: " << daemon_->request("GET", "/v1/events").body;
  }

  // {"id", "port", "url", "expires_at"} of a new preview.
  json preview(const std::string& id, int port, int ttl = 0) {
    json body = {{"port", port}};
    if (ttl > 0) body["ttl_s"] = ttl;
    return call("POST", "/v1/environments/" + id + "/previews", body, 201);
  }

  // The preview URL's host ("<secret>.preview.localhost:PORT").
  static std::string hostOf(const json& p) {
    std::smatch m;
    std::string url = p.value("url", "");
    EXPECT_TRUE(std::regex_match(url, m, std::regex(R"(http://([0-9a-f]{32}\.preview\.localhost:(\d+))/)"))) << url;
    return m.size() > 1 ? m[1].str() : "";
  }

  HttpResult viaPreview(const json& p, const std::string& method, const std::string& target,
                        std::map<std::string, std::string> headers = {}) {
    headers["Host"] = hostOf(p);
    return daemon_->request(method, target, "", false, headers);
  }
};

TEST_F(Ports, TheApiProxyReachesServersInsideWithTheirFilesBodiesAndWebSockets) {
  const std::string before = hostListeners(daemon_->pid());
  EXPECT_NE(before.find("127.0.0.1:"), std::string::npos) << "moatd's own listener is seen: " << before;
  std::string id = envWithServers();
  auto file = daemon_->request("GET", port(id, 8000) + "/hello.txt");
  EXPECT_EQ(file.status, 200);
  EXPECT_EQ(file.body, "hello from inside\n");
  EXPECT_EQ(file.headers["content-security-policy"], "sandbox") << "a page from inside never acts as moatd's origin";
  EXPECT_EQ(hostListeners(daemon_->pid()), before) << "the proxy opened a port on the host";

  // A body, the path and query as sent, and none of moat's credentials.
  auto posted = daemon_->request("POST", port(id, 8001) + "/submit", std::string(100000, 'b'));
  EXPECT_EQ(posted.status, 201) << posted.body;
  EXPECT_EQ(posted.body, "got 100000: " + std::string(32, 'b'));
  auto seen = daemon_->request("GET", port(id, 8001) + "/a%20b/c?x=1&y=%2F", "", true,
                               {{"Cookie", "moat_session=abc; theme=dark"}, {"X-Moat-CSRF", "c"}});
  ASSERT_EQ(seen.status, 200) << seen.body;
  json inside = json::parse(seen.body);
  EXPECT_EQ(inside["path"], "/a%20b/c?x=1&y=%2F");
  const std::string headers = inside["headers"].dump();
  EXPECT_EQ(headers.find(daemon_->token()), std::string::npos) << headers;
  EXPECT_EQ(headers.find("moat_session"), std::string::npos) << headers;
  EXPECT_EQ(headers.find("X-Moat-CSRF"), std::string::npos) << headers;
  EXPECT_NE(headers.find("theme=dark"), std::string::npos) << headers;
  // Cookies an app sets never land on moatd's origin.
  auto cookies = daemon_->request("GET", port(id, 8001) + "/cookies");
  EXPECT_EQ(cookies.status, 200);
  EXPECT_EQ(cookies.headers.count("set-cookie"), 0u);

  // A WebSocket, both ways.
  auto ws = daemon_->websocket(port(id, 8002) + "/echo");
  ASSERT_EQ(ws.status, 101) << ws.rest;
  {
    websocket::Connection socket(ws.fd, true, ws.rest);
    for (const char* text : {"one", "two"}) {
      ASSERT_TRUE(socket.sendText(text));
      websocket::Message m;
      ASSERT_TRUE(socket.receive(m));
      EXPECT_EQ(m.data, std::string("echo:") + text);
    }
    EXPECT_EQ(hostListeners(daemon_->pid()), before) << "while a WebSocket is tunnelled";
    socket.close(1000, "");
  }
  ::close(ws.fd);

  // Nothing listening, and bad ports.
  auto none = daemon_->request("GET", port(id, 9999) + "/");
  EXPECT_EQ(none.status, 502);
  EXPECT_NE(none.body.find("port_unreachable"), std::string::npos) << none.body;
  for (const char* bad : {"0", "65536", "http", "-1", "080000"}) {
    auto r = daemon_->request("GET", "/v1/environments/" + id + "/ports/" + bad + "/");
    EXPECT_EQ(r.status, 400) << bad << " -> " << r.body;
    EXPECT_NE(r.body.find("\"port"), std::string::npos) << r.body;
  }
  EXPECT_EQ(hostListeners(daemon_->pid()), before) << "the proxy opened a port on the host";

  // One audit event per connection.
  EXPECT_TRUE(eventSeen("?type=port.connection&environment=" + id, "\"upgraded\":true"));
  EXPECT_TRUE(eventSeen("?type=port.connection&environment=" + id, "\"status\":502"));
}

TEST_F(Ports, AnEnvironmentWithoutNetworkIsReachedAndStillReachesNothing) {
  std::string id = envWithServers({{"network", "none"}});
  EXPECT_EQ(call("GET", "/v1/environments/" + id + "/network", nullptr, 200)["network"]["mode"], "none");
  auto file = daemon_->request("GET", port(id, 8000) + "/hello.txt");
  EXPECT_EQ(file.status, 200);
  EXPECT_EQ(file.body, "hello from inside\n");
  // Still only its loopback: no route out appeared.
  json routes =
      exec(id, {{"cmd", {"sh", "-c", "wc -l < /proc/net/route; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}}});
  EXPECT_EQ(routes["stdout"], "1\nlo\n");
}

TEST_F(Ports, KeysNeedThePortsScopeAndTheirOwnEnvironment) {
  std::string id = envWithServers();
  json withPorts = call("POST", "/v1/keys", {{"scopes", {"create", "ports"}}}, 201);
  json without = call("POST", "/v1/keys", {{"scopes", {"create", "read", "exec", "files"}}}, 201);
  auto refused = as(without["token"], "GET", port(id, 8000) + "/hello.txt");
  EXPECT_EQ(refused.status, 403) << refused.body;
  EXPECT_NE(refused.body.find("ports"), std::string::npos);
  auto foreign = as(withPorts["token"], "GET", port(id, 8000) + "/hello.txt");
  EXPECT_EQ(foreign.status, 404) << "another key's environment looks like none: " << foreign.body;
  EXPECT_EQ(as(withPorts["token"], "POST", "/v1/environments/" + id + "/previews", R"({"port":8000})").status, 404);
  auto anonymous = daemon_->request("GET", port(id, 8000) + "/hello.txt", "", false);
  EXPECT_EQ(anonymous.status, 401);
  // Its own environment: yes (the servers run in the master's; one of its own answers 502).
  auto own = as(withPorts["token"], "POST", "/v1/environments", "{}");
  ASSERT_EQ(own.status, 201) << own.body;
  std::string ownId = json::parse(own.body)["id"];
  auto mine = as(withPorts["token"], "GET", port(ownId, 8000) + "/");
  EXPECT_EQ(mine.status, 502) << mine.body;
  EXPECT_EQ(as(withPorts["token"], "POST", "/v1/environments/" + ownId + "/previews", R"({"port":8000})").status, 201);
}

TEST_F(Ports, APreviewUrlOpensOnePortWithoutTheTokenUntilItIsRevoked) {
  std::string id = envWithServers();
  const std::string before = hostListeners(daemon_->pid());
  json p = preview(id, 8000);
  EXPECT_EQ(p["port"], 8000);
  EXPECT_TRUE(p.contains("id") && p.contains("expires_at"));
  const std::string host = hostOf(p);

  // Over TCP, as a browser would open it (*.localhost is loopback).
  const int moatdPort = std::stoi(host.substr(host.rfind(':') + 1));
  std::string page = overTcp(moatdPort, "GET /hello.txt HTTP/1.1\r\nHost: " + host + "\r\n\r\n");
  EXPECT_EQ(page.rfind("HTTP/1.1 200", 0), 0u) << page;
  EXPECT_NE(page.find("hello from inside"), std::string::npos) << page;
  EXPECT_EQ(page.find("Content-Security-Policy: sandbox"), std::string::npos) << "a preview is an origin of its own";
  // And over the unix socket with its Host.
  EXPECT_EQ(viaPreview(p, "GET", "/hello.txt").body, "hello from inside\n");

  // A preview host never reaches the API: /v1/... goes to the server inside.
  auto api = viaPreview(p, "GET", "/v1/environments", {{"Authorization", "Bearer " + daemon_->token()}});
  EXPECT_EQ(api.status, 404) << api.body;
  EXPECT_EQ(api.body.find("\"environments\""), std::string::npos) << api.body;
  EXPECT_EQ(api.contentType.find("json"), std::string::npos) << "python's own 404 page, not moatd's: " << api.body;
  // Only host-only cookies from a preview; never moat's token or session inside.
  json app = preview(id, 8001);
  auto cookies = viaPreview(app, "GET", "/cookies");
  EXPECT_EQ(cookies.headers["set-cookie"], "app=1; Path=/") << "a Domain cookie could reach moatd's origin";
  auto headers = viaPreview(app, "GET", "/headers",
                            {{"Authorization", "Bearer " + daemon_->token()}, {"Cookie", "moat_session=x; a=1"}});
  EXPECT_EQ(headers.body.find(daemon_->token()), std::string::npos) << headers.body;
  EXPECT_EQ(headers.body.find("moat_session"), std::string::npos) << headers.body;
  auto basic = viaPreview(app, "GET", "/headers", {{"Authorization", "Basic YXBwOnB3"}});
  EXPECT_NE(basic.body.find("Basic YXBwOnB3"), std::string::npos) << "the app's own credentials pass";
  // A WebSocket through a preview.
  json echo = preview(id, 8002);
  auto ws = websocketWithHost(daemon_->socketPath(), hostOf(echo), "/");
  ASSERT_EQ(ws.status, 101) << ws.rest;
  {
    websocket::Connection socket(ws.fd, true, ws.rest);
    ASSERT_TRUE(socket.sendText("via preview"));
    websocket::Message m;
    ASSERT_TRUE(socket.receive(m));
    EXPECT_EQ(m.data, "echo:via preview");
  }
  ::close(ws.fd);

  // Listed without secrets; a wrong secret is nothing.
  json listed = call("GET", "/v1/environments/" + id + "/previews", nullptr, 200);
  EXPECT_EQ(listed["previews"].size(), 3u);
  EXPECT_EQ(listed.dump().find(host.substr(0, 32)), std::string::npos) << "the secret is shown only once";
  std::string wrong = host;
  wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
  auto guessed = daemon_->request("GET", "/hello.txt", "", false, {{"Host", wrong}});
  EXPECT_EQ(guessed.status, 404);
  EXPECT_NE(guessed.body.find("not_found"), std::string::npos);
  EXPECT_EQ(daemon_->request("GET", "/v1/environments", "", true, {{"Host", "preview.localhost"}}).status, 404);
  // A wrong secret is refused before its body is read: a head announcing
  // 16 MB gets its 404 at once, with none of the body sent.
  auto unread = HttpConnection(daemon_->socketPath())
                    .raw("POST /upload HTTP/1.1\r\nHost: " + wrong + "\r\nContent-Length: 16000000\r\n\r\n");
  EXPECT_EQ(unread.status, 404) << unread.body;

  EXPECT_EQ(hostListeners(daemon_->pid()), before) << "a preview opened a port on the host";

  // Revoked: at once.
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id + "/previews/" + p["id"].get<std::string>()).status,
            204);
  EXPECT_EQ(viaPreview(p, "GET", "/hello.txt").status, 404);
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id + "/previews/" + p["id"].get<std::string>()).status,
            404);
  EXPECT_TRUE(eventSeen("?type=preview.&environment=" + id, "preview.created"));
  EXPECT_TRUE(eventSeen("?type=preview.&environment=" + id, "preview.revoked"));
  EXPECT_TRUE(eventSeen("?type=port.connection&environment=" + id, "\"via\":\"preview\""));
  EXPECT_EQ(daemon_->request("GET", "/v1/events").body.find(host.substr(0, 32)), std::string::npos)
      << "no secret in the audit log";

  // Bad requests name their field.
  auto badPort = daemon_->request("POST", "/v1/environments/" + id + "/previews", R"({"port":0})");
  EXPECT_EQ(badPort.status, 400);
  EXPECT_NE(badPort.body.find("port"), std::string::npos);
  auto badTtl = daemon_->request("POST", "/v1/environments/" + id + "/previews", R"({"port":80,"ttl_s":99999999})");
  EXPECT_EQ(badTtl.status, 400);
  EXPECT_NE(badTtl.body.find("ttl_s"), std::string::npos);
}

TEST_F(Ports, APreviewEndsAtItsExpiryAndWithItsEnvironment) {
  std::string id = envWithServers();
  json brief = preview(id, 8000, 1);
  json lasting = preview(id, 8000);
  EXPECT_EQ(viaPreview(lasting, "GET", "/hello.txt").status, 200);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  int status = 200;
  while (status == 200 && Clock::now() < deadline) status = viaPreview(brief, "GET", "/hello.txt").status;
  EXPECT_EQ(status, 404) << "still open after its ttl";
  EXPECT_EQ(daemon_->request("DELETE", "/v1/environments/" + id).status, 204);
  EXPECT_EQ(viaPreview(lasting, "GET", "/hello.txt").status, 404) << "its environment is gone";
  EXPECT_TRUE(eventSeen("?type=preview.revoked&environment=" + id, "environment ended"));
}

// Under moatd's origin a redirect from inside stays under the port's own
// path (the board's session cookie would follow it to another
// environment's port or to the API); previews, an origin of their own,
// pass it as it is.
TEST_F(Ports, ARedirectFromInsideStaysUnderThePortsPath) {
  std::string id = envWithServers();
  const std::string prefix = port(id, 8001);
  for (const auto& [to, expected] : std::vector<std::pair<std::string, std::string>>{
           {"/login", prefix + "/login"},
           {"/v1/environments/abcdefabcdef/ports/80/x", prefix + "/v1/environments/abcdefabcdef/ports/80/x"},
           {"../../../../v1/keys", prefix + "/v1/keys"},
           {"http://localhost/v1/keys", prefix + "/v1/keys"},
           {"https://example.com/", "https://example.com/"}}) {
    auto r = daemon_->request("GET", prefix + "/redirect?to=" + to);
    EXPECT_EQ(r.status, 302) << r.body;
    EXPECT_EQ(r.headers["location"], expected) << to;
  }
  json p = preview(id, 8001);
  EXPECT_EQ(viaPreview(p, "GET", "/redirect?to=/login").headers["location"], "/login");
}

// moat's credentials stay with moatd whatever their form: another case, a
// second Authorization header after the app's own, Basic's user or
// password; the app's own credentials alone pass.
TEST_F(Ports, MoatsCredentialsNeverReachAPreviewsServerInAnyForm) {
  std::string id = envWithServers();
  json key = call("POST", "/v1/keys", {{"scopes", {"read"}}}, 201);
  const std::string keyToken = key["token"], master = daemon_->token();
  json app = preview(id, 8001);
  auto headersSeen = [&](const std::vector<std::string>& authorizations) {
    std::string req = "GET /headers HTTP/1.1\r\nHost: " + hostOf(app) + "\r\n";
    for (const auto& a : authorizations) req += "Authorization: " + a + "\r\n";
    req += "Connection: close\r\n\r\n";
    HttpConnection c(daemon_->socketPath());
    return c.raw(req).body;
  };
  auto b64 = [](const std::string& s) { return base64Encode(s); };
  for (const auto& forms : std::vector<std::vector<std::string>>{
           {"bearer " + master},
           {"BEARER " + keyToken},
           {"Bearer app-token", "Bearer " + master},
           {"Bearer app-token", "Token " + keyToken},
           {"Basic " + b64("user:" + keyToken)},
           {"Basic " + b64(master + ":")},
           {"basic  " + b64("x:" + master)},
           {"Basic " + b64("x:" + keyToken).substr(0, b64("x:" + keyToken).find('='))}}) {
    std::string seen = headersSeen(forms);
    EXPECT_NE(seen.find("\"path\""), std::string::npos) << "the server answered: " << seen;
    EXPECT_EQ(seen.find(master), std::string::npos) << forms.back() << ": " << seen;
    EXPECT_EQ(seen.find(keyToken), std::string::npos) << forms.back() << ": " << seen;
    EXPECT_EQ(seen.find("app-token"), std::string::npos) << "with a moat credential beside it, none passes";
  }
  EXPECT_NE(headersSeen({"Bearer app-token"}).find("Bearer app-token"), std::string::npos);
  EXPECT_NE(headersSeen({"Basic " + b64("app:pw")}).find("Basic " + b64("app:pw")), std::string::npos);
}

// A key's previews end with the key: what it opened to anyone does not
// outlive its revocation; the master's previews are untouched.
TEST_F(Ports, APreviewEndsWhenTheKeyThatMadeItIsRevoked) {
  json key = call("POST", "/v1/keys", {{"scopes", {"create", "ports"}}}, 201);
  std::string id = keysEnvWithServers(key);
  json byKey = previewAs(key, id, 8000);
  ASSERT_FALSE(HasFailure());
  json byMaster = preview(id, 8000);
  EXPECT_EQ(viaPreview(byKey, "GET", "/hello.txt").status, 200);
  EXPECT_EQ(daemon_->request("DELETE", "/v1/keys/" + key["id"].get<std::string>()).status, 204);
  EXPECT_EQ(viaPreview(byKey, "GET", "/hello.txt").status, 404) << "its key was revoked";
  EXPECT_EQ(viaPreview(byMaster, "GET", "/hello.txt").status, 200);
  EXPECT_TRUE(eventSeen("?type=preview.revoked&environment=" + id, "key revoked"));
}

TEST_F(Ports, AbusiveServersInsideCannotHangMoatdOrOtherRequests) {
  std::string id = envWithServers();
  // Silent after accepting: 504 at the deadline (2 s here), others served meanwhile.
  auto start = Clock::now();
  auto silent = std::async(std::launch::async, [&] { return daemon_->request("GET", port(id, 8003) + "/"); });
  auto other = daemon_->request("GET", port(id, 8000) + "/hello.txt");
  EXPECT_EQ(other.status, 200);
  EXPECT_EQ(silent.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "another request waited for the silent one";
  auto late = silent.get();
  EXPECT_EQ(late.status, 504) << late.body;
  EXPECT_NE(late.body.find("port_timeout"), std::string::npos);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));

  // An endless head: 502 at the size limit.
  auto huge = daemon_->request("GET", port(id, 8004) + "/");
  EXPECT_EQ(huge.status, 502);
  EXPECT_NE(huge.body.find("port_bad_response"), std::string::npos) << huge.body;

  // An endless body streams; its client leaving ends it, and others are served meanwhile.
  int fd = connectUnix(daemon_->socketPath());
  ASSERT_GE(fd, 0);
  const std::string req = "GET " + port(id, 8005) + "/ HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " +
                          daemon_->token() + "\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  size_t got = 0;
  char buf[65536];
  while (got < (4u << 20)) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  EXPECT_EQ(daemon_->request("GET", port(id, 8000) + "/hello.txt").status, 200);
  ::close(fd);
  // Its connection's event is written once moatd let go of it.
  EXPECT_TRUE(eventSeen("?type=port.connection&environment=" + id, "\"port\":8005"))
      << "the endless response still holds moatd after its client left";
  EXPECT_EQ(daemon_->request("GET", "/healthz").status, 200);
}

// Proxied connections, which a preview URL lets anyone open and hold,
// take at most half of moatd's places, and one owner's (the preview's
// maker's) at most a quarter: here 8 and 4 of --max-connections 16.
TEST_F(Ports, ProxiedConnectionsTakeAtMostHalfOfMoatdsPlacesAndAQuarterPerOwner) {
  daemon_ = std::make_unique<Moatd>(std::vector<std::string>{"--port-timeout", "2", "--max-connections", "16"});
  auto keyEnvWithPreview = [&](json& key) {
    key = call("POST", "/v1/keys", {{"scopes", {"create", "read", "ports"}}}, 201);
    return previewAs(key, keysEnvWithServers(key), 8002);
  };
  json mine = preview(envWithServers(), 8002);
  json keyA, keyB;
  json a = keyEnvWithPreview(keyA);
  json b = keyEnvWithPreview(keyB);
  std::vector<int> open;
  auto hold = [&](const json& p) {
    auto u = websocketWithHost(daemon_->socketPath(), hostOf(p), "/");
    if (u.status == 101)
      open.push_back(u.fd);
    else if (u.fd >= 0)
      ::close(u.fd);
    return u.status;
  };
  for (int i = 0; i < 4; ++i) ASSERT_EQ(hold(mine), 101) << i;
  auto overOwner = viaPreview(mine, "GET", "/");
  EXPECT_EQ(overOwner.status, 429) << overOwner.body;
  EXPECT_NE(overOwner.body.find("this preview's maker has 4 proxied connections open already"), std::string::npos)
      << overOwner.body;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(hold(a), 101) << i;
  // Eight open: moatd's half is taken, whoever asks next.
  auto overMoatd = viaPreview(b, "GET", "/");
  EXPECT_EQ(overMoatd.status, 429) << overMoatd.body;
  EXPECT_NE(overMoatd.body.find("moatd has 8 (half of its --max-connections"), std::string::npos) << overMoatd.body;
  // The API keeps its half.
  EXPECT_EQ(daemon_->request("GET", "/healthz").status, 200);
  EXPECT_EQ(as(keyB["token"], "GET", "/v1/environments").status, 200);
  // One closed: its place goes back once its relay has ended.
  ::close(open.front());
  open.erase(open.begin());
  int status = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (status != 101 && Clock::now() < deadline) status = hold(b);
  EXPECT_EQ(status, 101);
  for (int fd : open) ::close(fd);
}

TEST_F(Ports, TheCliPrintsAPreviewUrlListsAndRevokes) {
  std::string id = envWithServers();
  auto moat = [&](std::vector<std::string> args) {
    args.insert(args.begin(), binDir() + "/moat");
    return runProcess(args, "", {{"MOAT_STATE", daemon_->stateDir()}});
  };
  auto created = moat({"port", id, "8000", "--ttl", "600"});
  ASSERT_EQ(created.exitCode, 0) << created.err;
  std::string url = created.out.substr(0, created.out.find('\n'));
  json p = {{"url", url}};
  EXPECT_EQ(viaPreview(p, "GET", "/hello.txt").body, "hello from inside\n");
  auto listed = moat({"port", "ls", id, "--json"});
  ASSERT_EQ(listed.exitCode, 0) << listed.err;
  json list = json::parse(listed.out);
  ASSERT_EQ(list.size(), 1u);
  auto revoked = moat({"port", "revoke", id, list[0]["id"]});
  EXPECT_EQ(revoked.exitCode, 0) << revoked.err;
  EXPECT_EQ(viaPreview(p, "GET", "/hello.txt").status, 404);
  EXPECT_NE(moat({"port", id, "70000"}).exitCode, 0);
}

}  // namespace
}  // namespace moat::test
