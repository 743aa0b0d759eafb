#include "egress/tls_authority.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "common/hex.h"
#include "egress/host_name.h"
#include "os/file.h"

namespace moat::egress {
namespace {

template <class T, auto Free>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using BioPtr = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using NamePtr = std::unique_ptr<X509_NAME, Deleter<X509_NAME, X509_NAME_free>>;
using BignumPtr = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;
using GeneralNamesPtr = std::unique_ptr<GENERAL_NAMES, Deleter<GENERAL_NAMES, GENERAL_NAMES_free>>;
using GeneralNamePtr = std::unique_ptr<GENERAL_NAME, Deleter<GENERAL_NAME, GENERAL_NAME_free>>;

constexpr size_t kMaxPemFile = 1 << 20;
constexpr size_t kMaxCommonName = 64;  // ub-common-name, RFC 5280
constexpr long kBackdateSeconds = 3600;

// Takes OpenSSL's error queue (so it does not leak into the next call on
// this thread) and appends its first entry to the context.
std::string takeSslErrors() {
  unsigned long first = ERR_get_error();
  ERR_clear_error();
  if (first == 0) return "";
  char buf[256];
  ERR_error_string_n(first, buf, sizeof buf);
  return std::string(": ") + buf;
}
Error tlsError(const std::string& context) { return Error::make(Code::kTls, context + takeSslErrors()); }

// Never prompt on a terminal for a passphrase: an encrypted key is an error.
int noPassword(char*, int, int, void*) { return 0; }

struct IpAddress {
  unsigned char bytes[16];
  int size = 0;  // 4 or 16, 0 when not an IP literal
};

// Strict IPv4 dotted quad or IPv6 text (inet_pton, unlike OpenSSL's
// sscanf-based parser, refuses trailing junk).
IpAddress parseIp(const std::string& host) {
  IpAddress ip;
  if (::inet_pton(AF_INET, host.c_str(), ip.bytes) == 1) {
    ip.size = 4;
  } else if (::inet_pton(AF_INET6, host.c_str(), ip.bytes) == 1) {
    ip.size = 16;
  }
  return ip;
}

Error badHost(const std::string& host) {
  return Error::make(Code::kInvalidArgument, "not a DNS name or IP address: \"" + host + "\"");
}

Result<std::string> toPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return tlsError("encode certificate");
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

Result<std::string> keyToPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return tlsError("encode private key");
  }
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

Result<PkeyPtr> newEcKey() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return tlsError("generate EC P-256 key");
  return key;
}

// A 127-bit random positive serial: unique without any state to keep.
Status setRandomSerial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return tlsError("random serial");
  bytes[0] = static_cast<unsigned char>((bytes[0] & 0x7f) | 0x40);
  BignumPtr bn(BN_bin2bn(bytes, sizeof bytes, nullptr));
  if (!bn || BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert)) == nullptr) {
    return tlsError("set serial");
  }
  return {};
}

// Fixed-text extensions only: nothing from a request goes through OpenSSL's
// config syntax, where a comma would start another value.
Status addExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return tlsError(std::string("extension ") + OBJ_nid2sn(nid));
  int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) return tlsError(std::string("add extension ") + OBJ_nid2sn(nid));
  return {};
}

// Version 3, random serial, validity from an hour ago for `days`.
Result<X509Ptr> newCertificate(EVP_PKEY* publicKey, const X509_NAME* subject, const X509_NAME* issuer, int days) {
  X509Ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) return tlsError("new certificate");
  MOAT_TRY(setRandomSerial(cert.get()));
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), -kBackdateSeconds) == nullptr ||
      X509_time_adj_ex(X509_getm_notAfter(cert.get()), days, 0, nullptr) == nullptr ||
      X509_set_subject_name(cert.get(), subject) != 1 || X509_set_issuer_name(cert.get(), issuer) != 1 ||
      X509_set_pubkey(cert.get(), publicKey) != 1) {
    return tlsError("fill certificate");
  }
  return cert;
}

Result<NamePtr> commonName(const std::string& cn) {
  NamePtr name(X509_NAME_new());
  if (!name) return tlsError("new name");
  if (!cn.empty() && X509_NAME_add_entry_by_NID(name.get(), NID_commonName, MBSTRING_UTF8,
                                                reinterpret_cast<const unsigned char*>(cn.data()),
                                                static_cast<int>(cn.size()), -1, 0) != 1) {
    return tlsError("set common name");
  }
  return name;
}

struct NewCa {
  X509Ptr cert;
  PkeyPtr key;
};

Result<NewCa> generateCa() {
  MOAT_ASSIGN(PkeyPtr key, newEcKey());
  MOAT_ASSIGN(std::string suffix, randomHex(8));
  MOAT_ASSIGN(NamePtr name, commonName("moat egress CA " + suffix));
  MOAT_ASSIGN(X509Ptr cert, newCertificate(key.get(), name.get(), name.get(), TlsAuthority::kCaValidityDays));
  X509* c = cert.get();
  // pathlen:0: the CA signs leaves only, never another CA.
  MOAT_TRY(addExtension(c, c, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  MOAT_TRY(addExtension(c, c, NID_key_usage, "critical,keyCertSign,cRLSign"));
  MOAT_TRY(addExtension(c, c, NID_subject_key_identifier, "hash"));
  MOAT_TRY(addExtension(c, c, NID_authority_key_identifier, "keyid:always"));
  if (X509_sign(c, key.get(), EVP_sha256()) == 0) return tlsError("sign CA certificate");
  return NewCa{std::move(cert), std::move(key)};
}

// Writes `data` to path through path.tmp, created with O_EXCL and `mode`
// (fchmod'ed exactly, whatever the umask), synced, then renamed over path.
// The file is never visible with a wider mode, nor half-written at path.
Status writeFileAtomically(const std::string& path, const std::string& data, mode_t mode) {
  std::string tmp = path + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return Error::fromErrno("unlink " + tmp);
  MOAT_ASSIGN(UniqueFd fd, os::open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode));
  Status status;
  if (::fchmod(fd.get(), mode) != 0) status = Error::fromErrno("chmod " + tmp);
  size_t off = 0;
  while (status.ok() && off < data.size()) {
    ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = Error::fromErrno("write " + tmp);
    if (n > 0) off += static_cast<size_t>(n);
  }
  if (status.ok() && ::fsync(fd.get()) != 0) status = Error::fromErrno("fsync " + tmp);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = Error::fromErrno("rename " + tmp);
  }
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

Result<X509Ptr> readCertificate(const std::string& path) {
  MOAT_ASSIGN(std::string pem, os::readFile(path, kMaxPemFile));
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, noPassword, nullptr) : nullptr);
  if (!cert) return Error::make(Code::kInvalidArgument, path + ": not a PEM certificate" + takeSslErrors());
  return cert;
}

Result<PkeyPtr> readPrivateKey(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Error::fromErrno("stat " + path);
  if ((st.st_mode & 077) != 0) {
    return Error::make(Code::kInsecure, path + " is readable by others; chmod 600 it");
  }
  MOAT_ASSIGN(std::string pem, os::readFile(path, kMaxPemFile));
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, noPassword, nullptr) : nullptr);
  OPENSSL_cleanse(pem.data(), pem.size());
  if (!key) return Error::make(Code::kInvalidArgument, path + ": not an unencrypted PEM private key" + takeSslErrors());
  return key;
}

Result<std::shared_ptr<SSL_CTX>> newContext(const SSL_METHOD* method) {
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(method), SSL_CTX_free);
  if (!ctx) return tlsError("new SSL_CTX");
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) != 1) {
    return tlsError("set minimum TLS version");
  }
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  return ctx;
}

}  // namespace

TlsAuthority::TlsAuthority(X509* caCert, EVP_PKEY* caKey, std::string caPem, EVP_PKEY* leafKey)
    : caCert_(caCert), caKey_(caKey), caPem_(std::move(caPem)), leafKey_(leafKey) {}

TlsAuthority::~TlsAuthority() {
  X509_free(caCert_);
  EVP_PKEY_free(caKey_);
  EVP_PKEY_free(leafKey_);
}

Result<std::unique_ptr<TlsAuthority>> TlsAuthority::loadOrCreate(const std::string& dir) {
  std::string certPath = dir + "/ca.crt";
  std::string keyPath = dir + "/ca.key";
  X509Ptr cert;
  PkeyPtr key;
  // ca.crt is written last, so it marks a complete pair.
  if (os::exists(certPath)) {
    MOAT_ASSIGN(cert, readCertificate(certPath));
    MOAT_ASSIGN(key, readPrivateKey(keyPath));
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      return Error::make(Code::kInvalidArgument, keyPath + " is not the key of " + certPath);
    }
    if (X509_check_ca(cert.get()) != 1) {
      return Error::make(Code::kInvalidArgument, certPath + " is not a CA certificate");
    }
    if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) <= 0) {
      return Error::make(Code::kInvalidArgument, certPath +
                                                     " has expired; remove ca.crt and ca.key to create a "
                                                     "new CA (environments must trust the new one)");
    }
  } else {
    MOAT_TRY(os::makeDirs(dir, 0700));
    MOAT_ASSIGN(NewCa ca, generateCa());
    MOAT_ASSIGN(std::string keyPem, keyToPem(ca.key.get()));
    MOAT_ASSIGN(std::string certPem, toPem(ca.cert.get()));
    Status written = writeFileAtomically(keyPath, keyPem, 0600);
    OPENSSL_cleanse(keyPem.data(), keyPem.size());
    MOAT_TRY(written);
    MOAT_TRY(writeFileAtomically(certPath, certPem, 0644));
    cert = std::move(ca.cert);
    key = std::move(ca.key);
  }
  MOAT_ASSIGN(std::string pem, toPem(cert.get()));
  MOAT_ASSIGN(PkeyPtr leafKey, newEcKey());
  return std::unique_ptr<TlsAuthority>(
      new TlsAuthority(cert.release(), key.release(), std::move(pem), leafKey.release()));
}

Result<std::shared_ptr<SSL_CTX>> TlsAuthority::serverContext(const std::string& host) {
  std::string key;
  if (parseIp(host).size != 0) {
    key = host;
  } else if (!normalizeHostName(host, &key)) {
    return badHost(host);
  }
  {
    std::lock_guard lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Signing happens unlocked; two threads racing on one host both sign and
  // the first to insert wins.
  MOAT_ASSIGN(std::shared_ptr<SSL_CTX> ctx, makeServerContext(key));
  std::lock_guard lock(mutex_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second->second;
  lru_.emplace_front(key, ctx);
  cache_.emplace(key, lru_.begin());
  if (lru_.size() > kMaxCachedHosts) {
    cache_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return ctx;
}

Result<std::shared_ptr<SSL_CTX>> TlsAuthority::makeServerContext(const std::string& host) const {
  IpAddress ip = parseIp(host);
  // The name is in the SAN; the CN is a courtesy for humans and old tools,
  // left out when too long for it (the SAN is then critical, RFC 5280).
  bool withCn = host.size() <= kMaxCommonName;
  MOAT_ASSIGN(NamePtr subject, commonName(withCn ? host : ""));
  MOAT_ASSIGN(X509Ptr cert, newCertificate(leafKey_, subject.get(), X509_get_subject_name(caCert_), kLeafValidityDays));
  X509* c = cert.get();
  MOAT_TRY(addExtension(c, caCert_, NID_basic_constraints, "critical,CA:FALSE"));
  MOAT_TRY(addExtension(c, caCert_, NID_key_usage, "critical,digitalSignature"));
  MOAT_TRY(addExtension(c, caCert_, NID_ext_key_usage, "serverAuth"));
  MOAT_TRY(addExtension(c, caCert_, NID_subject_key_identifier, "hash"));
  MOAT_TRY(addExtension(c, caCert_, NID_authority_key_identifier, "keyid:always"));

  GeneralNamesPtr names(sk_GENERAL_NAME_new_null());
  GeneralNamePtr name(GENERAL_NAME_new());
  if (!names || !name) return tlsError("new subjectAltName");
  if (ip.size != 0) {
    ASN1_OCTET_STRING* value = ASN1_OCTET_STRING_new();
    if (value == nullptr || ASN1_OCTET_STRING_set(value, ip.bytes, ip.size) != 1) {
      ASN1_OCTET_STRING_free(value);
      return tlsError("subjectAltName IP");
    }
    GENERAL_NAME_set0_value(name.get(), GEN_IPADD, value);
  } else {
    ASN1_IA5STRING* value = ASN1_IA5STRING_new();
    if (value == nullptr || ASN1_STRING_set(value, host.data(), static_cast<int>(host.size())) != 1) {
      ASN1_IA5STRING_free(value);
      return tlsError("subjectAltName DNS");
    }
    GENERAL_NAME_set0_value(name.get(), GEN_DNS, value);
  }
  if (sk_GENERAL_NAME_push(names.get(), name.get()) == 0) return tlsError("subjectAltName");
  name.release();  // owned by `names` now
  int critical = withCn ? 0 : 1;
  if (X509_add1_ext_i2d(c, NID_subject_alt_name, names.get(), critical, X509V3_ADD_DEFAULT) != 1) {
    return tlsError("add subjectAltName");
  }
  if (X509_sign(c, caKey_, EVP_sha256()) == 0) return tlsError("sign certificate for " + host);

  MOAT_ASSIGN(std::shared_ptr<SSL_CTX> ctx, newContext(TLS_server_method()));
  SSL_CTX_set_options(ctx.get(), SSL_OP_CIPHER_SERVER_PREFERENCE);
  if (SSL_CTX_use_certificate(ctx.get(), c) != 1 || SSL_CTX_use_PrivateKey(ctx.get(), leafKey_) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return tlsError("server context for " + host);
  }
  return ctx;
}

Result<std::shared_ptr<SSL_CTX>> TlsAuthority::upstreamContext(const std::string& caBundleFile) {
  MOAT_ASSIGN(std::shared_ptr<SSL_CTX> ctx, newContext(TLS_client_method()));
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (caBundleFile.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) return tlsError("default CA paths");
  } else if (SSL_CTX_load_verify_file(ctx.get(), caBundleFile.c_str()) != 1) {
    return Error::make(Code::kInvalidArgument, caBundleFile + ": cannot load CA certificates" + takeSslErrors());
  }
  return ctx;
}

Status TlsAuthority::prepareUpstream(SSL* ssl, const std::string& host) {
  IpAddress ip = parseIp(host);
  if (ip.size != 0) {
    if (X509_VERIFY_PARAM_set1_ip(SSL_get0_param(ssl), ip.bytes, static_cast<size_t>(ip.size)) != 1) {
      return tlsError("verify IP " + host);
    }
    return {};
  }
  std::string name;
  if (!normalizeHostName(host, &name)) return badHost(host);
  SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (SSL_set_tlsext_host_name(ssl, name.c_str()) != 1 || SSL_set1_host(ssl, name.c_str()) != 1) {
    return tlsError("verify host " + host);
  }
  return {};
}

}  // namespace moat::egress
