#include "api/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/sha.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstring>
#include <optional>

#include "common/encoding.h"
#include "common/hex.h"
#include "os/socket.h"

namespace moat::api {
namespace {

// Connections the kernel holds before moatd accepts them. A flood of them
// (each accepted one costs a thread) must not turn a newcomer away: with
// 512, a burst of ~900 made a health check's non-blocking connect fail
// with EAGAIN while moatd caught up (security.exhaustion, API flood, under
// load). The kernel caps it at net.core.somaxconn (4096 by default).
constexpr int kListenBacklog = 4096;

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace asio = boost::asio;

std::string errorBody(const std::string& code, const std::string& message) {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  return R"({"error":{"code":")" + code + R"(","message":")" + escaped + R"("}})";
}

HttpRequest requestHead(const http::request<http::string_body>& req, const std::string& remote) {
  HttpRequest request;
  request.remote = remote;
  request.method = std::string(req.method_string());
  request.target = std::string(req.target());
  parseTarget(request.target, request);
  request.authorization = std::string(req[http::field::authorization]);
  request.cookie = std::string(req[http::field::cookie]);
  request.csrf = std::string(req["X-Moat-CSRF"]);
  request.host = std::string(req[http::field::host]);
  request.origin = std::string(req[http::field::origin]);
  request.prefer = std::string(req["Prefer"]);
  request.lastEventId = std::string(req["Last-Event-ID"]);
  request.accept = std::string(req[http::field::accept]);
  request.contentType = std::string(req[http::field::content_type]);
  request.mcpSessionId = std::string(req["Mcp-Session-Id"]);
  request.mcpProtocolVersion = std::string(req["MCP-Protocol-Version"]);
  request.secFetchSite = std::string(req["Sec-Fetch-Site"]);
  for (const auto& field : req)
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  auto lower = [](std::string v) {
    for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return v;
  };
  request.websocketKey = std::string(req[http::field::sec_websocket_key]);
  request.websocketUpgrade = request.method == "GET" && lower(std::string(req[http::field::upgrade])) == "websocket" &&
                             lower(std::string(req[http::field::connection])).find("upgrade") != std::string::npos &&
                             req[http::field::sec_websocket_version] == "13" && !request.websocketKey.empty();
  return request;
}

std::string websocketAccept(const std::string& key) {
  std::string joined = key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  unsigned char digest[SHA_DIGEST_LENGTH];
  ::SHA1(reinterpret_cast<const unsigned char*>(joined.data()), joined.size(), digest);
  return base64Encode(std::string(reinterpret_cast<const char*>(digest), sizeof digest));
}

template <class Stream>
bool writeRaw(Stream& stream, const std::string& data) {
  beast::error_code ec;
  asio::write(stream, asio::buffer(data), ec);
  return !ec;
}

// A streamed response: chunked, closed when the producer returns.
template <class Stream>
void streamBody(Stream& stream, const HttpResponse& response) {
  // A client that stops reading must not hold the thread forever.
  struct timeval sendLimit = {60, 0};
  ::setsockopt(stream.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &sendLimit, sizeof sendLimit);
  std::string head = "HTTP/1.1 " + std::to_string(response.status) +
                     " OK\r\nServer: moatd\r\nContent-Type: " + response.contentType +
                     "\r\nCache-Control: no-store\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  if (!writeRaw(stream, head)) return;
  bool open = true;
  response.stream([&](const std::string& chunk) {
    if (!open || chunk.empty()) return open;
    char size[20];
    std::snprintf(size, sizeof size, "%zx\r\n", chunk.size());
    open = writeRaw(stream, size + chunk + "\r\n");
    return open;
  });
  if (open) writeRaw(stream, "0\r\n\r\n");
}

template <class Stream>
void upgradeToWebSocket(Stream& stream, const HttpRequest& request, beast::flat_buffer& buffer,
                        const HttpResponse& response) {
  std::string head =
      "HTTP/1.1 101 Switching Protocols\r\nServer: moatd\r\nUpgrade: websocket\r\n"
      "Connection: Upgrade\r\nSec-WebSocket-Accept: " +
      websocketAccept(request.websocketKey) + "\r\n\r\n";
  if (!writeRaw(stream, head)) return;
  int fd = stream.native_handle();
  struct timeval none = {0, 0};  // a terminal may sit idle for hours
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  std::string pending(static_cast<const char*>(buffer.data().data()), buffer.data().size());
  buffer.consume(buffer.size());
  websocket::Connection socket(fd, false, std::move(pending));
  response.websocket(socket);
  socket.close(1000, "");
}

// The largest body of a refused request that is read (and dropped) to keep
// its connection open; a larger one closes the connection unread.
constexpr uint64_t kDrainBytes = 64u << 10;
// After such an answer, what the client still sends is dropped until it
// closes, stays silent this long, or this much time has passed.
constexpr std::chrono::milliseconds kLingerIdle{2000};
constexpr std::chrono::seconds kLingerTotal{30};

// `mark(busy)` tells the server whether a request is in progress (false:
// the connection waits for the next one); it answers false once the server
// has closed the connection for a newcomer or is stopping, and then no
// request starts (one already read may still write its answer).
template <class Stream>
void serveStream(Stream& stream, const Handler& handler, const PreflightHandler& preflight, const ServerLimits& limits,
                 const std::string& remote, const std::function<bool(bool busy)>& mark) {
  beast::flat_buffer buffer;
  for (;;) {
    if (!mark(false)) return;
    http::request_parser<http::string_body> parser;
    parser.body_limit(limits.maxBodyBytes);
    parser.header_limit(static_cast<uint32_t>(limits.maxHeaderBytes));
    beast::error_code ec;
    http::read_header(stream, buffer, parser, ec);
    if (!ec && !mark(true)) return;
    std::optional<HttpResponse> early;
    std::shared_ptr<void> hold;  // released after the answer (end of this iteration)
    // Only "chunked" frames a body whose end moatd can find; with any other
    // Transfer-Encoding the body would be read as the next request.
    const bool badFraming = !ec && !parser.get()[http::field::transfer_encoding].empty() && !parser.chunked();
    if (badFraming) {
      early = HttpResponse();
      early->status = 400;
      early->body = errorBody("bad_request", "unsupported Transfer-Encoding (only chunked)");
    } else if (!ec && preflight) {
      Preflight decision = preflight(requestHead(parser.get(), remote));
      hold = std::move(decision.hold);
      if (decision.reject) {
        early = std::move(decision.response);
      } else {
        parser.body_limit(decision.bodyLimit);
      }
    }
    bool drained = false;  // a refused request's small body, read and dropped
    if (!ec && !early) {
      http::read(stream, buffer, parser, ec);
    } else if (!ec && !badFraming && !parser.chunked() && parser.content_length().value_or(0) <= kDrainBytes &&
               parser.get()[http::field::expect].empty()) {
      // So the connection can go on: a client told to slow down keeps it.
      // (One that waits for "100 Continue" is answered at once instead.)
      // Meanwhile the connection counts as idle: one that never sends its
      // body is closed for a newcomer at the connection limit, as an idle
      // one is, and holds no place that the busy ones need. (Not while the
      // server stops: the answer goes out at once, and the connection ends.)
      if (mark(false)) {
        parser.body_limit(kDrainBytes);
        beast::error_code drainEc;
        http::read(stream, buffer, parser, drainEc);
        drained = !drainEc;
      }
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor) {
      return;
    }
    HttpResponse response;
    bool keepAlive = false;
    bool tooLarge = false;  // answered 413 with the rest of the request unread
    unsigned version = 11;
    if (early) {
      response = std::move(*early);  // unless drained, the body was never read: close after
      version = parser.get().version();
      keepAlive = drained && parser.get().keep_alive();
    } else if (ec) {
      tooLarge = ec == http::error::body_limit || ec == http::error::header_limit;
      response.status = tooLarge ? 413 : 400;
      response.body =
          errorBody(tooLarge ? "too_large" : "bad_request",
                    tooLarge ? "request larger than the limit of " + std::to_string(limits.maxBodyBytes) + " bytes"
                             : "malformed HTTP request: " + ec.message());
    } else {
      auto& req = parser.get();
      version = req.version();
      keepAlive = req.keep_alive();
      HttpRequest request = requestHead(req, remote);
      request.body = std::move(req.body());
      try {
        response = handler(request);
        if (response.websocket && request.websocketUpgrade) {
          upgradeToWebSocket(stream, request, buffer, response);
          return;
        }
        if (response.stream) {
          streamBody(stream, response);
          return;
        }
        if (response.takeover) {
          std::string pending(static_cast<const char*>(buffer.data().data()), buffer.data().size());
          buffer.consume(buffer.size());
          response.takeover(stream.native_handle(), std::move(pending));
          return;
        }
      } catch (const std::exception& e) {
        response = HttpResponse();
        response.status = 500;
        response.body = errorBody("internal", e.what());
      }
    }
    http::response<http::string_body> res{static_cast<http::status>(response.status), version};
    res.set(http::field::server, "moatd");
    res.set(http::field::content_type, response.contentType);
    for (const auto& [name, value] : response.headers) res.set(name, value);
    // Not when the server has begun to stop (or a newcomer took this
    // connection's place): the client learns it must not send another.
    if (keepAlive && !mark(true)) keepAlive = false;
    res.keep_alive(keepAlive);
    res.body() = std::move(response.body);
    res.prepare_payload();
    http::write(stream, res, ec);
    // Refused with its body (or the rest of it) unread: the client may still
    // be sending, and closing now would reset the connection under it before
    // it reads why. Idle meanwhile (a newcomer at the limit, or the server's
    // stop, closes it like any idle one).
    if (!ec && !keepAlive && (early || tooLarge) && !drained && mark(false)) {
      hold.reset();  // the caller's place among its requests in progress, if it took one
      os::drainBeforeClose(stream.native_handle(), kLingerIdle, std::chrono::steady_clock::now() + kLingerTotal);
    }
    if (ec || !keepAlive) return;
  }
}

// The peer, as the audit log names it.
std::string peerOf(int fd, int family) {
  if (family == AF_UNIX) {
    struct ucred cred = {};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return "unix";
    return "unix pid=" + std::to_string(cred.pid) + " uid=" + std::to_string(cred.uid);
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "";
}

}  // namespace

std::string urlDecode(const std::string& s, bool plusIsSpace) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hexValue(s[i + 1]) >= 0 && hexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hexValue(s[i + 1]) * 16 + hexValue(s[i + 2])));
      i += 2;
    } else if (plusIsSpace && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

HttpServer::HttpServer(Handler handler, PreflightHandler preflight, ServerLimits limits, std::function<void()> refused)
    : handler_(std::move(handler)), preflight_(std::move(preflight)), limits_(limits), refused_(std::move(refused)) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::listenTcp(const std::string& hostPort) {
  auto colon = hostPort.rfind(':');
  if (colon == std::string::npos) return Error::make(Code::kInvalidArgument, "listen address needs host:port");
  std::string host = hostPort.substr(0, colon);
  int port = std::atoi(hostPort.substr(colon + 1).c_str());
  struct sockaddr_in addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr.sin_addr) != 1) {
    return Error::make(Code::kInvalidArgument, "listen address " + hostPort + " is not an IPv4 host:port");
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::fromErrno("socket");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, kListenBacklog) != 0) {
    int err = errno;
    ::close(fd);
    return Error::fromErrno("listen on " + hostPort, err);
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  tcpPort_ = ntohs(addr.sin_port);
  listenFds_.push_back(fd);
  acceptors_.emplace_back([this, fd] { acceptLoop(fd, false); });
  return {};
}

Status HttpServer::listenUnix(const std::string& path, std::optional<gid_t> group) {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return Error::make(Code::kInvalidArgument, "socket path too long: " + path);
  std::memcpy(addr.sun_path, path.data(), path.size());
  ::unlink(path.c_str());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::fromErrno("socket");
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, kListenBacklog) != 0) {
    int err = errno;
    ::close(fd);
    return Error::fromErrno("listen on " + path, err);
  }
  // Connecting takes write permission: bound with the umask's mode (no
  // write for others), then given to the group, or to root alone.
  if (group && (::chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0 || ::chmod(path.c_str(), 0660) != 0)) {
    int err = errno;
    ::close(fd);
    return Error::fromErrno("open " + path + " to its group", err);
  }
  if (!group) ::chmod(path.c_str(), 0600);
  listenFds_.push_back(fd);
  acceptors_.emplace_back([this, fd] { acceptLoop(fd, true); });
  return {};
}

size_t HttpServer::tcpPlaces() const {
  return limits_.maxConnections - (limits_.maxConnections >= 16 ? limits_.maxConnections / 16 : 0);
}

bool HttpServer::fullFor(bool local) const {
  if (active_ >= limits_.maxConnections) return true;
  return !local && activeTcp_ >= tcpPlaces();
}

void HttpServer::acceptLoop(int listenFd, bool unixSocket) {
  // Until stop() shuts the listener down; while stopping, newcomers get 503.
  for (;;) {
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_) return;
      if (errno == EMFILE || errno == ENFILE) {
        ::usleep(10000);  // out of fds: shed load rather than spin
        continue;
      }
      return;
    }
    // The places kept back are for moatd's own user (root) on the unix
    // socket: the members of --socket-group's group connect there too, and
    // count as TCP clients do.
    bool local = false;
    if (unixSocket) {
      struct ucred cred = {};
      socklen_t len = sizeof cred;
      local = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::geteuid();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    bool full = fullFor(local);
    if (full && !stopping_) {
      // Make room: close the connection that has waited longest for a
      // request. Idle connections cost a thread each; a client holding
      // hundreds open must not lock everyone else out. A TCP newcomer short
      // of TCP places takes a TCP connection's.
      const bool tcpOnly = !local && activeTcp_ >= tcpPlaces();
      auto oldest = connections_.end();
      for (auto it = connections_.begin(); it != connections_.end(); ++it) {
        if (it->second.busy || it->second.evicted || (tcpOnly && it->second.local)) continue;
        if (oldest == connections_.end() || it->second.since < oldest->second.since) oldest = it;
      }
      if (oldest != connections_.end()) {
        oldest->second.evicted = true;
        ::shutdown(oldest->first, SHUT_RDWR);  // its thread ends and gives back its place
        // Taken once that thread has ended: a burst of newcomers (the
        // backlog holds thousands) must not each evict one and start its
        // thread before the evicted ones are gone.
        full = !idle_.wait_for(lock, std::chrono::seconds(1), [this, local] { return !fullFor(local) || stopping_; });
      }
    }
    if (full || stopping_) {
      lock.unlock();
      static const std::string body = errorBody("unavailable", "too many connections; retry later");
      static const std::string busy =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
          "Content-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body;
      ssize_t ignored = ::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL);
      (void)ignored;
      // The answer and its end first; then what of the request already
      // arrived is read and dropped, so that closing does not reset the
      // connection (TCP sends a reset for unread data, and the client's
      // kernel may then drop the 503 before the client reads it).
      ::shutdown(fd, SHUT_WR);
      char sink[4096];
      for (int i = 0; i < 16 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
      }
      ::close(fd);
      if (refused_) refused_();
      continue;
    }
    ++active_;
    if (!local) ++activeTcp_;
    connections_[fd] = Connection{false, false, local, std::chrono::steady_clock::now()};
    std::thread([this, fd] { serve(fd); }).detach();
  }
}

void HttpServer::serve(int fd) {
  struct timeval idle = {limits_.idleTimeoutS, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof idle);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  const std::string remote = peerOf(fd, ss.ss_family);
  auto mark = [this, fd](bool busy) { return markBusy(fd, busy); };
  try {
    asio::io_context io;
    if (ss.ss_family == AF_UNIX) {
      asio::local::stream_protocol::socket socket(io, asio::local::stream_protocol(), fd);
      serveStream(socket, handler_, preflight_, limits_, remote, mark);
      socket.release();
    } else {
      asio::ip::tcp::socket socket(io, ss.ss_family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(), fd);
      serveStream(socket, handler_, preflight_, limits_, remote, mark);
      socket.release();
    }
  } catch (const std::exception&) {
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = connections_.find(fd);
  if (it != connections_.end() && !it->second.local) --activeTcp_;
  if (it != connections_.end()) connections_.erase(it);
  ::close(fd);
  --active_;
  idle_.notify_all();
}

bool HttpServer::markBusy(int fd, bool busy) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.evicted) return false;
  if (stopping_) return false;  // stop() waits for the answer in progress, not for more
  it->second.busy = busy;
  if (!busy) it->second.since = std::chrono::steady_clock::now();
  return true;
}

void HttpServer::beginStop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  idle_.notify_all();  // a newcomer waiting for an evicted connection's place is refused now
}

void HttpServer::stop() {
  if (stopped_.exchange(true)) return;
  beginStop();
  for (int fd : listenFds_) ::shutdown(fd, SHUT_RDWR);
  for (auto& t : acceptors_) t.join();
  for (int fd : listenFds_) ::close(fd);
  std::unique_lock<std::mutex> lock(mutex_);
  // A busy connection's request is told to end by its owner (moatd stops
  // waiting execs and approvals first): its answer, an error that says
  // why, still reaches the client.
  for (const auto& [fd, connection] : connections_) {
    if (!connection.busy) ::shutdown(fd, SHUT_RDWR);
  }
  if (!idle_.wait_for(lock, limits_.stopGrace, [this] { return active_ == 0; })) {
    for (const auto& [fd, connection] : connections_) ::shutdown(fd, SHUT_RDWR);
    idle_.wait(lock, [this] { return active_ == 0; });
  }
}

void parseTarget(const std::string& target, HttpRequest& request) {
  auto q = target.find('?');
  request.path = urlDecode(target.substr(0, q), false);
  request.query.clear();
  request.queryAll.clear();
  if (q == std::string::npos) return;
  std::string query = target.substr(q + 1);
  size_t start = 0;
  while (start <= query.size()) {
    size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    std::string pair = query.substr(start, end - start);
    if (!pair.empty()) {
      auto eq = pair.find('=');
      std::string key = urlDecode(pair.substr(0, eq), true);
      std::string value = eq == std::string::npos ? "" : urlDecode(pair.substr(eq + 1), true);
      request.query[key] = value;
      request.queryAll.emplace_back(key, value);
    }
    start = end + 1;
  }
}

}  // namespace moat::api
