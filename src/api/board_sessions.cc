#include "api/board_sessions.h"

#include <arpa/inet.h>

#include <algorithm>

#include "api/auth.h"
#include "common/hex.h"
#include "common/text.h"

namespace moat::api {

BoardSessions::BoardSessions(BoardSessionLimits limits, Clock clock)
    : limits_(limits), clock_(clock ? std::move(clock) : [] { return std::chrono::steady_clock::now(); }) {}

Result<BoardSessions::Opened> BoardSessions::open(const std::string& token, const std::string& owner) {
  auto id = randomHex(32);
  if (!id.ok()) return id.error();
  auto csrf = randomHex(32);
  if (!csrf.ok()) return csrf.error();
  const auto now = clock_();
  std::lock_guard<std::mutex> lock(mutex_);
  auto leastRecent = [&](bool ownOnly) {
    auto oldest = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (ownOnly && it->second.owner != owner) continue;
      if (oldest == sessions_.end() || it->second.used < oldest->second.used) oldest = it;
    }
    return oldest;
  };
  size_t own = 0;
  for (const auto& entry : sessions_) own += entry.second.owner == owner ? 1 : 0;
  if (own >= limits_.maxPerOwner) {
    sessions_.erase(leastRecent(true));
  } else if (sessions_.size() >= limits_.maxSessions && !sessions_.empty()) {
    sessions_.erase(leastRecent(false));
  }
  sessions_[id.value()] = Entry{{token, csrf.value()}, owner, now, now};
  return Opened{id.value(), csrf.value()};
}

std::optional<BoardSession> BoardSessions::find(const std::string& id) {
  if (id.size() != 64) return std::nullopt;
  const auto now = clock_();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  if (now - it->second.used >= limits_.idle || now - it->second.created >= limits_.lifetime) {
    sessions_.erase(it);
    return std::nullopt;
  }
  it->second.used = now;
  return it->second.session;
}

void BoardSessions::close(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  sessions_.erase(id);
}

size_t BoardSessions::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  return sessions_.size();
}

std::string cookieValue(const std::string& header, const std::string& name) {
  size_t at = 0;
  while (at < header.size()) {
    size_t end = header.find(';', at);
    if (end == std::string::npos) end = header.size();
    std::string pair = header.substr(at, end - at);
    const size_t first = pair.find_first_not_of(' ');
    if (first != std::string::npos) pair.erase(0, first);
    const size_t eq = pair.find('=');
    if (eq != std::string::npos && pair.compare(0, eq, name) == 0 && eq == name.size()) {
      std::string value = pair.substr(eq + 1);
      while (!value.empty() && value.back() == ' ') value.pop_back();
      return value;
    }
    at = end + 1;
  }
  return "";
}

bool hostIsAddressOrLocal(const std::string& hostPort) {
  std::string h = asciiLower(hostPort);
  std::string host = h;
  std::string port;
  if (!h.empty() && h[0] == '[') {
    const size_t close = h.find(']');
    if (close == std::string::npos) return false;
    host = h.substr(1, close - 1);
    std::string rest = h.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return false;
      port = rest.substr(1);
      if (port.empty()) return false;
    }
    in6_addr v6{};
    if (::inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  } else {
    const size_t colon = h.find(':');
    if (colon != std::string::npos) {
      host = h.substr(0, colon);
      port = h.substr(colon + 1);
      if (port.empty()) return false;
    }
    in_addr v4{};
    if (host != "localhost" && ::inet_pton(AF_INET, host.c_str(), &v4) != 1) return false;
  }
  return port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5;
}

bool sameOrigin(const std::string& origin, const std::string& host) {
  if (host.empty()) return false;
  const std::string o = asciiLower(origin);
  const std::string h = asciiLower(host);
  return o == "http://" + h || o == "https://" + h;
}

}  // namespace moat::api
