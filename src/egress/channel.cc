#include "egress/channel.h"

#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <functional>

#include "egress/tls_authority.h"
#include "os/socket.h"

namespace moat::egress {
namespace {

class PlainChannel : public Channel {
 public:
  PlainChannel(UniqueFd fd, std::string prefix) : Channel(std::move(fd)), prefix_(std::move(prefix)) {}
  ssize_t readSome(char* buf, size_t n) override {
    if (offset_ < prefix_.size()) {
      size_t k = std::min(n, prefix_.size() - offset_);
      std::memcpy(buf, prefix_.data() + offset_, k);
      offset_ += k;
      return static_cast<ssize_t>(k);
    }
    ssize_t r = ::recv(fd(), buf, n, MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EINTR) {
      wait_ = POLLIN;
      return -1;
    }
    error_ = std::strerror(errno);
    return -2;
  }
  ssize_t writeSome(const char* buf, size_t n) override {
    ssize_t r = ::send(fd(), buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EINTR) {
      wait_ = POLLOUT;
      return -1;
    }
    error_ = std::strerror(errno);
    return -2;
  }
  bool pending() const override { return offset_ < prefix_.size(); }
  void shutdownWrite() override { ::shutdown(fd(), SHUT_WR); }

 private:
  std::string prefix_;
  size_t offset_ = 0;
};

// A BIO over a non-blocking socket that first hands out bytes already read
// (the ClientHello the proxy looked at before choosing what to do).
struct BioState {
  int fd;
  std::string prefix;
  size_t offset = 0;
};

int bioRead(BIO* b, char* out, int len) {
  auto* s = static_cast<BioState*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  if (len <= 0) return 0;
  if (s->offset < s->prefix.size()) {
    size_t k = std::min(static_cast<size_t>(len), s->prefix.size() - s->offset);
    std::memcpy(out, s->prefix.data() + s->offset, k);
    s->offset += k;
    return static_cast<int>(k);
  }
  ssize_t r = ::recv(s->fd, out, static_cast<size_t>(len), MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) BIO_set_retry_read(b);
  return static_cast<int>(r);
}

int bioWrite(BIO* b, const char* in, int len) {
  auto* s = static_cast<BioState*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  ssize_t r = ::send(s->fd, in, static_cast<size_t>(len), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) BIO_set_retry_write(b);
  return static_cast<int>(r);
}

long bioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int bioDestroy(BIO* b) {
  delete static_cast<BioState*>(BIO_get_data(b));
  BIO_set_data(b, nullptr);
  return 1;
}

BIO_METHOD* bioMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "moat-prefixed-fd");
    BIO_meth_set_read(m, bioRead);
    BIO_meth_set_write(m, bioWrite);
    BIO_meth_set_ctrl(m, bioCtrl);
    BIO_meth_set_destroy(m, bioDestroy);
    return m;
  }();
  return method;
}

std::string sslError(const char* what) {
  std::string out = what;
  unsigned long e = ERR_get_error();
  if (e) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += std::string(": ") + buf;
  }
  ERR_clear_error();
  return out;
}

class TlsChannel : public Channel {
 public:
  TlsChannel(UniqueFd fd, SSL* ssl) : Channel(std::move(fd)), ssl_(ssl) {}
  ~TlsChannel() override { SSL_free(ssl_); }
  SSL* ssl() { return ssl_; }
  // Interprets an SSL_* return: 1 progress, -1 would block, -2 error, 0 closed.
  int classify(int r, const char* what) {
    int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ) {
      wait_ = POLLIN;
      return -1;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
      wait_ = POLLOUT;
      return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN) return 0;
    if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
      error_ = std::string(what) + ": connection closed";
      return errno == 0 ? 0 : -2;
    }
    error_ = sslError(what);
    return -2;
  }
  ssize_t readSome(char* buf, size_t n) override {
    errno = 0;
    int r = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 20)));
    if (r > 0) return r;
    int c = classify(r, "TLS read");
    return c == 0 ? 0 : c;
  }
  ssize_t writeSome(const char* buf, size_t n) override {
    errno = 0;
    int r = SSL_write(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 20)));
    if (r > 0) return r;
    int c = classify(r, "TLS write");
    return c == 0 ? -2 : c;
  }
  bool pending() const override { return SSL_pending(ssl_) > 0; }
  void shutdownWrite() override {
    (void)SSL_shutdown(ssl_);
    ::shutdown(fd(), SHUT_WR);
  }

 private:
  SSL* ssl_;
};

Result<std::unique_ptr<TlsChannel>> handshake(UniqueFd fd, std::string prefix, SSL_CTX* ctx, bool server,
                                              const std::string& host, Clock::time_point deadline) {
  SSL* ssl = SSL_new(ctx);
  if (!ssl) return Error::make(Code::kTls, sslError("SSL_new"));
  BIO* bio = BIO_new(bioMethod());
  BIO_set_data(bio, new BioState{fd.get(), std::move(prefix)});
  BIO_set_init(bio, 1);
  SSL_set_bio(ssl, bio, bio);
  auto channel = std::make_unique<TlsChannel>(std::move(fd), ssl);
  if (server) {
    SSL_set_accept_state(ssl);
  } else {
    SSL_set_connect_state(ssl);
    MOAT_TRY(TlsAuthority::prepareUpstream(ssl, host));
  }
  while (true) {
    errno = 0;
    int r = SSL_do_handshake(ssl);
    if (r == 1) return channel;
    int c = channel->classify(r, server ? "TLS handshake with the client" : "TLS handshake with the upstream");
    if (c != -1) {
      std::string why = channel->lastError();
      if (!server && SSL_get_verify_result(ssl) != X509_V_OK) {
        why =
            std::string("upstream certificate rejected: ") + X509_verify_cert_error_string(SSL_get_verify_result(ssl));
      }
      return Error::make(Code::kTls, why.empty() ? "TLS handshake failed" : why);
    }
    MOAT_TRY(waitFor(*channel, deadline));
  }
}

}  // namespace

std::unique_ptr<Channel> plainChannel(UniqueFd fd, std::string prefix) {
  return std::make_unique<PlainChannel>(std::move(fd), std::move(prefix));
}

Result<std::unique_ptr<Channel>> acceptTls(UniqueFd fd, std::string prefix, SSL_CTX* ctx, Clock::time_point deadline,
                                           std::string* serverName) {
  MOAT_ASSIGN(auto channel, handshake(std::move(fd), std::move(prefix), ctx, true, "", deadline));
  if (serverName) {
    const char* sni = SSL_get_servername(channel->ssl(), TLSEXT_NAMETYPE_host_name);
    *serverName = sni ? sni : "";
  }
  return std::unique_ptr<Channel>(std::move(channel));
}

Result<std::unique_ptr<Channel>> connectTls(UniqueFd fd, SSL_CTX* ctx, const std::string& host,
                                            Clock::time_point deadline) {
  MOAT_ASSIGN(auto channel, handshake(std::move(fd), "", ctx, false, host, deadline));
  return std::unique_ptr<Channel>(std::move(channel));
}

Status waitFor(Channel& c, Clock::time_point deadline) {
  if (c.pending()) return {};
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return Error::make(Code::kTimeout, "the peer went silent");
  struct pollfd p {
    c.fd(), c.waitEvents() ? c.waitEvents() : static_cast<short>(POLLIN), 0
  };
  int r = ::poll(&p, 1, static_cast<int>(left));
  if (r < 0 && errno != EINTR) return Error::fromErrno("poll");
  if (r == 0) return Error::make(Code::kTimeout, "the peer went silent");
  return {};
}

Result<size_t> readWait(Channel& c, char* buf, size_t n, Clock::time_point deadline) {
  while (true) {
    ssize_t r = c.readSome(buf, n);
    if (r >= 0) return static_cast<size_t>(r);
    if (r == -2) return Error::make(Code::kIo, c.lastError());
    MOAT_TRY(waitFor(c, deadline));
  }
}

Status writeAll(Channel& c, const char* buf, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t r = c.writeSome(buf, n);
    if (r > 0) {
      buf += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == -2 || r == 0) return Error::make(Code::kIo, c.lastError().empty() ? "connection closed" : c.lastError());
    MOAT_TRY(waitFor(c, deadline));
  }
  return {};
}

void lingerAfterAnswer(Channel& c, std::chrono::milliseconds idle, Clock::time_point deadline) {
  c.shutdownWrite();  // TLS: its close_notify first
  // Below TLS: what still arrives is dropped as it is, never decrypted.
  os::drainBeforeClose(c.fd(), idle, deadline);
}

RelayCounts relay(Channel& a, Channel& b, std::chrono::milliseconds idle, const std::function<void(size_t)>& limit) {
  struct Direction {
    Channel& from;
    Channel& to;
    uint64_t& count;
    std::string buffer;
    size_t offset = 0;
    bool open = true;
    short wantFrom = 0, wantTo = 0;
  };
  RelayCounts counts;
  Direction dirs[2] = {{a, b, counts.up}, {b, a, counts.down}};
  std::vector<char> scratch(64 * 1024);
  while (dirs[0].open || dirs[1].open) {
    bool progress = false;
    for (auto& d : dirs) {
      if (!d.open) continue;
      d.wantFrom = d.wantTo = 0;
      if (d.offset == d.buffer.size()) {
        d.buffer.clear();
        d.offset = 0;
        ssize_t r = d.from.readSome(scratch.data(), scratch.size());
        if (r > 0) {
          d.buffer.assign(scratch.data(), static_cast<size_t>(r));
          progress = true;
        } else if (r == 0 || r == -2) {
          d.open = false;
          d.to.shutdownWrite();
          progress = true;
          if (r == -2) return counts;
          continue;
        } else {
          d.wantFrom = d.from.waitEvents();
        }
      }
      if (d.offset < d.buffer.size()) {
        if (limit) limit(d.buffer.size() - d.offset);
        ssize_t w = d.to.writeSome(d.buffer.data() + d.offset, d.buffer.size() - d.offset);
        if (w > 0) {
          d.offset += static_cast<size_t>(w);
          d.count += static_cast<uint64_t>(w);
          progress = true;
        } else if (w == -1) {
          d.wantTo = d.to.waitEvents();
        } else {
          return counts;
        }
      }
    }
    if (progress || a.pending() || b.pending()) continue;
    struct pollfd p[2] = {{a.fd(), 0, 0}, {b.fd(), 0, 0}};
    p[0].events = static_cast<short>(dirs[0].wantFrom | dirs[1].wantTo);
    p[1].events = static_cast<short>(dirs[0].wantTo | dirs[1].wantFrom);
    int r = ::poll(p, 2, static_cast<int>(idle.count()));
    if (r == 0) return counts;  // idle too long
    if (r < 0 && errno != EINTR) return counts;
  }
  return counts;
}

}  // namespace moat::egress
