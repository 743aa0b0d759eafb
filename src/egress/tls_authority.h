#pragma once

#include <openssl/types.h>

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/result.h"

// moatd's certificate authority for the egress proxy: environments trust its
// certificate, and the proxy terminates their TLS with leaf certificates it
// issues on the fly; plus the client side the proxy uses towards the real
// servers, which verifies them as any client would.
namespace moat::egress {

class TlsAuthority {
 public:
  // Days a generated CA certificate is valid.
  static constexpr int kCaValidityDays = 3650;
  // A leaf is valid from an hour ago (clock skew) for kLeafValidityDays.
  static constexpr int kLeafValidityDays = 7;
  // Host contexts kept; the least recently used one goes first.
  static constexpr size_t kMaxCachedHosts = 1024;

  // The CA in dir/ca.crt (0644) and dir/ca.key (0600). Both are loaded when
  // ca.crt exists; otherwise a new CA (EC P-256, self-signed, ~10 years) is
  // written: the key through a file created 0600 with O_EXCL and renamed
  // into place, then the certificate the same way, so a crash halfway
  // leaves no ca.crt and the next start creates the pair again. Errors name
  // the file that is unreadable, corrupt, or does not match the other.
  static Result<std::unique_ptr<TlsAuthority>> loadOrCreate(const std::string& dir);

  ~TlsAuthority();
  TlsAuthority(const TlsAuthority&) = delete;
  TlsAuthority& operator=(const TlsAuthority&) = delete;

  // The CA certificate, PEM: what environments add to their trust store.
  const std::string& caCertificatePem() const { return caPem_; }
  X509* caCertificate() const { return caCert_; }

  // A server context (TLS 1.2+) presenting a fresh leaf for `host` signed by
  // the CA: a DNS name gets a SAN dNSName, an IPv4/IPv6 literal (no
  // brackets) a SAN iPAddress. Cached per host, lower-cased; thread-safe.
  // Errors: "invalid_argument" for a host that is neither, "tls" if OpenSSL
  // fails.
  Result<std::shared_ptr<SSL_CTX>> serverContext(const std::string& host);

  // A client context (TLS 1.2+) that verifies servers (SSL_VERIFY_PEER)
  // against caBundleFile, or the system's default paths when it is empty.
  // Use prepareUpstream on each SSL made from it: the context alone checks
  // the chain, not the name.
  static Result<std::shared_ptr<SSL_CTX>> upstreamContext(const std::string& caBundleFile);
  // Sets SNI (DNS names only: RFC 6066 forbids literals) and turns on the
  // check that the server's certificate is for `host`, a DNS name or an IP
  // literal; no partial wildcards ("f*.example.com").
  static Status prepareUpstream(SSL* ssl, const std::string& host);

 private:
  TlsAuthority(X509* caCert, EVP_PKEY* caKey, std::string caPem, EVP_PKEY* leafKey);
  Result<std::shared_ptr<SSL_CTX>> makeServerContext(const std::string& host) const;

  X509* caCert_;
  EVP_PKEY* caKey_;
  std::string caPem_;
  EVP_PKEY* leafKey_;  // shared by every leaf: generating one per host is the slow part

  std::mutex mutex_;
  // Most recently used first; the map points into the list.
  using CacheEntry = std::pair<std::string, std::shared_ptr<SSL_CTX>>;
  std::list<CacheEntry> lru_;
  std::unordered_map<std::string, std::list<CacheEntry>::iterator> cache_;
};

}  // namespace moat::egress
