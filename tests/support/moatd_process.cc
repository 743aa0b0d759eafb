#include "moatd_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "moat_process.h"
#include "os/file.h"

namespace moat::test {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace asio = boost::asio;

Moatd::Moatd(std::vector<std::string> extraArgs) : Moatd(std::move(extraArgs), {}) {}

Moatd::Moatd(std::vector<std::string> extraArgs, std::vector<std::string> extraEnv)
    : extraArgs_(std::move(extraArgs)), extraEnv_(std::move(extraEnv)) {
  char tmpl[] = "/tmp/moatd-test-XXXXXX";
  stateDir_ = ::mkdtemp(tmpl);
  logPath_ = stateDir_ + ".log";
  try {
    start();
  } catch (...) {
    removeState();  // no destructor runs for an object whose constructor threw
    throw;
  }
}

void Moatd::start() {
  pid_ = ::fork();
  if (pid_ == 0) {
    int log = ::open(logPath_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(log, 2);
    ::dup2(log, 1);
    std::string bin = binDir() + "/moatd";
    std::string storage = "MOAT_STORAGE_GB=8";
    std::vector<char*> envp = {storage.data()};
    for (auto& e : extraEnv_) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = {bin, "--state", stateDir_, "--listen", "127.0.0.1:0"};
    args.insert(args.end(), extraArgs_.begin(), extraArgs_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  // Serving when the socket answers /healthz (bounded wait).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("moatd exited at start: " + log());
    }
    try {
      if (request("GET", "/healthz", "", false).status == 200) break;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto token = os::readFile(stateDir_ + "/master-token");
  token_ = token.ok() ? token.value() : "";
  while (!token_.empty() && token_.back() == '\n') token_.pop_back();
}

void Moatd::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  // A clean stop is exit 0; in a sanitizer build a leak or any other
  // finding at exit is not, and fails the test that ran this moatd.
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string text = log();
    ADD_FAILURE() << "moatd did not exit 0 on SIGTERM (status " << status << "); the end of its log:\n"
                  << text.substr(text.size() > 4000 ? text.size() - 4000 : 0);
  }
}

void Moatd::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int Moatd::waitExit() {
  if (pid_ <= 0) return -1;
  int status = -1;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

void Moatd::restart() {
  stop();
  start();
}

Moatd::~Moatd() {
  stop();
  removeState();
}

void Moatd::removeState() {
  // A test that failed half-way may have left the spawner (which outlives
  // moatd by design) with environments: ask it to destroy them and exit.
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::string sock = stateDir_ + "/spawner.sock";
  std::memcpy(addr.sun_path, sock.c_str(), std::min(sock.size(), sizeof addr.sun_path - 1));
  if (s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const char shutdown = 5;  // the spawner's shutdown request
    if (::send(s, &shutdown, 1, MSG_NOSIGNAL) == 1) {
      char reply[64];
      ssize_t ignored = ::recv(s, reply, sizeof reply, 0);  // answered once all is destroyed
      (void)ignored;
    }
  }
  if (s >= 0) ::close(s);
  ::umount2((stateDir_ + "/storage").c_str(), MNT_DETACH);
  // A moatd killed with SIGKILL leaves its egress namespace mounted (the
  // next moatd would adopt it).
  ::umount2((stateDir_ + "/run/egress.netns").c_str(), MNT_DETACH);
  (void)os::removeTree(stateDir_);
  ::unlink(logPath_.c_str());
}

std::string Moatd::log() {
  auto text = os::readFile(logPath_);
  return text.ok() ? text.value() : "";
}

namespace {

HttpResult resultOf(http::response<http::string_body> res) {
  HttpResult r;
  r.status = res.result_int();
  r.contentType = std::string(res[http::field::content_type]);
  r.upgrade = std::string(res[http::field::upgrade]);
  r.retryAfter = std::string(res[http::field::retry_after]);
  r.mcpSessionId = std::string(res["Mcp-Session-Id"]);
  r.keepAlive = res.keep_alive();
  for (const auto& field : res) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = std::string(field.value());
  }
  r.body = std::move(res.body());
  return r;
}

// A request as the tests send it: `authorization` (when not empty) and
// `headers` set before the JSON body, which POST and PUT always have.
http::request<http::string_body> requestOf(const std::string& method, const std::string& target,
                                           const std::string& body, const std::string& authorization,
                                           const std::map<std::string, std::string>& headers = {}) {
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, "localhost");
  if (!authorization.empty()) req.set(http::field::authorization, authorization);
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty() || method == "POST" || method == "PUT") {
    if (req[http::field::content_type].empty()) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
  }
  return req;
}

}  // namespace

HttpResult Moatd::request(const std::string& method, const std::string& target, const std::string& body, bool withToken,
                          const std::map<std::string, std::string>& headers) {
  asio::io_context io;
  asio::local::stream_protocol::socket socket(io);
  socket.connect(asio::local::stream_protocol::endpoint(socketPath()));
  http::write(socket, requestOf(method, target, body, withToken ? "Bearer " + token_ : "", headers));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(256u << 20);
  http::read(socket, buffer, parser);
  return resultOf(parser.release());
}

struct HttpConnection::State {
  asio::io_context io;
  asio::local::stream_protocol::socket socket{io};
  beast::flat_buffer buffer;
};

HttpConnection::HttpConnection(const std::string& socketPath) : state_(std::make_unique<State>()) {
  state_->socket.connect(asio::local::stream_protocol::endpoint(socketPath));
}

HttpConnection::~HttpConnection() = default;

HttpResult HttpConnection::request(const std::string& method, const std::string& target, const std::string& token,
                                   const std::string& body) {
  http::write(state_->socket, requestOf(method, target, body, "Bearer " + token));  // HTTP/1.1: keep-alive
  return readAnswer();
}

HttpResult HttpConnection::raw(const std::string& bytes) {
  asio::write(state_->socket, asio::buffer(bytes));
  return readAnswer();
}

HttpResult HttpConnection::readAnswer() {
  if (state_->buffer.size() == 0) {
    struct pollfd p = {state_->socket.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) throw std::runtime_error("moatd sent no answer within 10 s");
  }
  http::response_parser<http::string_body> parser;
  parser.body_limit(16u << 20);
  http::read(state_->socket, state_->buffer, parser);
  return resultOf(parser.release());
}

int connectUnix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), std::min(path.size(), sizeof addr.sun_path - 1));
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

int connectLoopbackTcp(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in addr {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

namespace {

bool sendAll(int fd, const std::string& data) {
  size_t at = 0;
  while (at < data.size()) {
    ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// Reads up to the end of the response head; returns the status and leaves
// what follows the head in `rest`.
int readHead(int fd, std::string& rest) {
  std::string data;
  char buf[4096];
  for (;;) {
    auto end = data.find("\r\n\r\n");
    if (end != std::string::npos) {
      rest = data.substr(end + 4);
      std::string head = data.substr(0, end);
      if (head.size() < 12) return 0;
      return std::atoi(head.c_str() + 9);
    }
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return 0;
    data.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

EventStream::EventStream(EventStream&& other) noexcept
    : fd_(other.fd_),
      status_(other.status_),
      raw_(std::move(other.raw_)),
      decoded_(std::move(other.decoded_)),
      ended_(other.ended_) {
  other.fd_ = -1;
}

EventStream::~EventStream() { close(); }

void EventStream::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool EventStream::fill(int timeoutMs) {
  if (fd_ < 0) return false;
  struct pollfd p = {fd_, POLLIN, 0};
  if (::poll(&p, 1, timeoutMs) <= 0) return false;
  char buf[65536];
  ssize_t n = ::read(fd_, buf, sizeof buf);
  if (n <= 0) return false;
  raw_.append(buf, static_cast<size_t>(n));
  return true;
}

bool EventStream::nextLine(std::string& line, int timeoutMs) {
  for (;;) {
    auto nl = decoded_.find('\n');
    if (nl != std::string::npos) {
      line = decoded_.substr(0, nl);
      decoded_.erase(0, nl + 1);
      return true;
    }
    if (ended_) return false;
    // Decode whole chunks: "<hex>\r\n<data>\r\n", "0\r\n\r\n" at the end.
    auto crlf = raw_.find("\r\n");
    if (crlf != std::string::npos) {
      size_t size = std::strtoul(raw_.substr(0, crlf).c_str(), nullptr, 16);
      if (size == 0) {
        ended_ = true;
        continue;
      }
      if (raw_.size() >= crlf + 2 + size + 2) {
        decoded_ += raw_.substr(crlf + 2, size);
        raw_.erase(0, crlf + 2 + size + 2);
        continue;
      }
    }
    if (!fill(timeoutMs)) return false;
  }
}

EventStream Moatd::stream(const std::string& target, const std::map<std::string, std::string>& headers,
                          bool withToken) {
  int fd = connectUnix(socketPath());
  std::string req = "GET " + target + " HTTP/1.1\r\nHost: localhost\r\n";
  if (withToken) req += "Authorization: Bearer " + token_ + "\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  req += "\r\n";
  std::string rest;
  int status = fd >= 0 && sendAll(fd, req) ? readHead(fd, rest) : 0;
  return EventStream(fd, status, rest);
}

Moatd::Upgrade Moatd::websocket(const std::string& target, bool withToken,
                                const std::map<std::string, std::string>& headers) {
  Upgrade u;
  u.fd = connectUnix(socketPath());
  std::string req = "GET " + target +
                    " HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
  if (withToken) req += "Authorization: Bearer " + token_ + "\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  req += "\r\n";
  if (u.fd >= 0 && sendAll(u.fd, req)) u.status = readHead(u.fd, u.rest);
  return u;
}

}  // namespace moat::test
