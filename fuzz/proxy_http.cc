// What the egress proxy reads from an environment before it decides
// anything: HTTP request heads (Boost.Beast, configured as in
// src/egress/proxy.cc), the authority of a request (splitAuthority,
// src/egress/http_target.h), a TLS ClientHello's server name
// (src/egress/client_hello.h) and DNS queries (src/egress/dns_message.h).
//
// Input: the first byte picks what the rest is: 0 a request on the forward
// proxy port, 1 on the transparent HTTP port, 2 inside intercepted TLS (a
// fixed host), 3 a ClientHello, 4 a DNS query (or a TCP stream of them).
// For heads, the proxy's own checks run as it runs them, its edits are made,
// and the head it would send upstream is parsed again: an upstream must see
// the same method, target and body framing the proxy decided on (no request
// smuggling through the proxy's rewriting).
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

#include "egress/client_hello.h"
#include "egress/dns_message.h"
#include "egress/http_target.h"
#include "egress/policy.h"

using namespace moat::egress;
namespace http = boost::beast::http;

namespace {

constexpr size_t kMaxHead = 64 * 1024;  // src/egress/proxy.cc

[[noreturn]] void fail(const std::string& what) {
  __builtin_printf("proxy_http: %s\n", what.c_str());
  std::abort();
}

bool validHostName(const std::string& h, bool allowUnderscore) {
  if (h.empty() || h.size() > 253 || h.back() == '.' || h.front() == '.') return false;
  size_t label = 0;
  for (char c : h) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' ||
          (allowUnderscore && c == '_'))) {
      return false;
    }
    if (++label > 63) return false;
  }
  return true;
}

void checkAuthority(const std::string& authority, uint16_t defaultPort) {
  std::string host;
  uint16_t port = 0;
  if (!splitAuthority(authority, defaultPort, host, port)) return;
  if (host.empty() || host.size() > 253 || host.back() == '.' || canonicalHost(host) != host) {
    fail("splitAuthority gave a host that is not canonical: " + host);
  }
  for (char c : host) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '.' ||
          c == '-' || c == '_')) {
      fail("splitAuthority let a character through");
    }
  }
  if (port == 0 && defaultPort != 0) fail("splitAuthority gave port 0");
  std::string h2;
  uint16_t p2 = 0;
  if (port != 0 && (!splitAuthority(host + ":" + std::to_string(port), 1, h2, p2) || h2 != host || p2 != port)) {
    fail("host:port from splitAuthority does not split the same again");
  }
}

// src/egress/proxy.cc, Controller::handleHttp: the checks and edits of a head.
void head(int mode, const std::string& bytes) {
  http::request_parser<http::buffer_body> req;
  req.header_limit(kMaxHead);
  req.body_limit(std::numeric_limits<std::uint64_t>::max());
  boost::system::error_code ec;
  req.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
  if (ec || !req.is_header_done()) return;
  auto& m = req.get();
  std::string method(m.method_string());
  std::string target(m.target());
  if (m.count(http::field::host) > 1) return;
  if (size_t te = m.count(http::field::transfer_encoding);
      te > 1 || (te == 1 && (!req.chunked() || m.version() < 11))) {
    return;
  }
  if (m.count(http::field::content_length) > 1 ||
      m[http::field::content_length].find(',') != boost::beast::string_view::npos) {
    m.set(http::field::content_length, std::to_string(req.content_length().value_or(0)));
  }
  std::string hostHeader(m[http::field::host]);
  std::string host, path;
  uint16_t port = 0;
  const std::string fixedHost = mode == 2 ? "example.com" : "";
  const uint16_t fixedPort = mode == 2 ? 443 : 80;
  checkAuthority(hostHeader, fixedPort);
  if (mode == 2) {
    host = fixedHost;
    port = fixedPort;
    path = target;
    std::string h;
    uint16_t hp;
    if (!hostHeader.empty() && (!splitAuthority(hostHeader, fixedPort, h, hp) || h != fixedHost)) return;
  } else if (mode == 0) {
    if (target.compare(0, 7, "http://") != 0) return;
    auto slash = target.find('/', 7);
    std::string authority = target.substr(7, slash == std::string::npos ? std::string::npos : slash - 7);
    path = slash == std::string::npos ? "/" : target.substr(slash);
    checkAuthority(authority, 80);
    if (authority.find('@') != std::string::npos || !splitAuthority(authority, 80, host, port)) return;
    std::string h;
    uint16_t hp;
    if (!hostHeader.empty() && (!splitAuthority(hostHeader, 80, h, hp) || h != host || hp != port)) return;
  } else {
    if (hostHeader.empty()) return;
    uint16_t ignored;
    if (!splitAuthority(hostHeader, fixedPort, host, ignored)) return;
    port = fixedPort;
    path = target;
  }
  if (path.empty() || path[0] != '/') return;
  for (const auto& form : requestPathForms(path)) {
    if (form.empty() || form[0] != '/') fail("a request path form is not absolute");
  }
  // The edits before the head goes upstream.
  bool chunked = req.chunked();
  auto length = req.content_length();
  m.target(path);
  m.erase("Proxy-Connection");
  m.erase("Proxy-Authorization");
  bool websocket = m.count(http::field::upgrade) == 1 && boost::beast::iequals(m[http::field::upgrade], "websocket");
  if (!websocket && m.count(http::field::upgrade)) {
    m.erase(http::field::upgrade);
    m.erase("HTTP2-Settings");
  }
  if (fixedHost.empty() && hostHeader.empty()) m.set(http::field::host, host);
  if (boost::beast::iequals(m[http::field::expect], "100-continue")) m.erase(http::field::expect);

  // What the upstream reads.
  std::ostringstream out;
  out << m.base();
  std::string sent = out.str();
  http::request_parser<http::empty_body> up;
  up.header_limit(std::numeric_limits<std::uint32_t>::max());
  up.body_limit(std::numeric_limits<std::uint64_t>::max());
  up.eager(false);
  boost::system::error_code uec;
  up.put(boost::asio::buffer(sent.data(), sent.size()), uec);
  if (uec || !up.is_header_done()) fail("the head sent upstream does not parse: " + uec.message() + "\n" + sent);
  const auto& u = up.get();
  if (std::string(u.method_string()) != method) fail("the upstream reads another method");
  if (std::string(u.target()) != path) fail("the upstream reads another target");
  if (up.chunked() != chunked) fail("the upstream reads another body framing (chunked)");
  if (!chunked && up.content_length() != length) fail("the upstream reads another Content-Length");
  if (u.count(http::field::transfer_encoding) > 1) fail("more than one Transfer-Encoding upstream");
  if (up.chunked() && u.count(http::field::content_length)) fail("both chunked and Content-Length upstream");
  // Inside intercepted TLS the host is the server name; a head without Host
  // (HTTP/1.0) goes as it came. Elsewhere the proxy sets the host it decided.
  if (u.count(http::field::host) > 1 || (fixedHost.empty() && u.count(http::field::host) != 1)) {
    fail("not exactly one Host upstream");
  }
  if (!websocket && u.count(http::field::upgrade)) fail("an Upgrade other than websocket went upstream");
}

void clientHello(const std::string& bytes) {
  ClientHello hello;
  HelloStatus status = parseClientHello(bytes, &hello);
  (void)toString(status);
  if (status != HelloStatus::kOk) return;
  if (!hello.serverName.empty() && !validHostName(hello.serverName, true)) {
    fail("a ClientHello server name that is not a DNS name: " + hello.serverName);
  }
  // The proxy reads until it has an answer: a prefix of a whole ClientHello
  // asks for more (or already holds all of it), never anything else.
  for (size_t k = 1; k <= 8; ++k) {
    size_t n = bytes.size() * k / 9;
    ClientHello part;
    HelloStatus s = parseClientHello(std::string_view(bytes).substr(0, n), &part);
    if (s == HelloStatus::kOk && part.serverName != hello.serverName) fail("a prefix names another server");
    if (s != HelloStatus::kOk && s != HelloStatus::kNeedMore) {
      fail(std::string("a prefix of a ClientHello is ") + toString(s));
    }
  }
}

void dnsQuery(std::string_view packet) {
  auto q = parseDnsQuery(packet);
  if (!q.ok()) {
    auto err = dnsFormatErrorFor(packet);
    if (err) {
      if (err->size() != 12 || err->compare(0, 2, packet.substr(0, 2)) != 0 || !((*err)[2] & 0x80)) {
        fail("a bad FORMERR reply");
      }
    }
    return;
  }
  if (q->name.size() > 253 || (!q->name.empty() && !validHostName(q->name, true)))
    fail("a query name that is not a DNS name");
  std::vector<uint32_t> addresses(200, 0x04030201);
  for (size_t n : {size_t{0}, size_t{1}, size_t{200}}) {
    std::string answer = dnsAnswer(q.value(), std::vector<uint32_t>(addresses.begin(), addresses.begin() + n), 60);
    if (answer.size() > kDnsMaxUdpMessage) fail("an answer larger than 512 bytes");
    if (answer.size() < 12 || answer.compare(0, 2, packet.substr(0, 2)) != 0) fail("an answer with another id");
    if (parseDnsQuery(answer).ok()) fail("an answer reads as a query");
  }
  std::string err = dnsError(q.value(), kDnsRefused);
  if (err.size() > kDnsMaxUdpMessage || parseDnsQuery(err).ok()) fail("a bad error reply");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  int mode = data[0] % 5;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (mode) {
    case 0:
    case 1:
    case 2:
      head(mode, bytes);
      break;
    case 3:
      clientHello(bytes);
      break;
    case 4: {
      dnsQuery(bytes);
      std::string_view stream(bytes);
      size_t consumed = 0;
      for (int i = 0; i < 16; ++i) {
        auto message = dnsTcpNextMessage(stream, &consumed);
        if (!message) break;
        if (consumed != message->size() + 2 || consumed > stream.size()) fail("dnsTcpNextMessage overran");
        dnsQuery(*message);
        stream.remove_prefix(consumed);
      }
      break;
    }
  }
  return 0;
}
