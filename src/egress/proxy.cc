// The proxy's connection handling: a thread per connection from an
// environment, deciding by the policy and the gate, relaying with deadlines.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "common/text.h"
#include "egress/client_hello.h"
#include "egress/controller_internal.h"
#include "egress/http_target.h"

namespace moat::egress {
namespace {

namespace http = boost::beast::http;
using json = nlohmann::json;

constexpr size_t kMaxHead = 64 * 1024;

// Beast's synchronous stream concepts over a Channel: every wait has a
// deadline that moves with progress (an idle timeout), and while a request
// head is expected, reads also have one that does not: the head must be
// whole within `limit` of its first byte (of now, when it has begun
// already), however slowly it trickles in. The wait for that first byte is
// the idle timeout's (a kept-alive connection may rest between requests).
class ChannelStream {
 public:
  ChannelStream(Channel& c, std::chrono::milliseconds idle) : channel_(c), idle_(idle) {}
  void expectHead(std::chrono::milliseconds limit, bool begun) {
    headLimit_ = limit;
    until_.reset();
    if (begun) until_ = Clock::now() + limit;
  }
  void headDone() {
    headLimit_.reset();
    until_.reset();
  }
  template <class Buffers>
  size_t read_some(const Buffers& buffers, boost::system::error_code& ec) {
    ec = {};
    for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers); ++it) {
      boost::asio::mutable_buffer b = *it;
      if (b.size() == 0) continue;
      auto deadline = Clock::now() + idle_;
      if (until_ && *until_ < deadline) deadline = *until_;
      auto n = readWait(channel_, static_cast<char*>(b.data()), b.size(), deadline);
      if (!n.ok()) {
        ec = n.error().code == Code::kTimeout ? boost::asio::error::timed_out : boost::asio::error::connection_reset;
        return 0;
      }
      if (n.value() == 0) ec = boost::asio::error::eof;
      if (n.value() > 0 && headLimit_ && !until_) until_ = Clock::now() + *headLimit_;
      return n.value();
    }
    return 0;
  }
  template <class Buffers>
  size_t read_some(const Buffers& buffers) {
    boost::system::error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  // One write for the whole sequence: Beast hands a message head over as a
  // buffer per field, and each write here is a TLS record and, with
  // TCP_NODELAY, a packet of its own (a 7-field head went out as 7 records).
  template <class Buffers>
  size_t write_some(const Buffers& buffers, boost::system::error_code& ec) {
    ec = {};
    size_t total = 0, pieces = 0;
    boost::asio::const_buffer only;
    for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers); ++it) {
      boost::asio::const_buffer b = *it;
      if (b.size() == 0) continue;
      only = b;
      total += b.size();
      ++pieces;
    }
    if (pieces > 1) {
      joined_.resize(total);
      boost::asio::buffer_copy(boost::asio::buffer(joined_), buffers);
      only = boost::asio::buffer(joined_);
    }
    if (total > 0 &&
        !writeAll(channel_, static_cast<const char*>(only.data()), only.size(), Clock::now() + idle_).ok()) {
      ec = boost::asio::error::broken_pipe;
      return 0;
    }
    return total;
  }
  template <class Buffers>
  size_t write_some(const Buffers& buffers) {
    boost::system::error_code ec;
    size_t n = write_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  Channel& channel_;
  std::chrono::milliseconds idle_;
  std::optional<std::chrono::milliseconds> headLimit_;
  std::optional<Clock::time_point> until_;
  std::string joined_;
};

std::string denialResponse(int status, const std::string& reason, const std::string& message) {
  std::string body = "moat: " + message + "\n";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\nX-Moat-Egress: denied\r\n\r\n" + body;
}

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Reads until the end of an HTTP head (or kMaxHead) by `deadline`; what
// follows stays in `buffer`.
Result<size_t> readHead(Channel& c, std::string& buffer, Clock::time_point deadline) {
  char chunk[4096];
  while (true) {
    auto end = buffer.find("\r\n\r\n");
    if (end != std::string::npos) return end + 4;
    if (buffer.size() > kMaxHead) return Error::make(Code::kTooLarge, "request head larger than 64 KiB");
    MOAT_ASSIGN(size_t n, readWait(c, chunk, sizeof chunk, deadline));
    if (n == 0) return Error::make(Code::kEof, "connection closed before a request");
    buffer.append(chunk, n);
  }
}

// Copies one message (head already parsed, maybe edited) from `in` to `out`.
template <bool isRequest>
bool relayMessage(http::parser<isRequest, http::buffer_body>& p, ChannelStream& in, boost::beast::flat_buffer& inBuf,
                  ChannelStream& out, uint64_t& bytes, const std::function<void(size_t)>& limit) {
  http::serializer<isRequest, http::buffer_body> sr{p.get()};
  char buf[32 * 1024];
  boost::system::error_code ec;
  do {
    if (!p.is_done()) {
      p.get().body().data = buf;
      p.get().body().size = sizeof buf;
      http::read(in, inBuf, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return false;
      p.get().body().size = sizeof buf - p.get().body().size;
      p.get().body().data = buf;
      p.get().body().more = !p.is_done();
      bytes += p.get().body().size;
      if (limit) limit(p.get().body().size);
    } else {
      p.get().body().data = nullptr;
      p.get().body().size = 0;
      p.get().body().more = false;
    }
    http::write(out, sr, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return false;
  } while (!p.is_done() && !sr.is_done());
  return true;
}

// Replaces the value of every secret bound to `host` with its placeholder
// in the response's status line and header values.
void scrubSecrets(http::response_header<>& h, const std::vector<Secret>& secrets, const std::string& host) {
  std::vector<const Secret*> bound;
  for (const auto& s : secrets) {
    if (!s.value.empty() && s.boundTo(host)) bound.push_back(&s);
  }
  if (bound.empty()) return;
  auto scrub = [&](std::string& text) {
    bool changed = false;
    for (const Secret* s : bound) {
      for (size_t at = text.find(s->value); at != std::string::npos;
           at = text.find(s->value, at + s->placeholder.size())) {
        text.replace(at, s->value.size(), s->placeholder);
        changed = true;
      }
    }
    return changed;
  };
  std::string reason(h.reason());
  if (scrub(reason)) h.reason(reason);
  std::vector<std::pair<std::string, std::string>> fields;
  bool changed = false;
  for (const auto& f : h) {
    std::string value(f.value());
    changed = scrub(value) || changed;
    fields.emplace_back(std::string(f.name_string()), std::move(value));
  }
  if (!changed) return;
  for (const auto& [name, value] : fields) h.erase(name);
  for (const auto& [name, value] : fields) h.insert(name, value);
}

}  // namespace

void Controller::throttle(const std::shared_ptr<Env>& env, size_t bytes) {
  uint64_t rate = env->currentPolicy()->bandwidthBytesPerS;
  if (rate == 0 || bytes == 0) return;
  std::chrono::microseconds wait{0};
  {
    std::lock_guard<std::mutex> lock(env->mutex);
    auto now = Clock::now();
    double elapsed = std::chrono::duration<double>(now - env->refilled).count();
    env->refilled = now;
    env->tokens = std::min(static_cast<double>(rate), env->tokens + elapsed * static_cast<double>(rate));
    env->tokens -= static_cast<double>(bytes);
    if (env->tokens < 0)
      wait = std::chrono::microseconds(static_cast<int64_t>(-env->tokens * 1e6 / static_cast<double>(rate)));
  }
  if (wait.count() > 0) std::this_thread::sleep_for(wait);  // the rate limit itself: this connection waits its turn
}

Result<UniqueFd> Controller::connectUpstream(uint32_t address, uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Error::fromErrno("socket for upstream");
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(address);
  std::string where = formatIpv4(address) + ":" + std::to_string(port);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    if (errno != EINPROGRESS) return Error::fromErrno("connect to " + where);
    struct pollfd p {
      fd.get(), POLLOUT, 0
    };
    int r = ::poll(&p, 1, static_cast<int>(config_.connectTimeout.count()));
    if (r == 0) return Error::make(Code::kTimeout, "connect to " + where + " timed out");
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Error::fromErrno("connect to " + where, err);
  }
  return fd;
}

Decision Controller::authorize(const std::shared_ptr<Env>& env, const std::string& host, uint16_t port,
                               const std::string& method, const std::string& path) {
  Lookups lookups{gate_, [this](const std::string& name) { return resolver_.resolve(name); },
                  [this](uint32_t address) { return hostLocal(address); }};
  return egress::authorize(*env->currentPolicy(), Request{env->id, host, port, method, path}, lookups);
}

void Controller::serveConnection(const std::shared_ptr<Env>& env, UniqueFd client, Entry entry) {
  auto policy = env->currentPolicy();
  // Check and count at once: connections arriving together must not all
  // see room for one more.
  uint32_t open = env->connections.load();
  do {
    if (open >= policy->maxConnections) {
      record(env, false,
             {{"via", "proxy"},
              {"rule", "max_connections"},
              {"reason", "more than " + std::to_string(policy->maxConnections) + " connections open"}});
      if (entry == Entry::kForward) {
        std::string r = denialResponse(503, "Service Unavailable", "too many connections open from this environment");
        ::send(client.get(), r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      return;
    }
  } while (!env->connections.compare_exchange_weak(open, open + 1));
  struct Release {
    std::atomic<uint32_t>& c;
    ~Release() { --c; }
  } release{env->connections};
  sockaddr_in local{};
  socklen_t len = sizeof local;
  ::getsockname(client.get(), reinterpret_cast<sockaddr*>(&local), &len);
  uint32_t destination = ntohl(local.sin_addr.s_addr);
  uint16_t port = ntohs(local.sin_port);
  setNonBlocking(client.get());
  int one = 1;
  ::setsockopt(client.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  switch (entry) {
    case Entry::kForward:
      return handleForward(env, std::move(client));
    case Entry::kHttp: {
      auto channel = plainChannel(std::move(client));
      std::string host = formatIpv4(destination);
      if (auto name = standInName(env, destination)) host = *name;
      return handleHttp(env, *channel, "", port, nullptr, Decision{}, "transparent:" + host);
    }
    case Entry::kTls:
      return tlsTunnel(env, std::move(client), "", "", port, destination, "transparent", nullptr);
  }
}

void Controller::refuse(const std::shared_ptr<Env>& env, Channel& client, int status, const char* statusText,
                        json event, const std::string& why) {
  if (!event.contains("reason")) event["reason"] = why;
  record(env, false, std::move(event));
  auto deadline = Clock::now() + config_.headTimeout;
  if (!writeAll(client, denialResponse(status, statusText, why), deadline).ok()) return;
  // A client whose head trickled in past its deadline gets no more time.
  if (status == 408) return;
  // Bounded like a request head: a client that keeps sending cannot hold the
  // connection (and its place under max_connections) longer.
  lingerAfterAnswer(client, std::min<std::chrono::milliseconds>(config_.headTimeout, std::chrono::seconds(2)),
                    deadline);
}

std::string Controller::headTimedOut() const {
  return "the request head did not arrive whole within " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(config_.headTimeout).count()) + " s";
}

void Controller::handleForward(const std::shared_ptr<Env>& env, UniqueFd client) {
  int fd = client.get();
  auto channel = plainChannel(std::move(client));
  std::string buffer;
  auto headEnd = readHead(*channel, buffer, Clock::now() + config_.headTimeout);
  if (!headEnd.ok()) {
    if (headEnd.error().code == Code::kTimeout && !buffer.empty()) {
      refuse(env, *channel, 408, "Request Timeout", {{"via", "forward"}, {"rule", "head_timeout"}}, headTimedOut());
    }
    return;
  }
  if (buffer.compare(0, 8, "CONNECT ") != 0) {
    auto withHead = plainChannel(UniqueFd(::dup(fd)), buffer);
    channel.reset();
    return handleHttp(env, *withHead, "", 0, nullptr, Decision{}, "forward");
  }
  auto lineEnd = buffer.find("\r\n");
  std::string line = buffer.substr(0, lineEnd);
  std::string target = line.substr(8, line.find(' ', 8) - 8);
  std::string host;
  uint16_t port = 0;
  if (!splitAuthority(target, 0, host, port) || port == 0) {
    return refuse(env, *channel, 400, "Bad Request",
                  {{"via", "connect"}, {"host", target}, {"rule", "syntax"}, {"reason", "bad CONNECT target"}},
                  "CONNECT needs host:port");
  }
  Decision d = authorize(env, host, port, "", "");
  if (!d.allowed) {
    return refuse(env, *channel, 403, "Forbidden",
                  {{"via", "connect"}, {"host", host}, {"port", port}, {"rule", d.rule}}, d.why);
  }
  // Open mode is for any protocol: a CONNECT to a port other than 443 is
  // relayed as it is (ssh, databases; some servers speak first, so nothing
  // is waited for). Not with secrets, whose placeholders must stay where the
  // proxy can see them, nor with request rules.
  bool raw = env->currentPolicy()->mode == Mode::kOpen && port != 443 && !d.inspect && env->currentSecrets()->empty();
  std::optional<UniqueFd> upstream;
  if (raw) {
    auto connected = connectUpstream(d.address, port);
    if (!connected.ok()) {
      return refuse(env, *channel, 502, "Bad Gateway",
                    {{"via", "connect"}, {"host", host}, {"port", port}, {"rule", d.rule}},
                    connected.error().message());
    }
    upstream = std::move(connected.value());
  }
  if (!writeAll(*channel, "HTTP/1.1 200 Connection established\r\n\r\n", Clock::now() + config_.headTimeout).ok()) {
    return;
  }
  std::string rest = buffer.substr(headEnd.value());
  UniqueFd tunnel(::dup(fd));
  channel.reset();
  if (raw) {
    auto a = plainChannel(std::move(tunnel), std::move(rest));
    auto b = plainChannel(std::move(*upstream));
    RelayCounts counts = relay(*a, *b, config_.idleTimeout, [&](size_t n) { throttle(env, n); });
    record(env, true,
           {{"via", "connect-raw"},
            {"host", host},
            {"port", port},
            {"rule", d.rule},
            {"address", formatIpv4(d.address)},
            {"bytes_up", counts.up},
            {"bytes_down", counts.down}});
    return;
  }
  tlsTunnel(env, std::move(tunnel), rest, host, port, 0, "connect", &d);
}

void Controller::tlsTunnel(const std::shared_ptr<Env>& env, UniqueFd client, std::string buffered,
                           const std::string& requested, uint16_t port, uint32_t destination, const std::string& via,
                           const Decision* decided) {
  auto deadline = Clock::now() + config_.headTimeout;
  ClientHello hello;
  HelloStatus status = HelloStatus::kNeedMore;
  {
    auto reader = plainChannel(UniqueFd(::dup(client.get())));
    char chunk[4096];
    while ((status = parseClientHello(buffered, &hello)) == HelloStatus::kNeedMore && buffered.size() < 20000) {
      auto n = readWait(*reader, chunk, sizeof chunk, deadline);
      if (!n.ok() && n.error().code == Code::kTimeout && !buffered.empty()) {
        record(env, false, {{"via", via}, {"port", port}, {"rule", "head_timeout"}, {"reason", headTimedOut()}});
      }
      if (!n.ok() || n.value() == 0) return;
      buffered.append(chunk, n.value());
    }
  }
  std::string target = requested;
  if (target.empty()) {
    target = formatIpv4(destination);
    if (auto name = standInName(env, destination)) target = *name;
  }
  json event = {{"via", via}, {"host", target}, {"port", port}};
  if (status != HelloStatus::kOk) {
    event["rule"] = "tls";
    event["reason"] = via == "connect" ? "a CONNECT tunnel must carry TLS (send plain HTTP to the proxy as it is)"
                                       : "not a TLS ClientHello";
    record(env, false, event);
    return;
  }
  std::string sni = asciiLower(hello.serverName);
  event["sni"] = sni;
  bool targetIsAddress = parseIpv4(target).has_value();
  if (!requested.empty() || !targetIsAddress) {
    // CONNECT target (or the name behind a stand-in) and SNI must agree.
    if (sni.empty() ? !targetIsAddress : sni != target) {
      event["rule"] = "sni";
      event["reason"] = "TLS server name '" + sni + "' does not match the requested host '" + target + "'";
      record(env, false, event);
      return;
    }
  }
  std::string host = sni.empty() ? target : sni;
  event["host"] = host;
  // A CONNECT was decided (and maybe asked a person) before its 200.
  Decision d = decided && host == requested ? *decided : authorize(env, host, port, "", "");
  event["rule"] = d.rule;
  if (!d.allowed) {
    event["reason"] = d.why;
    record(env, false, event);
    return;
  }
  event["address"] = formatIpv4(d.address);
  // Intercepted: when requests decide (method and path rules), and in an
  // environment with secrets, every host: a placeholder must be caught on
  // its way to any host, not just swapped on the way to its own.
  bool intercept = d.inspect || !env->currentSecrets()->empty();
  auto upstreamFd = connectUpstream(d.address, port);
  if (!upstreamFd.ok()) {
    event["reason"] = upstreamFd.error().message();
    record(env, false, event);
    return;
  }
  if (!intercept) {
    auto a = plainChannel(std::move(client), std::move(buffered));
    auto b = plainChannel(std::move(upstreamFd.value()));
    RelayCounts counts = relay(*a, *b, config_.idleTimeout, [&](size_t n) { throttle(env, n); });
    event["bytes_up"] = counts.up;
    event["bytes_down"] = counts.down;
    record(env, true, event);
    return;
  }
  auto context = authority_->serverContext(host);
  if (!context.ok()) {
    event["reason"] = context.error().message();
    record(env, false, event);
    return;
  }
  // The handshake's own time, counted from here: the decision above may
  // have waited for a person.
  std::string presented;
  auto clientTls = acceptTls(std::move(client), std::move(buffered), context.value().get(),
                             Clock::now() + config_.headTimeout, &presented);
  if (!clientTls.ok()) {
    event["reason"] = "TLS with the client failed: " + clientTls.error().message();
    record(env, false, event);
    return;
  }
  auto upstreamTls =
      connectTls(std::move(upstreamFd.value()), upstreamTls_.get(), host, Clock::now() + config_.connectTimeout);
  if (!upstreamTls.ok()) {
    return refuse(env, *clientTls.value(), 502, "Bad Gateway", event, upstreamTls.error().message());
  }
  handleHttp(env, *clientTls.value(), host, port, std::move(upstreamTls.value()), d, via + "+tls");
}

void Controller::handleHttp(const std::shared_ptr<Env>& env, Channel& client, const std::string& fixedHost,
                            uint16_t fixedPort, std::unique_ptr<Channel> upstream, Decision decided,
                            const std::string& via) {
  ChannelStream clientStream(client, config_.idleTimeout);
  boost::beast::flat_buffer clientBuf, upstreamBuf;
  std::string upstreamHost = fixedHost;
  uint16_t upstreamPort = fixedPort;
  bool transparent = via.rfind("transparent:", 0) == 0;
  std::string transparentTarget = transparent ? via.substr(12) : "";
  auto limit = [&](size_t n) { throttle(env, n); };
  auto deny = [&](int status, const char* reason, json event, const std::string& why) {
    event["reason"] = why;
    refuse(env, client, status, reason, std::move(event), why);
  };
  while (true) {
    http::request_parser<http::buffer_body> req;
    req.header_limit(kMaxHead);
    req.body_limit(std::numeric_limits<std::uint64_t>::max());  // boost::none misbehaves in 1.74
    boost::system::error_code ec;
    // The whole head in time: a client that sends it a byte at a time
    // (within the idle timeout each) must not hold the connection forever.
    clientStream.expectHead(config_.headTimeout, clientBuf.size() > 0);
    http::read_header(clientStream, clientBuf, req, ec);
    clientStream.headDone();
    if (ec) {
      if (ec == boost::asio::error::timed_out && clientBuf.size() > 0) {
        deny(408, "Request Timeout", {{"via", via}, {"rule", "head_timeout"}}, headTimedOut());
      } else if (ec != boost::asio::error::eof && ec != http::error::end_of_stream && clientBuf.size() > 0) {
        deny(400, "Bad Request", {{"via", via}, {"rule", "syntax"}}, "malformed HTTP request: " + ec.message());
      }
      return;
    }
    auto& m = req.get();
    std::string method(m.method_string());
    std::string target(m.target());
    json event = {{"via", transparent ? "transparent" : via}, {"method", method}};
    if (m.count(http::field::host) > 1) {
      return deny(400, "Bad Request", event, "more than one Host header");
    }
    // Framing: the upstream must read the body exactly as it was read here
    // (and decided). Beast reads a chunked body when any Transfer-Encoding
    // field ends in chunked, but writes chunks only when the first one does:
    // two fields would hand the upstream decoded bytes it reads as requests
    // of their own. One field, ending in chunked, on HTTP/1.1 (RFC 9112 6.3).
    if (size_t te = m.count(http::field::transfer_encoding);
        te > 1 || (te == 1 && (!req.chunked() || m.version() < 11))) {
      return deny(400, "Bad Request", event, "a Transfer-Encoding the proxy cannot frame");
    }
    if (m.count(http::field::content_length) > 1 ||
        m[http::field::content_length].find(',') != boost::beast::string_view::npos) {
      m.set(http::field::content_length, std::to_string(req.content_length().value_or(0)));
    }
    std::string hostHeader(m[http::field::host]);
    std::string host, path;
    uint16_t port = 0;
    if (!fixedHost.empty()) {
      host = fixedHost;
      port = fixedPort;
      path = target;
      std::string h;
      uint16_t hp;
      if (!hostHeader.empty() && (!splitAuthority(hostHeader, fixedPort, h, hp) || h != fixedHost)) {
        event["host"] = fixedHost;
        return deny(421, "Misdirected Request", event,
                    "Host header '" + hostHeader + "' does not match the TLS server name '" + fixedHost + "'");
      }
    } else if (via == "forward") {
      if (target.compare(0, 7, "http://") != 0) {
        return deny(400, "Bad Request", event,
                    target.compare(0, 8, "https://") == 0 ? "use CONNECT for https:// through the proxy"
                                                          : "a proxy request needs an absolute http:// URL");
      }
      auto slash = target.find('/', 7);
      std::string authority = target.substr(7, slash == std::string::npos ? std::string::npos : slash - 7);
      path = slash == std::string::npos ? "/" : target.substr(slash);
      if (authority.find('@') != std::string::npos || !splitAuthority(authority, 80, host, port)) {
        return deny(400, "Bad Request", event, "bad host in the request URL '" + authority + "'");
      }
      std::string h;
      uint16_t hp;
      if (!hostHeader.empty() && (!splitAuthority(hostHeader, 80, h, hp) || h != host || hp != port)) {
        event["host"] = host;
        return deny(403, "Forbidden", event,
                    "Host header '" + hostHeader + "' does not match the request URL's host '" + authority + "'");
      }
    } else {
      if (hostHeader.empty()) return deny(400, "Bad Request", event, "a request without a Host header");
      uint16_t ignored;
      if (!splitAuthority(hostHeader, fixedPort, host, ignored)) {
        return deny(400, "Bad Request", event, "bad Host header '" + hostHeader + "'");
      }
      port = fixedPort;
      path = target;
      bool targetIsAddress = parseIpv4(transparentTarget).has_value();
      if (!targetIsAddress && host != transparentTarget) {
        event["host"] = host;
        return deny(403, "Forbidden", event,
                    "Host header '" + host + "' does not match the name looked up ('" + transparentTarget + "')");
      }
    }
    if (path.empty() || path[0] != '/') {
      return deny(400, "Bad Request", event, "the request target must be a path");
    }
    event["host"] = host;
    event["port"] = port;
    event["path"] = path.substr(0, path.find('?'));
    // The connection's host was decided once; each request is decided again
    // on its method and path (and a new host on a forward connection).
    Decision d;
    if (decided.allowed && host == upstreamHost && port == upstreamPort) {
      Verdict v = decide(*env->currentPolicy(), Destination{host, port, decided.address, method, path});
      d = decided;
      d.rule = v.rule;
      if (v.outcome == Outcome::kDeny)
        d.allowed = false,
        d.why = method + " " + event["path"].get<std::string>() + " on " + host + " is denied (" + v.rule + ")";
      if (v.outcome == Outcome::kUnlisted && !decided.byGate) {
        d = authorize(env, host, port, method, path);
      }
    } else {
      d = authorize(env, host, port, method, path);
    }
    event["rule"] = d.rule;
    if (!d.allowed) return deny(403, "Forbidden", event, d.why);
    // Secrets: placeholders become values for their hosts, and nowhere else.
    auto secrets = env->currentSecrets();
    std::vector<std::pair<std::string, std::string>> rewritten;  // every field of a name that carries one
    std::set<std::string> names;
    for (const auto& field : m) {
      if (field.value().find("moat-secret-") != std::string::npos)
        names.insert(asciiLower(std::string(field.name_string())));
    }
    for (const auto& field : m) {
      std::string name(field.name_string());
      if (!names.count(asciiLower(name))) continue;
      std::string value(field.value());
      if (auto leaked = substitute(*secrets, host, value)) {
        event["secret"] = *leaked;
        return deny(403, "Forbidden", event, "the placeholder of secret " + *leaked + " may only go to its own hosts");
      }
      rewritten.emplace_back(name, value);
    }
    for (const auto& name : names) m.erase(name);
    for (const auto& [name, value] : rewritten) m.insert(name, value);
    if (target.find("moat-secret-") != std::string::npos) {
      if (auto leaked = substitute(*secrets, host, path)) {
        event["secret"] = *leaked;
        return deny(403, "Forbidden", event, "the placeholder of secret " + *leaked + " may only go to its own hosts");
      }
    }
    for (const auto& s : *secrets) {
      if (s.header.empty() || !s.boundTo(host)) continue;
      std::string value = s.headerFormat;
      auto at = value.find("{value}");
      value.replace(at, 7, s.value);
      m.set(s.header, value);
    }
    m.target(path);
    m.erase("Proxy-Connection");
    m.erase("Proxy-Authorization");
    // Only a WebSocket upgrade turns the connection into a relay: after any
    // other (h2c above all) the upstream would take requests nobody decided.
    bool websocket = m.count(http::field::upgrade) == 1 && boost::beast::iequals(m[http::field::upgrade], "websocket");
    if (!websocket && m.count(http::field::upgrade)) {
      m.erase(http::field::upgrade);
      m.erase("HTTP2-Settings");
    }
    if (fixedHost.empty() && hostHeader.empty()) m.set(http::field::host, host);
    if (boost::beast::iequals(m[http::field::expect], "100-continue")) {
      m.erase(http::field::expect);
      if (!writeAll(client, "HTTP/1.1 100 Continue\r\n\r\n", Clock::now() + config_.headTimeout).ok()) return;
    }
    if (!upstream || host != upstreamHost || port != upstreamPort) {
      auto fd = connectUpstream(d.address, port);
      if (!fd.ok()) return deny(502, "Bad Gateway", event, fd.error().message());
      upstream = plainChannel(std::move(fd.value()));
      upstreamHost = host;
      upstreamPort = port;
      upstreamBuf.clear();
      decided = d;
    }
    ChannelStream upstreamStream(*upstream, config_.idleTimeout);
    uint64_t up = 0, down = 0;
    if (!relayMessage(req, clientStream, clientBuf, upstreamStream, up, limit)) {
      event["reason"] = "the request could not be sent upstream";
      record(env, false, event);
      return;
    }
    http::response_parser<http::buffer_body> res;
    res.header_limit(kMaxHead);
    res.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (method == "HEAD") res.skip(true);
    http::read_header(upstreamStream, upstreamBuf, res, ec);
    if (ec) {
      upstream.reset();  // not kept open while the client's refusal lingers
      return deny(502, "Bad Gateway", event, "no valid response from " + host + ": " + ec.message());
    }
    int status = res.get().result_int();
    if (status == 101 && !(websocket && boost::beast::iequals(res.get()[http::field::upgrade], "websocket"))) {
      upstream.reset();
      return deny(502, "Bad Gateway", event, host + " switched to a protocol the proxy does not relay");
    }
    // A value goes to its hosts and never comes back: a redirect that keeps
    // the query, a cookie made of a header, carry the placeholder instead.
    scrubSecrets(res.get(), *secrets, host);
    bool keepAlive = req.get().keep_alive() && res.get().keep_alive();
    if (!relayMessage(res, upstreamStream, upstreamBuf, clientStream, down, limit)) keepAlive = false;
    event["status"] = status;
    event["bytes_up"] = up;
    event["bytes_down"] = down;
    if (status == 101) {
      RelayCounts counts = relay(client, *upstream, config_.idleTimeout, limit);
      event["bytes_up"] = up + counts.up;
      event["bytes_down"] = down + counts.down;
      record(env, true, event);
      return;
    }
    record(env, true, event);
    if (!keepAlive) return;
  }
}

}  // namespace moat::egress
