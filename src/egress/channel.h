#pragma once

#include <openssl/ssl.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "common/unique_fd.h"

// One side of a proxied connection, plain or TLS, on a non-blocking socket:
// the proxy waits with deadlines (poll) instead of blocking, so a silent
// peer costs a timeout, never a stuck thread.
namespace moat::egress {

using Clock = std::chrono::steady_clock;

class Channel {
 public:
  virtual ~Channel() = default;
  int fd() const { return fd_.get(); }
  // > 0 bytes; 0 end of stream; -1 would block (wait for waitEvents()); -2 error.
  virtual ssize_t readSome(char* buf, size_t n) = 0;
  virtual ssize_t writeSome(const char* buf, size_t n) = 0;
  // Bytes already decrypted and waiting (poll would not say so).
  virtual bool pending() const { return false; }
  // No more writes: the peer sees the end of the stream.
  virtual void shutdownWrite() = 0;
  short waitEvents() const { return wait_; }
  const std::string& lastError() const { return error_; }

 protected:
  explicit Channel(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
  short wait_ = 0;
  std::string error_;
};

// A plain socket; `prefix` holds bytes already read from it (a peeked
// ClientHello), handed out first.
std::unique_ptr<Channel> plainChannel(UniqueFd fd, std::string prefix = "");

// TLS as the server towards a client (moatd's certificate for the host the
// client asked for) or as a client towards an upstream (verified against
// the upstream CA bundle, SNI and host name set). The handshake runs here.
Result<std::unique_ptr<Channel>> acceptTls(UniqueFd fd, std::string prefix, SSL_CTX* ctx, Clock::time_point deadline,
                                           std::string* serverName);
Result<std::unique_ptr<Channel>> connectTls(UniqueFd fd, SSL_CTX* ctx, const std::string& host,
                                            Clock::time_point deadline);

// Waits until the channel can make progress (or the deadline passes).
Status waitFor(Channel& c, Clock::time_point deadline);
// Reads at least one byte; 0 at the end of the stream.
Result<size_t> readWait(Channel& c, char* buf, size_t n, Clock::time_point deadline);
Status writeAll(Channel& c, const char* buf, size_t n, Clock::time_point deadline);
inline Status writeAll(Channel& c, const std::string& s, Clock::time_point deadline) {
  return writeAll(c, s.data(), s.size(), deadline);
}

// After a final answer: ends the channel's sending side (TLS: close_notify
// first) and drops what the peer still sends (os::drainBeforeClose).
void lingerAfterAnswer(Channel& c, std::chrono::milliseconds idle, Clock::time_point deadline);

// Copies both ways until both ends close or `idle` passes without a byte.
// `limit(bytes)` is called before each write (rate limits; it may sleep).
struct RelayCounts {
  uint64_t up = 0;    // a -> b
  uint64_t down = 0;  // b -> a
};
RelayCounts relay(Channel& a, Channel& b, std::chrono::milliseconds idle, const std::function<void(size_t)>& limit);

}  // namespace moat::egress
