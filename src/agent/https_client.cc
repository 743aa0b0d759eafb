#include "agent/https_client.h"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstring>

#include "common/text.h"

namespace moat::agent {
namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kMaxErrorBody = 1u << 20;

void setTimeout(int fd, int option, std::chrono::seconds limit) {
  struct timeval tv = {static_cast<time_t>(limit.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}

template <class Stream>
Result<HttpAnswer> exchange(Stream& stream, const Url& url, const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& headers, const std::string& body,
                            const std::function<bool(const std::string&)>& onBody, const PostOptions& options,
                            const std::string& where) {
  http::request<http::string_body> req{http::verb::post, path.empty() ? "/" : path, 11};
  const bool defaultPort = url.port == (url.tls ? 443 : 80);
  req.set(http::field::host, defaultPort ? url.host : url.host + ":" + std::to_string(url.port));
  req.set(http::field::user_agent, "moatd");
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "application/json, text/event-stream");
  for (const auto& [name, value] : headers) req.set(name, value);
  req.keep_alive(false);
  req.body() = body;
  req.prepare_payload();
  beast::error_code ec;
  http::write(stream, req, ec);
  if (ec) return Error::make(Code::kIo, "sending the request to " + where + ": " + ec.message());
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(options.maxBody);
  http::read_header(stream, buffer, parser, ec);
  if (ec) return Error::make(Code::kIo, "reading the answer of " + where + ": " + ec.message());
  HttpAnswer answer;
  answer.status = parser.get().result_int();
  for (const auto& field : parser.get()) {
    answer.headers[asciiLower(std::string(field.name_string()))] = std::string(field.value());
  }
  const bool streamBody = answer.status == 200 && onBody;
  char piece[32 << 10];
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    http::read_some(stream, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec == http::error::end_of_stream || ec == asio::error::eof) break;  // a body that ends with the connection
    if (ec) return Error::make(Code::kIo, "reading the answer of " + where + ": " + ec.message());
    size_t n = sizeof piece - parser.get().body().size;
    if (n == 0) continue;
    if (streamBody) {
      if (!onBody(std::string(piece, n))) break;
    } else if (answer.status == 200 || answer.body.size() < kMaxErrorBody) {
      answer.body.append(piece, n);
    }
  }
  return answer;
}

bool local4(uint32_t ip) {
  const uint8_t a = ip >> 24, b = (ip >> 16) & 0xff;
  return a == 0 || a == 10 || a == 127 || (a == 100 && (b & 0xc0) == 64) || (a == 169 && b == 254) ||
         (a == 172 && (b & 0xf0) == 16) || (a == 192 && b == 168) || (a == 192 && b == 0) ||
         (a == 198 && (b & 0xfe) == 18) || a >= 224;
}

bool sameAddress(const struct sockaddr* a, const struct sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  return a->sa_family == AF_INET6 && std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                                                 &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, 16) == 0;
}

}  // namespace

bool localAddress(const struct sockaddr* address) {
  if (address->sa_family == AF_INET) {
    if (local4(ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr))) return true;
  } else if (address->sa_family == AF_INET6) {
    const uint8_t* b = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr.s6_addr;
    static const uint8_t kZero[10] = {};
    const bool mapped = std::memcmp(b, kZero, 10) == 0 && b[10] == 0xff && b[11] == 0xff;
    const bool compatible = std::memcmp(b, kZero, 10) == 0 && b[10] == 0 && b[11] == 0;  // ::a.b.c.d, ::1, ::
    const bool nat64 = b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b;     // 64:ff9b::/96 and /48
    const bool sixToFour = b[0] == 0x20 && b[1] == 0x02;
    if (mapped || compatible || nat64 || sixToFour) return true;
    if ((b[0] & 0xfe) == 0xfc || (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) || b[0] == 0xff) return true;
  } else {
    return true;  // not an internet address at all
  }
  struct ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return true;  // cannot tell: refused
  bool own = false;
  for (auto* i = all; i && !own; i = i->ifa_next) own = i->ifa_addr && sameAddress(i->ifa_addr, address);
  ::freeifaddrs(all);
  return own;
}

Result<Url> parseUrl(const std::string& text) {
  Url url;
  std::string rest;
  if (text.rfind("https://", 0) == 0) {
    url.tls = true;
    rest = text.substr(8);
  } else if (text.rfind("http://", 0) == 0) {
    rest = text.substr(7);
  } else {
    return Error::make(Code::kInvalidArgument, "'" + text + "' is not an http:// or https:// URL");
  }
  for (unsigned char c : text) {
    if (c <= 0x20 || c >= 0x7f) return Error::make(Code::kInvalidArgument, "a URL of printable ASCII without spaces");
  }
  if (rest.find_first_of("?#@ ") != std::string::npos) {
    return Error::make(Code::kInvalidArgument, "'" + text + "': no user info, query, fragment or spaces");
  }
  auto slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  url.path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!url.path.empty() && url.path.back() == '/') url.path.pop_back();
  std::string port;
  if (!authority.empty() && authority[0] == '[') {
    auto close = authority.find(']');
    if (close == std::string::npos) return Error::make(Code::kInvalidArgument, "'" + text + "': unclosed [");
    url.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return Error::make(Code::kInvalidArgument, "'" + text + "': bad port");
      port = authority.substr(close + 2);
    }
  } else if (auto colon = authority.find(':'); colon != std::string::npos) {
    url.host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  } else {
    url.host = authority;
  }
  if (url.host.empty()) return Error::make(Code::kInvalidArgument, "'" + text + "' names no host");
  url.port = url.tls ? 443 : 80;
  if (!port.empty()) {
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) == 0 ||
        std::stoul(port) > 65535) {
      return Error::make(Code::kInvalidArgument, "'" + text + "': bad port " + port);
    }
    url.port = static_cast<uint16_t>(std::stoul(port));
  }
  return url;
}

void Cancel::cancel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }
  cv_.notify_all();
}

bool Cancel::sleepFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mutex_);
  return !cv_.wait_for(lock, d, [&] { return cancelled_.load(); });
}

void Cancel::watch(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  fd_ = fd;
  if (fd >= 0 && cancelled_) ::shutdown(fd, SHUT_RDWR);
}

Result<HttpAnswer> post(const Url& url, const std::string& path,
                        const std::vector<std::pair<std::string, std::string>>& headers, const std::string& body,
                        const std::function<bool(const std::string&)>& onBody, const PostOptions& options,
                        Cancel* cancel) {
  const std::string where = (url.tls ? "https://" : "http://") + url.host + ":" + std::to_string(url.port);
  auto stopped = [&]() -> Result<HttpAnswer> {
    return Error::make(Code::kGone, "the request to " + where + " was stopped");
  };
  if (cancel && cancel->cancelled()) return stopped();
  asio::io_context io;
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto found = resolver.resolve(url.host, std::to_string(url.port), ec);
  if (ec) return Error::make(Code::kUnreachable, "cannot resolve " + url.host + ": " + ec.message());
  tcp::socket socket(io);
  bool refusedLocal = false;
  for (const auto& entry : found) {
    if (options.refuseLocal && localAddress(entry.endpoint().data())) {
      refusedLocal = true;
      continue;
    }
    socket.open(entry.endpoint().protocol(), ec);
    if (ec) continue;
    // On Linux the send timeout bounds a blocking connect too.
    setTimeout(socket.native_handle(), SO_SNDTIMEO, options.connectTimeout);
    if (cancel) cancel->watch(socket.native_handle());
    socket.connect(entry.endpoint(), ec);
    if (!ec) break;
    if (cancel) cancel->watch(-1);
    socket.close();
  }
  struct Unwatch {
    Cancel* cancel;
    ~Unwatch() {
      if (cancel) cancel->watch(-1);
    }
  } unwatch{cancel};
  if (cancel && cancel->cancelled()) return stopped();
  if (!socket.is_open() && refusedLocal) {
    return Error::make(Code::kRefused, url.host +
                                           " resolves to moatd's own host or networks, where this run may not "
                                           "send requests (moatd --agent-local-providers allows it)");
  }
  if (ec || !socket.is_open()) {
    return Error::make(Code::kUnreachable, "cannot connect to " + where + ": " + ec.message());
  }
  setTimeout(socket.native_handle(), SO_SNDTIMEO, options.idleTimeout);
  setTimeout(socket.native_handle(), SO_RCVTIMEO, options.idleTimeout);
  Result<HttpAnswer> answer = Error::make(Code::kInternal, "no answer");
  if (url.tls) {
    ssl::context context(ssl::context::tls_client);
    context.set_default_verify_paths(ec);  // honours SSL_CERT_FILE and SSL_CERT_DIR
    context.set_verify_mode(ssl::verify_peer);
    ssl::stream<tcp::socket&> stream(socket, context);
    boost::system::error_code ip;
    (void)asio::ip::make_address(url.host, ip);
    if (ip && !SSL_set_tlsext_host_name(stream.native_handle(), url.host.c_str())) {
      return Error::make(Code::kTls, "cannot name " + url.host + " in the TLS handshake");
    }
    stream.set_verify_callback(ssl::host_name_verification(url.host));
    stream.handshake(ssl::stream_base::client, ec);
    if (ec) {
      if (cancel && cancel->cancelled()) return stopped();
      return Error::make(Code::kTls, "TLS with " + where + " failed: " + ec.message());
    }
    answer = exchange(stream, url, path, headers, body, onBody, options, where);
  } else {
    answer = exchange(socket, url, path, headers, body, onBody, options, where);
  }
  if (!answer.ok() && cancel && cancel->cancelled()) return stopped();
  if (!answer.ok() && (answer.error().context.find("Resource temporarily unavailable") != std::string::npos ||
                       answer.error().context.find("timed out") != std::string::npos)) {
    return Error::make(Code::kTimeout,
                       where + " sent nothing for " + std::to_string(options.idleTimeout.count()) + " s");
  }
  return answer;
}

}  // namespace moat::agent
