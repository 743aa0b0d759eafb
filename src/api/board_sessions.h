#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/result.h"

// The board's sign-in sessions (docs/BOARD.md): a person signs in once with
// the master token or an API key; the browser then holds only an opaque
// session id in an HttpOnly, SameSite=Strict cookie, and every request made
// with it is the token's. Kept in moatd's memory: a restart signs everyone
// out.
namespace moat::api {

inline constexpr const char* kSessionCookie = "moat_session";
inline constexpr const char* kCsrfHeader = "X-Moat-CSRF";

struct BoardSession {
  std::string token;  // what the session acts as (checked again on every request)
  std::string csrf;   // what a state-changing request must carry in kCsrfHeader
};

struct BoardSessionLimits {
  size_t maxSessions = 256;  // beyond: the least recently used goes
  // One owner's (the master, a key) at most: beyond, its own least recently
  // used goes, so that one key signing in again and again cannot sign
  // everyone else out.
  size_t maxPerOwner = 16;
  std::chrono::milliseconds idle{8 * 3600 * 1000};  // unused this long: signed out
  std::chrono::milliseconds lifetime{24 * 3600 * 1000};
};

class BoardSessions {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  explicit BoardSessions(BoardSessionLimits limits = {}, Clock clock = nullptr);
  struct Opened {
    std::string id;
    std::string csrf;
  };
  // A new session for `token` (already authenticated by the caller as
  // `owner`).
  Result<Opened> open(const std::string& token, const std::string& owner);
  // The session `id` names, if it is open and not expired (its use renews
  // the idle bound); an expired one is forgotten.
  std::optional<BoardSession> find(const std::string& id);
  void close(const std::string& id);
  size_t size();

 private:
  struct Entry {
    BoardSession session;
    std::string owner;
    std::chrono::steady_clock::time_point created;
    std::chrono::steady_clock::time_point used;
  };
  BoardSessionLimits limits_;
  Clock clock_;
  std::mutex mutex_;
  std::map<std::string, Entry> sessions_;
};

// The value of cookie `name` in a Cookie header ("a=1; moat_session=x"), or
// empty.
std::string cookieValue(const std::string& header, const std::string& name);

// A Host header naming this machine or an address, never a DNS name that
// someone else controls: "localhost", an IPv4 address, a bracketed IPv6
// address, each with an optional port. A page that rebinds its own name to
// moatd's address carries its name in Host and is refused.
bool hostIsAddressOrLocal(const std::string& hostPort);

// Origin "http://H" or "https://H" where H is exactly `host` (same origin).
bool sameOrigin(const std::string& origin, const std::string& host);

}  // namespace moat::api
