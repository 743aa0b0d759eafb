#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

struct sockaddr;

// The client moatd calls model providers with: one POST per connection,
// HTTP or HTTPS (certificates checked against the system's trust store, or
// the bundle SSL_CERT_FILE names), the answer's body handed over as it
// arrives (streams), bounded in time and size, and cancellable from another
// thread.
namespace moat::agent {

struct Url {
  bool tls = false;
  std::string host;
  uint16_t port = 0;
  std::string path;  // "/v1", "" for none
};
// http:// or https:// URLs with a host, an optional port and a path; no
// user info, query or fragment.
Result<Url> parseUrl(const std::string& text);

// Ends the request in progress (and any later one) from another thread.
class Cancel {
 public:
  void cancel();
  bool cancelled() const { return cancelled_.load(); }
  // The client's: the connection to shut down on cancel (-1: none).
  void watch(int fd);
  // Waits `d` unless cancelled first (then returns false at once).
  bool sleepFor(std::chrono::milliseconds d);

 private:
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  int fd_ = -1;
};

struct HttpAnswer {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;  // a non-200 answer's body (at most 1 MiB); a 200's when no onBody is given
};

// An address of moatd's own host or networks: loopback, private,
// link-local, unique-local, shared (100.64/10), benchmarking (198.18/15),
// multicast and reserved ranges, the unspecified address, IPv6 forms that
// carry an IPv4 address (mapped, NAT64, 6to4), and this host's own
// interfaces' addresses.
bool localAddress(const struct sockaddr* address);

struct PostOptions {
  std::chrono::seconds connectTimeout{10};
  // Nothing at all arriving for this long ends the request.
  std::chrono::seconds idleTimeout{120};
  uint64_t maxBody = 64u << 20;
  // Connect only to addresses that are not localAddress(): checked on each
  // connection, after the name is resolved (a name that resolves elsewhere
  // later is checked again).
  bool refuseLocal = false;
};

// `onBody` receives a 200 answer's body in pieces (return false to stop
// reading); without it the body is kept in HttpAnswer::body.
Result<HttpAnswer> post(const Url& url, const std::string& path,
                        const std::vector<std::pair<std::string, std::string>>& headers, const std::string& body,
                        const std::function<bool(const std::string&)>& onBody, const PostOptions& options,
                        Cancel* cancel);

}  // namespace moat::agent
