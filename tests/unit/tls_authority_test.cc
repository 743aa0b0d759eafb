// The egress proxy's certificate authority: the files it keeps, the leaves
// it issues, and real TLS handshakes between a server context it makes and
// an upstream (client) context that trusts it.
#include "egress/tls_authority.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "os/file.h"

namespace moat::egress {
namespace {

mode_t fileMode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

X509* leafOf(const std::shared_ptr<SSL_CTX>& ctx) { return SSL_CTX_get0_certificate(ctx.get()); }

// The SAN entries of a certificate as "DNS:name" / "IP:a.b.c.d" strings.
std::vector<std::string> subjectAltNames(X509* cert) {
  std::vector<std::string> out;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type == GEN_DNS) {
      const ASN1_IA5STRING* s = name->d.dNSName;
      out.push_back("DNS:" + std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                                         static_cast<size_t>(ASN1_STRING_length(s))));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* s = name->d.iPAddress;
      char text[INET6_ADDRSTRLEN] = {};
      int family = ASN1_STRING_length(s) == 4 ? AF_INET : AF_INET6;
      inet_ntop(family, ASN1_STRING_get0_data(s), text, sizeof text);
      out.push_back(std::string("IP:") + text);
    } else {
      out.push_back("other");
    }
  }
  GENERAL_NAMES_free(names);
  return out;
}

// X509_verify_cert of `leaf` against the CA alone, as a TLS server for
// `host` (a DNS name or an IP literal). Returns the X509_V_ result.
int verifyAgainstCa(X509* ca, X509* leaf, const std::string& host) {
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_SERVER);
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx);
  if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1) {
    ERR_clear_error();
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  }
  int result = X509_verify_cert(ctx) == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return result;
}

// Seconds from a to b.
long secondsBetween(const ASN1_TIME* a, const ASN1_TIME* b) {
  int days = 0, seconds = 0;
  if (ASN1_TIME_diff(&days, &seconds, a, b) != 1) return 0;
  return days * 86400L + seconds;
}

struct HandshakeResult {
  bool clientOk = false;
  bool serverOk = false;
  long verifyResult = -1;
  std::string echoed;  // what the client read back after sending "ping"
};

// A TLS handshake over a socketpair: the server in a thread with `server`,
// the client with `client` prepared for `clientHost`; then one round trip.
HandshakeResult handshake(const std::shared_ptr<SSL_CTX>& server, const std::shared_ptr<SSL_CTX>& client,
                          const std::string& clientHost) {
  // The server's close_notify may find the client's end closed already: an
  // EPIPE to ignore, not a signal that kills the test binary.
  ::signal(SIGPIPE, SIG_IGN);
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::runtime_error("socketpair");
  }
  HandshakeResult result;
  std::thread serverThread([&] {
    SSL* ssl = SSL_new(server.get());
    SSL_set_fd(ssl, fds[0]);
    if (SSL_accept(ssl) == 1) {
      result.serverOk = true;
      char buf[16];
      int n = SSL_read(ssl, buf, sizeof buf);
      if (n > 0) SSL_write(ssl, buf, n);
      SSL_shutdown(ssl);
    }
    SSL_free(ssl);
    ERR_clear_error();
    close(fds[0]);
  });
  SSL* ssl = SSL_new(client.get());
  Status prepared = TlsAuthority::prepareUpstream(ssl, clientHost);
  EXPECT_TRUE(prepared.ok()) << prepared.error().message();
  SSL_set_fd(ssl, fds[1]);
  if (SSL_connect(ssl) == 1) {
    result.clientOk = true;
    SSL_write(ssl, "ping", 4);
    char buf[16];
    int n = SSL_read(ssl, buf, sizeof buf);
    if (n > 0) result.echoed.assign(buf, static_cast<size_t>(n));
  }
  result.verifyResult = SSL_get_verify_result(ssl);
  SSL_free(ssl);
  ERR_clear_error();
  close(fds[1]);  // a failed client leaves the server reading EOF
  serverThread.join();
  return result;
}

class TlsAuthorityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-tls-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/egress";  // does not exist yet: loadOrCreate makes it
  }
  void TearDown() override { EXPECT_TRUE(os::removeTree(root_).ok()); }

  std::unique_ptr<TlsAuthority> load(const std::string& dir) {
    auto authority = TlsAuthority::loadOrCreate(dir);
    if (!authority.ok()) throw std::runtime_error(authority.error().message());
    return std::move(authority.value());
  }
  std::shared_ptr<SSL_CTX> server(TlsAuthority& authority, const std::string& host) {
    auto ctx = authority.serverContext(host);
    if (!ctx.ok()) throw std::runtime_error(ctx.error().message());
    return ctx.value();
  }
  std::shared_ptr<SSL_CTX> upstream(const std::string& bundle) {
    auto ctx = TlsAuthority::upstreamContext(bundle);
    if (!ctx.ok()) throw std::runtime_error(ctx.error().message());
    return ctx.value();
  }

  std::string root_;
  std::string dir_;
};

TEST_F(TlsAuthorityTest, CreatesCaFilesWithTheirModesWhateverTheUmask) {
  // umask 0 would leave a careless create 0666/0644; 077 would hide ca.crt.
  mode_t old = umask(0);
  auto first = TlsAuthority::loadOrCreate(dir_);
  umask(old);
  ASSERT_TRUE(first.ok()) << first.error().message();
  EXPECT_EQ(fileMode(dir_ + "/ca.key"), 0600u);
  EXPECT_EQ(fileMode(dir_ + "/ca.crt"), 0644u);
  EXPECT_EQ(fileMode(dir_), 0700u);
  EXPECT_FALSE(os::exists(dir_ + "/ca.key.tmp"));
  EXPECT_FALSE(os::exists(dir_ + "/ca.crt.tmp"));

  std::string other = root_ + "/other";
  old = umask(077);
  auto second = TlsAuthority::loadOrCreate(other);
  umask(old);
  ASSERT_TRUE(second.ok()) << second.error().message();
  EXPECT_EQ(fileMode(other + "/ca.key"), 0600u);
  EXPECT_EQ(fileMode(other + "/ca.crt"), 0644u);
  EXPECT_NE(first.value()->caCertificatePem(), second.value()->caCertificatePem());
}

TEST_F(TlsAuthorityTest, CaCertificateIsASelfSignedP256CaForTenYears) {
  auto authority = load(dir_);
  const std::string& pem = authority->caCertificatePem();
  EXPECT_EQ(pem.rfind("-----BEGIN CERTIFICATE-----", 0), 0u);
  auto file = os::readFile(dir_ + "/ca.crt");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file.value(), pem);

  X509* ca = authority->caCertificate();
  char cn[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(ca), NID_commonName, cn, sizeof cn);
  EXPECT_EQ(std::string(cn).rfind("moat egress CA ", 0), 0u) << cn;
  EXPECT_GT(std::strlen(cn), std::strlen("moat egress CA "));
  EXPECT_EQ(X509_check_ca(ca), 1);
  EXPECT_EQ(X509_NAME_cmp(X509_get_subject_name(ca), X509_get_issuer_name(ca)), 0);

  int crit = -1;
  auto* bc = static_cast<BASIC_CONSTRAINTS*>(X509_get_ext_d2i(ca, NID_basic_constraints, &crit, nullptr));
  ASSERT_NE(bc, nullptr);
  EXPECT_EQ(crit, 1);
  EXPECT_TRUE(bc->ca);
  BASIC_CONSTRAINTS_free(bc);
  EXPECT_EQ(X509_get_key_usage(ca), static_cast<uint32_t>(KU_KEY_CERT_SIGN | KU_CRL_SIGN));
  int kuIndex = X509_get_ext_by_NID(ca, NID_key_usage, -1);
  ASSERT_GE(kuIndex, 0);
  EXPECT_EQ(X509_EXTENSION_get_critical(X509_get_ext(ca, kuIndex)), 1);

  EVP_PKEY* key = X509_get0_pubkey(ca);
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(EVP_PKEY_get_base_id(key), EVP_PKEY_EC);
  EXPECT_EQ(EVP_PKEY_get_bits(key), 256);
  EXPECT_EQ(X509_verify(ca, key), 1);  // self-signed

  long validity = secondsBetween(X509_get0_notBefore(ca), X509_get0_notAfter(ca));
  EXPECT_GE(validity, 3650L * 86400);
  EXPECT_LE(validity, 3651L * 86400);
  EXPECT_LT(X509_cmp_current_time(X509_get0_notBefore(ca)), 0);
}

TEST_F(TlsAuthorityTest, ReloadGivesTheSameCa) {
  std::string pem = load(dir_)->caCertificatePem();
  auto reloaded = load(dir_);
  EXPECT_EQ(reloaded->caCertificatePem(), pem);
  // And the reloaded key signs leaves the old certificate verifies.
  auto ctx = server(*reloaded, "api.example.test");
  EXPECT_EQ(verifyAgainstCa(reloaded->caCertificate(), leafOf(ctx), "api.example.test"), X509_V_OK);
}

TEST_F(TlsAuthorityTest, LeafForDnsNameVerifiesAndNamesTheHost) {
  auto authority = load(dir_);
  auto ctx = server(*authority, "api.example.test");
  X509* leaf = leafOf(ctx);
  ASSERT_NE(leaf, nullptr);
  X509* ca = authority->caCertificate();
  EXPECT_EQ(verifyAgainstCa(ca, leaf, "api.example.test"), X509_V_OK);
  EXPECT_EQ(verifyAgainstCa(ca, leaf, "other.example.test"), X509_V_ERR_HOSTNAME_MISMATCH);
  EXPECT_EQ(subjectAltNames(leaf), std::vector<std::string>{"DNS:api.example.test"});
  EXPECT_EQ(X509_check_host(leaf, "api.example.test", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ca(leaf), 0);
  EXPECT_EQ(X509_check_purpose(leaf, X509_PURPOSE_SSL_SERVER, 0), 1);

  // Valid from a little before now, for about a week.
  EXPECT_LT(X509_cmp_current_time(X509_get0_notBefore(leaf)), 0);
  long validity = secondsBetween(X509_get0_notBefore(leaf), X509_get0_notAfter(leaf));
  EXPECT_GE(validity, 7L * 86400);
  EXPECT_LE(validity, 7L * 86400 + 2 * 3600);

  // The leaf key is EC P-256 and shared; serials differ.
  auto other = server(*authority, "other.example.test");
  EXPECT_EQ(EVP_PKEY_get_base_id(X509_get0_pubkey(leaf)), EVP_PKEY_EC);
  EXPECT_EQ(EVP_PKEY_eq(X509_get0_pubkey(leaf), X509_get0_pubkey(leafOf(other))), 1);
  EXPECT_NE(ASN1_INTEGER_cmp(X509_get0_serialNumber(leaf), X509_get0_serialNumber(leafOf(other))), 0);
  EXPECT_NE(EVP_PKEY_eq(X509_get0_pubkey(leaf), X509_get0_pubkey(ca)), 1);
}

TEST_F(TlsAuthorityTest, LeafForIpLiteralHasAnIpSan) {
  auto authority = load(dir_);
  X509* ca = authority->caCertificate();
  auto v4 = server(*authority, "203.0.113.5");
  EXPECT_EQ(subjectAltNames(leafOf(v4)), std::vector<std::string>{"IP:203.0.113.5"});
  EXPECT_EQ(verifyAgainstCa(ca, leafOf(v4), "203.0.113.5"), X509_V_OK);
  EXPECT_EQ(verifyAgainstCa(ca, leafOf(v4), "203.0.113.6"), X509_V_ERR_IP_ADDRESS_MISMATCH);
  EXPECT_EQ(X509_check_ip_asc(leafOf(v4), "203.0.113.5", 0), 1);

  auto v6 = server(*authority, "2001:db8::1");
  EXPECT_EQ(subjectAltNames(leafOf(v6)), std::vector<std::string>{"IP:2001:db8::1"});
  EXPECT_EQ(verifyAgainstCa(ca, leafOf(v6), "2001:db8::1"), X509_V_OK);
}

TEST_F(TlsAuthorityTest, LongHostNameGetsNoCommonNameButACriticalSan) {
  auto authority = load(dir_);
  std::string host = std::string(63, 'a') + "." + std::string(63, 'b') + ".example.test";
  auto ctx = server(*authority, host);
  X509* leaf = leafOf(ctx);
  EXPECT_EQ(X509_NAME_entry_count(X509_get_subject_name(leaf)), 0);
  int index = X509_get_ext_by_NID(leaf, NID_subject_alt_name, -1);
  ASSERT_GE(index, 0);
  EXPECT_EQ(X509_EXTENSION_get_critical(X509_get_ext(leaf, index)), 1);
  EXPECT_EQ(verifyAgainstCa(authority->caCertificate(), leaf, host), X509_V_OK);
}

TEST_F(TlsAuthorityTest, ServerContextsAreCachedPerLowerCasedHost) {
  auto authority = load(dir_);
  auto a = server(*authority, "api.example.test");
  EXPECT_EQ(server(*authority, "api.example.test"), a);
  EXPECT_EQ(server(*authority, "API.Example.TEST"), a);
  EXPECT_NE(server(*authority, "b.example.test"), a);
  EXPECT_EQ(SSL_CTX_get_min_proto_version(a.get()), TLS1_2_VERSION);
}

TEST_F(TlsAuthorityTest, CacheIsBoundedAndEvictsTheLeastRecentlyUsed) {
  auto authority = load(dir_);
  auto first = server(*authority, "h0.example.test");
  auto kept = server(*authority, "h1.example.test");
  for (size_t i = 2; i < TlsAuthority::kMaxCachedHosts; ++i) {
    server(*authority, "h" + std::to_string(i) + ".example.test");
  }
  // Full now. Touch h1, then add one more: h0 is the one to go.
  EXPECT_EQ(server(*authority, "h1.example.test"), kept);
  server(*authority, "overflow.example.test");
  EXPECT_EQ(server(*authority, "h1.example.test"), kept);
  EXPECT_NE(server(*authority, "h0.example.test"), first);
}

TEST_F(TlsAuthorityTest, ServerContextIsThreadSafe) {
  auto authority = load(dir_);
  std::vector<std::thread> threads;
  std::vector<std::vector<SSL_CTX*>> seen(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 60; ++i) {
        auto ctx = authority->serverContext("t" + std::to_string(i % 15) + ".example.test");
        seen[t].push_back(ctx.ok() ? ctx.value().get() : nullptr);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int i = 0; i < 15; ++i) {
    auto ctx = server(*authority, "t" + std::to_string(i) + ".example.test");
    // Every thread's last sight of this host is the cached context.
    for (int t = 0; t < 4; ++t) EXPECT_EQ(seen[t][45 + i], ctx.get());
  }
}

TEST_F(TlsAuthorityTest, RefusesHostsThatAreNeitherDnsNamesNorIps) {
  auto authority = load(dir_);
  const std::vector<std::string> bad = {
      "",
      "a..b",
      ".a.example",
      "a.example.",
      "exa mple.test",
      std::string("foo\0bar.test", 12),
      "x,DNS:evil.test",
      "*.example.test",
      "[::1]",
      "fe80::1%eth0",
      "1.2.3.4 ",
      "a/b",
      std::string(64, 'a') + ".test",
      std::string(250, 'a') + ".test",
      "caf\xc3\xa9.test",
  };
  for (const std::string& host : bad) {
    auto ctx = authority->serverContext(host);
    ASSERT_FALSE(ctx.ok()) << host;
    EXPECT_EQ(ctx.error().code, Code::kInvalidArgument) << host;
    SSL_CTX* client = SSL_CTX_new(TLS_client_method());
    SSL* ssl = SSL_new(client);
    EXPECT_FALSE(TlsAuthority::prepareUpstream(ssl, host).ok()) << host;
    SSL_free(ssl);
    SSL_CTX_free(client);
  }
}

TEST_F(TlsAuthorityTest, HandshakeSucceedsForTheRightHost) {
  auto authority = load(dir_);
  auto result = handshake(server(*authority, "api.example.test"), upstream(dir_ + "/ca.crt"), "api.example.test");
  EXPECT_TRUE(result.clientOk);
  EXPECT_TRUE(result.serverOk);
  EXPECT_EQ(result.verifyResult, X509_V_OK);
  EXPECT_EQ(result.echoed, "ping");
}

TEST_F(TlsAuthorityTest, HandshakeFailsForAWrongHost) {
  auto authority = load(dir_);
  auto result = handshake(server(*authority, "api.example.test"), upstream(dir_ + "/ca.crt"), "other.example.test");
  EXPECT_FALSE(result.clientOk);
  EXPECT_FALSE(result.serverOk);
  EXPECT_EQ(result.verifyResult, X509_V_ERR_HOSTNAME_MISMATCH);
}

TEST_F(TlsAuthorityTest, HandshakeChecksIpLiterals) {
  auto authority = load(dir_);
  auto client = upstream(dir_ + "/ca.crt");
  auto ok = handshake(server(*authority, "203.0.113.5"), client, "203.0.113.5");
  EXPECT_TRUE(ok.clientOk);
  EXPECT_EQ(ok.echoed, "ping");
  auto wrong = handshake(server(*authority, "203.0.113.5"), client, "203.0.113.6");
  EXPECT_FALSE(wrong.clientOk);
  EXPECT_EQ(wrong.verifyResult, X509_V_ERR_IP_ADDRESS_MISMATCH);
}

TEST_F(TlsAuthorityTest, UpstreamContextRefusesAnUntrustedCa) {
  auto authority = load(dir_);
  // Another authority's CA file, and the system store: neither trusts ours.
  load(root_ + "/stranger");
  auto stranger =
      handshake(server(*authority, "api.example.test"), upstream(root_ + "/stranger/ca.crt"), "api.example.test");
  EXPECT_FALSE(stranger.clientOk);
  EXPECT_NE(stranger.verifyResult, X509_V_OK);
  auto system = handshake(server(*authority, "api.example.test"), upstream(""), "api.example.test");
  EXPECT_FALSE(system.clientOk);
  EXPECT_NE(system.verifyResult, X509_V_OK);
}

TEST_F(TlsAuthorityTest, UpstreamContextVerifiesPeersWithTls12AtLeast) {
  auto ctx = upstream("");
  EXPECT_EQ(SSL_CTX_get_verify_mode(ctx.get()) & SSL_VERIFY_PEER, SSL_VERIFY_PEER);
  EXPECT_EQ(SSL_CTX_get_min_proto_version(ctx.get()), TLS1_2_VERSION);
  auto missing = TlsAuthority::upstreamContext(root_ + "/no-such-bundle.pem");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("no-such-bundle.pem"), std::string::npos);
}

TEST_F(TlsAuthorityTest, PrepareUpstreamSetsSniForNamesOnly) {
  auto ctx = upstream("");
  SSL* ssl = SSL_new(ctx.get());
  ASSERT_TRUE(TlsAuthority::prepareUpstream(ssl, "API.example.test").ok());
  ASSERT_NE(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name), nullptr);
  EXPECT_STREQ(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name), "api.example.test");
  EXPECT_STREQ(SSL_get0_peername(ssl), nullptr);  // set only after a verified handshake
  SSL_free(ssl);
  ssl = SSL_new(ctx.get());
  ASSERT_TRUE(TlsAuthority::prepareUpstream(ssl, "203.0.113.5").ok());
  EXPECT_EQ(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name), nullptr);
  SSL_free(ssl);
}

TEST_F(TlsAuthorityTest, CorruptKeyFileIsAnErrorNamingIt) {
  load(dir_);
  ASSERT_TRUE(os::writeFile(dir_ + "/ca.key", "-----BEGIN PRIVATE KEY-----\ngarbage\n", 0600).ok());
  auto reloaded = TlsAuthority::loadOrCreate(dir_);
  ASSERT_FALSE(reloaded.ok());
  EXPECT_EQ(reloaded.error().code, Code::kInvalidArgument);
  EXPECT_NE(reloaded.error().message().find(dir_ + "/ca.key"), std::string::npos) << reloaded.error().message();
}

TEST_F(TlsAuthorityTest, CorruptCertificateFileIsAnErrorNamingIt) {
  load(dir_);
  ASSERT_TRUE(os::writeFile(dir_ + "/ca.crt", "not a certificate", 0644).ok());
  auto reloaded = TlsAuthority::loadOrCreate(dir_);
  ASSERT_FALSE(reloaded.ok());
  EXPECT_NE(reloaded.error().message().find(dir_ + "/ca.crt"), std::string::npos) << reloaded.error().message();
}

TEST_F(TlsAuthorityTest, MismatchedKeyIsAnError) {
  load(dir_);
  load(root_ + "/other");
  auto otherKey = os::readFile(root_ + "/other/ca.key");
  ASSERT_TRUE(otherKey.ok());
  ASSERT_TRUE(os::writeFile(dir_ + "/ca.key", otherKey.value(), 0600).ok());
  auto reloaded = TlsAuthority::loadOrCreate(dir_);
  ASSERT_FALSE(reloaded.ok());
  EXPECT_EQ(reloaded.error().code, Code::kInvalidArgument);
  EXPECT_NE(reloaded.error().message().find("ca.key is not the key of"), std::string::npos)
      << reloaded.error().message();
}

TEST_F(TlsAuthorityTest, MissingOrExposedKeyIsAnError) {
  load(dir_);
  ASSERT_EQ(chmod((dir_ + "/ca.key").c_str(), 0644), 0);
  auto exposed = TlsAuthority::loadOrCreate(dir_);
  ASSERT_FALSE(exposed.ok());
  EXPECT_EQ(exposed.error().code, Code::kInsecure);
  EXPECT_NE(exposed.error().message().find(dir_ + "/ca.key"), std::string::npos);

  ASSERT_EQ(unlink((dir_ + "/ca.key").c_str()), 0);
  auto missing = TlsAuthority::loadOrCreate(dir_);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find(dir_ + "/ca.key"), std::string::npos);
}

TEST_F(TlsAuthorityTest, HalfWrittenCaIsCreatedAgain) {
  // A crash after the key was renamed into place, before ca.crt: a key
  // without a certificate and a stale temporary file.
  std::string oldPem = load(dir_)->caCertificatePem();
  ASSERT_EQ(unlink((dir_ + "/ca.crt").c_str()), 0);
  ASSERT_TRUE(os::writeFile(dir_ + "/ca.key.tmp", "stale", 0644).ok());
  auto authority = load(dir_);
  EXPECT_NE(authority->caCertificatePem(), oldPem);
  EXPECT_EQ(fileMode(dir_ + "/ca.key"), 0600u);
  EXPECT_FALSE(os::exists(dir_ + "/ca.key.tmp"));
  EXPECT_EQ(load(dir_)->caCertificatePem(), authority->caCertificatePem());
}

}  // namespace
}  // namespace moat::egress
