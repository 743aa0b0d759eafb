#include "api/port_proxy.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "api/board_sessions.h"
#include "api/http.h"
#include "common/text.h"

namespace moat::api {
namespace {

using Clock = std::chrono::steady_clock;

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

// The comma-separated tokens of a Connection header, lowercase.
std::set<std::string> connectionTokens(const std::string& value) {
  std::set<std::string> out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    std::string token = asciiLower(trim(std::string_view(value).substr(start, end - start)));
    if (!token.empty()) out.insert(token);
    start = end + 1;
  }
  return out;
}

// Headers that describe one connection, not the message (RFC 9110 7.6.1),
// and those moatd sets itself.
const std::set<std::string>& hopByHop() {
  static const std::set<std::string> names = {
      "connection",         "keep-alive", "proxy-connection", "proxy-authorization",
      "proxy-authenticate", "te",         "trailer",          "upgrade"};
  return names;
}

// A Cookie header without moat's own session.
std::string withoutSessionCookie(const std::string& header) {
  std::string out;
  size_t start = 0;
  while (start <= header.size()) {
    size_t end = header.find(';', start);
    if (end == std::string::npos) end = header.size();
    std::string pair = trim(std::string_view(header).substr(start, end - start));
    std::string name = trim(std::string_view(pair).substr(0, pair.find('=')));
    if (!pair.empty() && name != kSessionCookie) {
      if (!out.empty()) out += "; ";
      out += pair;
    }
    start = end + 1;
  }
  return out;
}

// Writes all of `data`, waiting at most `idle` for each bit of progress.
bool sendAll(int fd, std::string_view data, std::chrono::milliseconds idle) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int ready = ::poll(&p, 1, static_cast<int>(idle.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

std::string jsonError(int status, const std::string& code, const std::string& message) {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  std::string body = R"({"error":{"code":")" + code + R"(","message":")" + escaped + R"("}})";
  return "HTTP/1.1 " + std::to_string(status) + (status == 504 ? " Gateway Timeout" : " Bad Gateway") +
         "\r\nServer: moatd\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nConnection: close\r\n"
         "Content-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

struct ResponseHead {
  int status = 0;
  std::string reason;
  std::vector<std::pair<std::string, std::string>> fields;
};

// "HTTP/1.1 200 OK\r\nA: b\r\n..." (without the blank line); false when it
// is not an HTTP/1.x response head.
bool parseHead(const std::string& text, ResponseHead& head) {
  size_t lineEnd = text.find("\r\n");
  std::string line = text.substr(0, lineEnd);
  if (line.size() < 12 || line.compare(0, 7, "HTTP/1.") != 0 || line[8] != ' ') return false;
  for (int i = 9; i < 12; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(line[i]))) return false;
  }
  if (line.size() > 12 && line[12] != ' ') return false;
  head.status = std::stoi(line.substr(9, 3));
  if (head.status < 100) return false;
  for (char c : line.size() > 13 ? line.substr(13) : "") {
    if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) head.reason += c;
  }
  size_t pos = lineEnd == std::string::npos ? text.size() : lineEnd + 2;
  while (pos < text.size()) {
    size_t end = text.find("\r\n", pos);
    if (end == std::string::npos) end = text.size();
    std::string field = text.substr(pos, end - pos);
    pos = end + 2;
    size_t colon = field.find(':');
    if (colon == 0 || colon == std::string::npos) return false;
    std::string name = field.substr(0, colon);
    for (char c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) &&
          std::string_view("!#$%&'*+-.^_`|~").find(c) == std::string_view::npos) {
        return false;
      }
    }
    std::string value = trim(std::string_view(field).substr(colon + 1));
    for (char c : value) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) return false;
    }
    head.fields.emplace_back(std::move(name), std::move(value));
  }
  return true;
}

}  // namespace

bool hostOnlyCookie(const std::string& setCookie) {
  size_t start = setCookie.find(';');
  while (start != std::string::npos) {
    size_t end = setCookie.find(';', start + 1);
    std::string attribute = asciiLower(trim(
        std::string_view(setCookie).substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1)));
    if (attribute.rfind("domain", 0) == 0 && trim(std::string_view(attribute).substr(6)).rfind('=', 0) == 0) {
      return false;
    }
    start = end;
  }
  return true;
}

namespace {

// A segment a browser takes for "." or ".." (WHATWG URL: "%2e" is a dot).
int dots(std::string segment) {
  segment = asciiLower(segment);
  if (segment == "." || segment == "%2e") return 1;
  if (segment == ".." || segment == ".%2e" || segment == "%2e." || segment == "%2e%2e") return 2;
  return 0;
}

// RFC 3986 5.2.4 on an absolute path, as a browser reads it: "." and ".."
// segments resolved, never above "/".
std::string withoutDotSegments(const std::string& path) {
  std::vector<std::string> kept;
  size_t start = 1;
  bool directory = false;  // the path ends as a directory ("/", "/.", "/..")
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string segment = path.substr(start, end - start);
    const bool last = end == path.size();
    if (dots(segment) == 1) {
      directory = last;
    } else if (dots(segment) == 2) {
      if (!kept.empty()) kept.pop_back();
      directory = last;
    } else {
      kept.push_back(segment);
      directory = false;
    }
    start = end + 1;
  }
  std::string out;
  for (const auto& segment : kept) out += "/" + segment;
  if (out.empty() || directory) out += "/";
  return out;
}

// host and port, as a browser compares origins: userinfo gone, percent
// escapes decoded, lowercase, no trailing dot, the scheme's default port.
std::pair<std::string, std::string> hostAndPort(const std::string& authority, bool https) {
  std::string a = authority.substr(authority.rfind('@') == std::string::npos ? 0 : authority.rfind('@') + 1);
  a = asciiLower(urlDecode(a, false));
  std::string host = a, port;
  const size_t colon = a.rfind(':');
  if (colon != std::string::npos && a.find(']', colon) == std::string::npos) {
    host = a.substr(0, colon);
    port = a.substr(colon + 1);
  }
  while (!host.empty() && host.back() == '.') host.pop_back();
  if (port.empty()) port = https ? "443" : "80";
  // A number, as a browser reads it ("08080" is 8080); anything else is
  // left as it came (and then matches no port of moatd's).
  if (port.find_first_not_of("0123456789") == std::string::npos) {
    const size_t digits = port.find_first_not_of('0');
    port = digits == std::string::npos ? "0" : port.substr(digits);
  }
  return {host, port};
}

// Whether a URL's authority could be moatd's own origin (the client's
// Host). A host name other than the client's is another origin; an address
// in any other form (IPv4's many spellings, IPv6) is taken to be moatd's.
bool mayBeMoatdsOrigin(const std::string& authority, bool https, const std::string& clientHost) {
  const auto [host, port] = hostAndPort(authority, https);
  const auto [ownHost, ownPort] = hostAndPort(clientHost, false);
  if (host == ownHost) return port == ownPort || https;
  const size_t lastDot = host.rfind('.');
  const std::string lastLabel = lastDot == std::string::npos ? host : host.substr(lastDot + 1);
  const bool name = !host.empty() &&
                    host.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-.") == std::string::npos &&
                    lastLabel.find_first_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos &&
                    !(lastLabel.size() > 2 && lastLabel.compare(0, 2, "0x") == 0 &&
                      lastLabel.find_first_not_of("0123456789abcdef", 2) == std::string::npos);
  return !name;
}

}  // namespace

std::string locationUnderPrefix(const std::string& location, const PortForward& forward) {
  if (location.empty() || location[0] == '#') return location;
  // As a browser parses it: tabs and line breaks gone, "\\" a "/".
  std::string reference;
  for (char c : location) {
    if (c == '\t' || c == '\r' || c == '\n') continue;
    reference += c == '\\' ? '/' : c;
  }
  // A URL: on moatd's own origin only when it names the client's Host.
  const size_t colon = reference.find(':');
  // A scheme only as RFC 3986 spells one (ALPHA *(ALPHA / DIGIT / "+" /
  // "-" / ".")): a browser reads "a_:/../x" as a relative path.
  const bool hasScheme =
      colon != std::string::npos && colon > 0 && std::isalpha(static_cast<unsigned char>(reference[0])) &&
      std::all_of(reference.begin(), reference.begin() + static_cast<std::ptrdiff_t>(colon), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
      });
  const std::string scheme = hasScheme ? asciiLower(reference.substr(0, colon)) : "";
  if (hasScheme && scheme != "http" && scheme != "https") return location;  // mailto:, data:, ...
  if (hasScheme && reference.compare(colon, 3, "://") != 0) {
    reference = reference.substr(colon + 1);  // "http:/x", "http:x": a browser reads them on this origin
  } else if (hasScheme || reference.rfind("//", 0) == 0) {
    const size_t authorityAt = hasScheme ? colon + 3 : 2;
    const size_t pathAt = std::min(reference.find_first_of("/?#", authorityAt), reference.size());
    const std::string authority = reference.substr(authorityAt, pathAt - authorityAt);
    if (!mayBeMoatdsOrigin(authority, scheme == "https", forward.host)) return location;
    reference = reference.substr(pathAt);
    if (reference.empty() || reference[0] != '/') reference = "/" + reference;
  }
  // The path, and what follows it (?query#fragment), in the inside site.
  const size_t tailAt = std::min(reference.find_first_of("?#"), reference.size());
  std::string path = reference.substr(0, tailAt);
  const std::string tail = reference.substr(tailAt);
  const std::string base =
      forward.target.substr(0, std::min(forward.target.find_first_of("?#"), forward.target.size()));
  if (path.empty()) {
    path = base.empty() ? "/" : base;  // "?q": the same path
  } else if (path[0] != '/') {
    path = base.substr(0, base.rfind('/') + 1) + path;  // relative to the inside path's directory
    if (path.empty() || path[0] != '/') path = "/" + path;
  }
  return forward.prefix + withoutDotSegments(path) + tail;
}

std::string upstreamRequest(const HttpRequest& request, const PortForward& forward) {
  std::set<std::string> drop = hopByHop();
  for (const char* name : {"host", "transfer-encoding", "content-length", "expect", "forwarded", "x-forwarded-for",
                           "x-forwarded-host", "x-forwarded-proto", "x-moat-csrf"}) {
    drop.insert(name);
  }
  if (forward.dropAuthorization) drop.insert("authorization");
  for (const auto& [name, value] : request.headers) {
    if (asciiLower(name) == "connection") drop.merge(connectionTokens(value));
  }
  std::string out =
      request.method + " " + forward.target + " HTTP/1.1\r\nHost: localhost:" + std::to_string(forward.port) + "\r\n";
  for (const auto& [name, value] : request.headers) {
    const std::string key = asciiLower(name);
    if (drop.count(key)) continue;
    if (key == "cookie") {
      std::string kept = withoutSessionCookie(value);
      if (!kept.empty()) out += name + ": " + kept + "\r\n";
      continue;
    }
    out += name + ": " + value + "\r\n";
  }
  if (!request.host.empty()) out += "X-Forwarded-Host: " + request.host + "\r\n";
  out += "X-Forwarded-Proto: http\r\n";
  // "127.0.0.1:50312" -> 127.0.0.1 (a unix socket's peer is no address).
  if (request.remote.rfind("unix", 0) != 0 && !request.remote.empty()) {
    std::string address = request.remote.substr(0, request.remote.rfind(':'));
    if (address.size() > 2 && address.front() == '[') address = address.substr(1, address.size() - 2);
    out += "X-Forwarded-For: " + address + "\r\n";
  }
  if (request.websocketUpgrade) {
    out += "Connection: Upgrade\r\nUpgrade: websocket\r\n";
  } else {
    out += "Connection: close\r\n";
  }
  const bool bodyMethod = request.method == "POST" || request.method == "PUT" || request.method == "PATCH";
  if (!request.body.empty() || bodyMethod) out += "Content-Length: " + std::to_string(request.body.size()) + "\r\n";
  out += "\r\n";
  out += request.body;
  return out;
}

ProxyOutcome relayPort(int client, const std::string& clientPending, int upstream, const std::string& request,
                       const PortForward& forward, bool headRequest, bool wantsUpgrade, const PortProxyLimits& limits) {
  ProxyOutcome outcome;
  auto fail = [&](int status, const std::string& code, const std::string& message) {
    outcome.status = status;
    outcome.error = message;
    (void)sendAll(client, jsonError(status, code, message), limits.idle);
    return outcome;
  };
  const std::string where = "port " + std::to_string(forward.port);
  if (!sendAll(upstream, request, limits.idle)) {
    return fail(502, "port_bad_response", "the server on " + where + " did not take the request");
  }
  if (wantsUpgrade && !clientPending.empty()) {
    if (!sendAll(upstream, clientPending, limits.idle)) {
      return fail(502, "port_bad_response", "the server on " + where + " did not take the request");
    }
    outcome.bytesToEnvironment += clientPending.size();
  }

  // The response head, bounded in size and time. 1xx heads other than 101
  // (100 Continue, 103 Early Hints) are dropped: the final one follows.
  std::string buffer;
  ResponseHead head;
  const auto deadline = Clock::now() + limits.idle;
  char chunk[16384];
  for (;;) {
    size_t end = buffer.find("\r\n\r\n");
    if ((end == std::string::npos ? buffer.size() : end) > limits.maxHeadBytes) {
      return fail(502, "port_bad_response",
                  "the server on " + where + " sent a response head larger than " +
                      std::to_string(limits.maxHeadBytes) + " bytes");
    }
    if (end != std::string::npos) {
      head = ResponseHead();
      if (!parseHead(buffer.substr(0, end), head)) {
        return fail(502, "port_bad_response", "the server on " + where + " answered something that is not HTTP/1.x");
      }
      buffer.erase(0, end + 4);
      if (head.status >= 100 && head.status < 200 && head.status != 101) continue;
      break;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd fds[2] = {{upstream, POLLIN, 0}, {client, POLLRDHUP, 0}};
    int ready = left.count() > 0 ? ::poll(fds, 2, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      return fail(504, "port_timeout",
                  "the server on " + where + " sent no response head within " +
                      std::to_string(limits.idle.count() / 1000) + " s");
    }
    if (ready < 0) return fail(502, "port_bad_response", "poll: " + std::string(std::strerror(errno)));
    if (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
      outcome.error = "the client went away";
      return outcome;
    }
    ssize_t n = ::recv(upstream, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      return fail(502, "port_bad_response", "the server on " + where + " closed the connection without answering");
    }
    outcome.bytesFromEnvironment += static_cast<uint64_t>(n);
    buffer.append(chunk, static_cast<size_t>(n));
  }
  const bool upgraded = head.status == 101;
  if (upgraded && !wantsUpgrade) {
    return fail(502, "port_bad_response", "the server on " + where + " switched protocols unasked");
  }

  // The head the client gets.
  std::set<std::string> drop = hopByHop();
  std::optional<uint64_t> contentLength;
  bool chunked = false;
  for (const auto& [name, value] : head.fields) {
    const std::string key = asciiLower(name);
    if (key == "connection") drop.merge(connectionTokens(value));
    if (key == "transfer-encoding") chunked = true;
    if (key == "content-length") {
      if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos) {
        return fail(502, "port_bad_response", "the server on " + where + " sent a bad Content-Length");
      }
      uint64_t n = std::stoull(value);
      if (contentLength && *contentLength != n) {
        return fail(502, "port_bad_response", "the server on " + where + " sent two Content-Lengths");
      }
      contentLength = n;
    }
  }
  if (upgraded) drop.erase("upgrade");
  std::string out = "HTTP/1.1 " + std::to_string(head.status) + " " + head.reason + "\r\n";
  for (const auto& [name, value] : head.fields) {
    const std::string key = asciiLower(name);
    if (drop.count(key)) continue;
    if (key == "content-length" && chunked) continue;  // Transfer-Encoding rules (RFC 9112 6.3)
    if (forward.apiOrigin && (key == "set-cookie" || key.rfind("access-control-", 0) == 0)) continue;
    // Clears the cookies of the whole site (localhost): the board's session too.
    if (key == "clear-site-data") continue;
    if (!forward.apiOrigin && key == "set-cookie" && !hostOnlyCookie(value)) continue;
    // Refresh navigates like a redirect, after the page: not under moatd's origin.
    if (forward.apiOrigin && key == "refresh") continue;
    if (forward.apiOrigin && key == "location") {
      out += name + ": " + locationUnderPrefix(value, forward) + "\r\n";
      continue;
    }
    out += name + ": " + value + "\r\n";
  }
  // Under moatd's origin a page from inside runs in a unique origin: it
  // can read nothing of moatd's, and its requests carry no session.
  if (forward.apiOrigin) out += "Content-Security-Policy: sandbox\r\n";
  out += upgraded ? "Connection: Upgrade\r\n\r\n" : "Connection: close\r\n\r\n";
  outcome.status = head.status;
  outcome.upgraded = upgraded;

  // What the body is: nothing, Content-Length bytes, or until the server closes.
  const bool noBody = !upgraded && (headRequest || head.status == 204 || head.status == 304 || head.status < 200);
  std::optional<uint64_t> remaining;
  if (noBody) {
    remaining = 0;
  } else if (!upgraded && !chunked && contentLength) {
    remaining = *contentLength;
  }
  if (remaining && buffer.size() > *remaining) buffer.resize(*remaining);
  if (remaining) *remaining -= buffer.size();
  if (!sendAll(client, out + buffer, limits.idle)) {
    outcome.error = "the client stopped reading";
    return outcome;
  }
  if (remaining && *remaining == 0) return outcome;

  const auto idle = upgraded ? limits.tunnelIdle : limits.idle;
  for (;;) {
    pollfd fds[2] = {{upstream, POLLIN, 0}, {client, static_cast<short>(upgraded ? POLLIN : POLLRDHUP), 0}};
    int ready = ::poll(fds, 2, static_cast<int>(idle.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      outcome.error = ready == 0 ? "idle for " + std::to_string(idle.count() / 1000) + " s" : "poll failed";
      return outcome;
    }
    if (fds[0].revents) {
      ssize_t n = ::recv(upstream, chunk, sizeof chunk, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) return outcome;  // the server's answer (or its side of the tunnel) ended
      size_t take = static_cast<size_t>(n);
      if (remaining && take > *remaining) take = static_cast<size_t>(*remaining);
      outcome.bytesFromEnvironment += static_cast<uint64_t>(n);
      if (!sendAll(client, std::string_view(chunk, take), idle)) {
        outcome.error = "the client stopped reading";
        return outcome;
      }
      if (remaining) {
        *remaining -= take;
        if (*remaining == 0) return outcome;
      }
    }
    if (fds[1].revents) {
      if (!upgraded) return outcome;  // the client hung up
      ssize_t n = ::recv(client, chunk, sizeof chunk, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) return outcome;
      outcome.bytesToEnvironment += static_cast<uint64_t>(n);
      if (!sendAll(upstream, std::string_view(chunk, static_cast<size_t>(n)), idle)) {
        outcome.error = "the server stopped reading";
        return outcome;
      }
    }
  }
}

}  // namespace moat::api
