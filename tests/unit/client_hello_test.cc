// SNI extraction from the first bytes of a TLS connection: real ClientHellos
// from OpenSSL, every prefix of them, hellos split over records, and
// hand-built ones whose every length field lies.
#include "egress/client_hello.h"

#include <gtest/gtest.h>
#include <openssl/ssl.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace moat::egress {
namespace {

// What an OpenSSL client writes first: its ClientHello records.
std::string openSslClientHello(const char* serverName, int maxVersion = 0) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (maxVersion != 0) SSL_CTX_set_max_proto_version(ctx, maxVersion);
  SSL* ssl = SSL_new(ctx);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, in, out);
  if (serverName != nullptr) SSL_set_tlsext_host_name(ssl, serverName);
  SSL_set_connect_state(ssl);
  if (SSL_do_handshake(ssl) == 1) throw std::runtime_error("handshake without a server");
  char* data = nullptr;
  long size = BIO_get_mem_data(out, &data);
  std::string hello(data, static_cast<size_t>(size));
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  return hello;
}

std::string be16(size_t v) { return {static_cast<char>(v >> 8 & 0xff), static_cast<char>(v & 0xff)}; }
std::string u24(size_t v) { return static_cast<char>(v >> 16 & 0xff) + be16(v); }

std::string record(const std::string& fragment, uint8_t type = 22) {
  return std::string{static_cast<char>(type), 3, 1} + be16(fragment.size()) + fragment;
}

// The handshake message inside `hello` records of any size, cut into
// records of `size` bytes.
std::string refragment(const std::string& records, size_t size) {
  std::string message;
  for (size_t pos = 0; pos + 5 <= records.size();) {
    size_t length = static_cast<uint8_t>(records[pos + 3]) << 8 | static_cast<uint8_t>(records[pos + 4]);
    message += records.substr(pos + 5, length);
    pos += 5 + length;
  }
  std::string out;
  for (size_t pos = 0; pos < message.size(); pos += size) out += record(message.substr(pos, size));
  return out;
}

// A ClientHello built field by field. `offsets` records where each length
// field sits (name -> {offset, width}) so tests can make it lie.
struct Builder {
  std::string sessionId = std::string(32, 's');
  std::string cipherSuites = std::string("\x13\x01\x13\x02\xc0\x2b", 6);
  std::string compression = std::string(1, '\0');
  bool withExtensions = true;
  std::vector<std::pair<uint16_t, std::string>> extensions;

  static std::string serverNameExtension(const std::vector<std::pair<uint8_t, std::string>>& names) {
    std::string list;
    for (const auto& [type, name] : names) list += static_cast<char>(type) + be16(name.size()) + name;
    return be16(list.size()) + list;
  }
  Builder& sni(const std::string& name) {
    extensions.emplace_back(0, serverNameExtension({{0, name}}));
    return *this;
  }
  Builder& extension(uint16_t type, std::string data) {
    extensions.emplace_back(type, std::move(data));
    return *this;
  }

  struct Field {
    std::string name;
    size_t offset;
    int width;
  };
  std::vector<Field> fields;

  std::string body() {
    fields.clear();
    std::string b = be16(0x0303) + std::string(32, 'r');
    fields.push_back({"session_id", b.size(), 1});
    b += static_cast<char>(sessionId.size()) + sessionId;
    fields.push_back({"cipher_suites", b.size(), 2});
    b += be16(cipherSuites.size()) + cipherSuites;
    fields.push_back({"compression", b.size(), 1});
    b += static_cast<char>(compression.size()) + compression;
    if (withExtensions) {
      std::string all;
      std::vector<Field> inner;
      for (const auto& [type, data] : extensions) {
        inner.push_back({"extension " + std::to_string(type), all.size() + 2, 2});
        if (type == 0) {
          inner.push_back({"server_name_list", all.size() + 4, 2});
          inner.push_back({"host_name", all.size() + 7, 2});
        }
        all += be16(type) + be16(data.size()) + data;
      }
      fields.push_back({"extensions", b.size(), 2});
      for (auto& f : inner) f.offset += b.size() + 2;
      fields.insert(fields.end(), inner.begin(), inner.end());
      b += be16(all.size()) + all;
    }
    return b;
  }
  // One record; field offsets are made absolute.
  std::string build() {
    std::string b = body();
    for (auto& f : fields) f.offset += 9;
    fields.insert(fields.begin(), {"record", 3, 2});
    fields.insert(fields.begin() + 1, {"handshake", 6, 3});
    return record("\x01" + u24(b.size()) + b);
  }
};

HelloStatus parse(std::string_view data, std::string* name = nullptr) {
  ClientHello hello;
  hello.serverName = "untouched";
  HelloStatus status = parseClientHello(data, &hello);
  if (status != HelloStatus::kOk) {
    EXPECT_EQ(hello.serverName, "untouched") << "out written on " << toString(status);
  }
  if (name != nullptr) *name = hello.serverName;
  return status;
}

bool plausibleHost(const std::string& name) {
  if (name.size() > 253) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

TEST(ClientHello, OpenSslHelloWithSni) {
  for (int version : {0, TLS1_2_VERSION}) {
    std::string name;
    EXPECT_EQ(parse(openSslClientHello("api.example.test", version), &name), HelloStatus::kOk);
    EXPECT_EQ(name, "api.example.test");
  }
}

TEST(ClientHello, ServerNameIsLowerCased) {
  std::string name;
  EXPECT_EQ(parse(openSslClientHello("API.Example.TEST"), &name), HelloStatus::kOk);
  EXPECT_EQ(name, "api.example.test");
}

TEST(ClientHello, OpenSslHelloWithoutSni) {
  std::string name = "x";
  EXPECT_EQ(parse(openSslClientHello(nullptr), &name), HelloStatus::kOk);
  EXPECT_EQ(name, "");
}

TEST(ClientHello, BytesAfterTheHelloAreIgnored) {
  std::string name;
  EXPECT_EQ(parse(openSslClientHello("a.test") + record("\x14", 20) + "junk", &name), HelloStatus::kOk);
  EXPECT_EQ(name, "a.test");
}

TEST(ClientHello, EveryPrefixNeedsMore) {
  for (const std::string& hello : {openSslClientHello("api.example.test"), openSslClientHello(nullptr)}) {
    for (size_t n = 0; n < hello.size(); ++n) {
      ASSERT_EQ(parse(std::string_view(hello).substr(0, n)), HelloStatus::kNeedMore) << n;
    }
    EXPECT_EQ(parse(hello), HelloStatus::kOk);
  }
}

TEST(ClientHello, HelloSplitOverRecordsIsJoined) {
  std::string hello = openSslClientHello("split.example.test");
  for (size_t size : {1, 2, 3, 4, 5, 7, 64, 100, 511}) {
    std::string split = refragment(hello, size);
    std::string name;
    ASSERT_EQ(parse(split, &name), HelloStatus::kOk) << size;
    EXPECT_EQ(name, "split.example.test");
    for (size_t n = 0; n < split.size(); ++n) {
      ASSERT_EQ(parse(std::string_view(split).substr(0, n)), HelloStatus::kNeedMore) << size << " " << n;
    }
  }
}

TEST(ClientHello, OtherRecordInsideTheHelloIsMalformed) {
  std::string split = refragment(openSslClientHello("a.test"), 50);
  // A ChangeCipherSpec record between the first two fragments.
  std::string interleaved = split.substr(0, 55) + record("\x01", 20) + split.substr(55);
  EXPECT_EQ(parse(interleaved), HelloStatus::kMalformed);
  EXPECT_EQ(parse(interleaved.substr(0, 56)), HelloStatus::kMalformed);  // its first byte is enough
  EXPECT_EQ(parse(interleaved.substr(0, 55)), HelloStatus::kNeedMore);
}

TEST(ClientHello, LargeHelloUpToTheBoundIsFine) {
  // A padding extension pushes the hello over one record.
  std::string big = Builder().sni("big.test").extension(21, std::string(40000, '\0')).build();
  std::string name;
  EXPECT_EQ(parse(refragment(big, kMaxTlsRecordPayload), &name), HelloStatus::kOk);
  EXPECT_EQ(name, "big.test");
}

TEST(ClientHello, HelloBeyondTheBoundIsMalformed) {
  // Split into 1-byte records, 8000 bytes of hello take 48000 bytes; 12000 take 72000.
  std::string fits = refragment(Builder().sni("a.test").extension(21, std::string(8000, '\0')).build(), 1);
  ASSERT_LT(fits.size(), kMaxClientHelloBytes);
  EXPECT_EQ(parse(fits), HelloStatus::kOk);
  std::string over = refragment(Builder().sni("a.test").extension(21, std::string(12000, '\0')).build(), 1);
  EXPECT_EQ(parse(std::string_view(over).substr(0, kMaxClientHelloBytes - 10)), HelloStatus::kNeedMore);
  EXPECT_EQ(parse(std::string_view(over).substr(0, kMaxClientHelloBytes + 10)), HelloStatus::kMalformed);
  // A declared handshake length past the bound is refused at once.
  EXPECT_EQ(parse(record("\x01" + u24(0xffffff) + std::string(100, 'x'))), HelloStatus::kMalformed);
  EXPECT_EQ(parse(record("\x01" + u24(kMaxClientHelloBytes) + std::string(100, 'x'))), HelloStatus::kMalformed);
}

TEST(ClientHello, NonTlsStreamsAreRecognisedEarly) {
  EXPECT_EQ(parse(""), HelloStatus::kNeedMore);
  EXPECT_EQ(parse("\x16"), HelloStatus::kNeedMore);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: example.test\r\n\r\n"), HelloStatus::kNotTls);
  EXPECT_EQ(parse("CONNECT example.test:443 HTTP/1.1\r\n\r\n"), HelloStatus::kNotTls);
  EXPECT_EQ(parse("G"), HelloStatus::kNotTls);
  EXPECT_EQ(parse("SSH-2.0-OpenSSH_9.6\r\n"), HelloStatus::kNotTls);
  EXPECT_EQ(parse(std::string("\x80\x2e\x01\x00\x02", 5)), HelloStatus::kNotTls);  // SSLv2 hello
  EXPECT_EQ(parse(std::string("\x16\x04", 2)), HelloStatus::kNotTls);
  EXPECT_EQ(parse(std::string("\x16\x00\x01\x00\x05", 5)), HelloStatus::kNotTls);
  EXPECT_EQ(parse(record("hello", 23)), HelloStatus::kNotTls);  // application data
}

TEST(ClientHello, RecordLengthsOutOfRangeAreMalformed) {
  EXPECT_EQ(parse(std::string("\x16\x03\x01\x00\x00", 5) + "xxxx"), HelloStatus::kMalformed);
  EXPECT_EQ(parse(std::string("\x16\x03\x01\x40\x01", 5)), HelloStatus::kMalformed);  // 16385
  EXPECT_EQ(parse(std::string("\x16\x03\x01\xff\xff", 5)), HelloStatus::kMalformed);
  EXPECT_EQ(parse(std::string("\x16\x03\x01\x40\x00", 5)), HelloStatus::kNeedMore);  // 16384
}

TEST(ClientHello, OtherHandshakeMessagesAreMalformed) {
  std::string hello = Builder().sni("a.test").build();
  hello[5] = 2;  // ServerHello
  EXPECT_EQ(parse(hello), HelloStatus::kMalformed);
  EXPECT_EQ(parse(hello.substr(0, 9)), HelloStatus::kMalformed);
}

TEST(ClientHello, BuilderHelloParses) {
  std::string name;
  EXPECT_EQ(
      parse(Builder().extension(10, be16(2) + be16(29)).sni("a.test").extension(43, "\x02\x03\x04").build(), &name),
      HelloStatus::kOk);
  EXPECT_EQ(name, "a.test");
  Builder noExtensions;
  noExtensions.withExtensions = false;
  name = "x";
  EXPECT_EQ(parse(noExtensions.build(), &name), HelloStatus::kOk);
  EXPECT_EQ(name, "");
  EXPECT_EQ(parse(Builder().build(), &name), HelloStatus::kOk);  // an empty extensions block
  EXPECT_EQ(name, "");
}

// Every length field, made to claim each of many wrong values: never a crash
// (the sanitizer build checks the reads), and never kOk, except that a
// lying length of an extension the parser skips can land on a boundary of
// the nested server_name TLVs and still frame a valid hello (one whose SNI
// has been swallowed as that extension's data): then the name is empty.
TEST(ClientHello, EveryLengthFieldLying) {
  Builder builder;
  builder.extension(10, be16(4) + be16(29) + be16(23)).sni("lying.example.test").extension(16, be16(3) + "\x02h2");
  std::string hello = builder.build();
  ASSERT_EQ(parse(hello), HelloStatus::kOk);
  ASSERT_GE(builder.fields.size(), 9u);
  for (const auto& field : builder.fields) {
    size_t truth = 0;
    for (int i = 0; i < field.width; ++i) truth = truth << 8 | static_cast<uint8_t>(hello[field.offset + i]);
    size_t max = (size_t{1} << (8 * field.width)) - 1;
    std::vector<size_t> lies = {0, 1, max, max - 1, max / 2 + 1};
    for (size_t delta = 1; delta <= 40; ++delta) {
      lies.push_back(truth + delta);
      if (truth >= delta) lies.push_back(truth - delta);
    }
    for (size_t lie : lies) {
      if (lie == truth || lie > max) continue;
      std::string bad = hello;
      for (int i = field.width - 1, v = static_cast<int>(lie); i >= 0; --i, v >>= 8) {
        bad[field.offset + i] = static_cast<char>(v & 0xff);
      }
      std::string name;
      HelloStatus status = parse(bad, &name);
      bool skipped = field.name.rfind("extension ", 0) == 0 && field.name != "extension 0";
      if (skipped && status == HelloStatus::kOk) {
        EXPECT_EQ(name, "") << field.name << " = " << lie;
      } else {
        EXPECT_NE(status, HelloStatus::kOk) << field.name << " = " << lie << " (truly " << truth << ")";
      }
    }
  }
}

TEST(ClientHello, BodyFieldsOutOfRangeAreMalformed) {
  Builder longSession;
  longSession.sessionId = std::string(33, 's');
  EXPECT_EQ(parse(longSession.sni("a.test").build()), HelloStatus::kMalformed);
  Builder oddCiphers;
  oddCiphers.cipherSuites = "\x13\x01\x13";
  EXPECT_EQ(parse(oddCiphers.build()), HelloStatus::kMalformed);
  Builder noCiphers;
  noCiphers.cipherSuites = "";
  EXPECT_EQ(parse(noCiphers.build()), HelloStatus::kMalformed);
  Builder noCompression;
  noCompression.compression = "";
  EXPECT_EQ(parse(noCompression.build()), HelloStatus::kMalformed);

  // One byte after the compression methods: half an extensions length.
  Builder b;
  b.withExtensions = false;
  std::string body = b.body() + std::string(1, '\0');
  EXPECT_EQ(parse(record("\x01" + u24(body.size()) + body)), HelloStatus::kMalformed);
  // Bytes after the extensions block.
  body = Builder().sni("a.test").body() + "zz";
  EXPECT_EQ(parse(record("\x01" + u24(body.size()) + body)), HelloStatus::kMalformed);
  // A legacy_version that is not 3.x.
  body = Builder().sni("a.test").body();
  body[0] = 2;
  EXPECT_EQ(parse(record("\x01" + u24(body.size()) + body)), HelloStatus::kMalformed);
}

TEST(ClientHello, ServerNameExtensionShapes) {
  auto withSni = [](std::string extensionData) { return Builder().extension(0, std::move(extensionData)).build(); };
  std::string name;
  // An unknown name type is skipped by its length; the host_name still counts.
  EXPECT_EQ(parse(withSni(Builder::serverNameExtension({{7, "whatever"}, {0, "b.test"}})), &name), HelloStatus::kOk);
  EXPECT_EQ(name, "b.test");
  EXPECT_EQ(parse(withSni(Builder::serverNameExtension({{7, "whatever"}})), &name), HelloStatus::kOk);
  EXPECT_EQ(name, "");
  // Two host names, two extensions, an empty list, an empty name, trailing bytes.
  EXPECT_EQ(parse(withSni(Builder::serverNameExtension({{0, "a.test"}, {0, "b.test"}}))), HelloStatus::kMalformed);
  EXPECT_EQ(parse(Builder().sni("a.test").sni("a.test").build()), HelloStatus::kMalformed);
  EXPECT_EQ(parse(withSni(be16(0))), HelloStatus::kMalformed);
  EXPECT_EQ(parse(withSni("")), HelloStatus::kMalformed);
  EXPECT_EQ(parse(withSni(Builder::serverNameExtension({{0, ""}}))), HelloStatus::kMalformed);
  EXPECT_EQ(parse(withSni(Builder::serverNameExtension({{0, "a.test"}}) + "x")), HelloStatus::kMalformed);
}

TEST(ClientHello, HostNameMustLookLikeADnsName) {
  std::string label63(63, 'a');
  std::string longest = label63 + "." + label63 + "." + label63 + "." + std::string(61, 'd');
  ASSERT_EQ(longest.size(), 253u);
  for (const std::string& good :
       {std::string("a"), std::string("xn--bcher-kva.example"), std::string("_dmarc.under_score.test"),
        std::string("1.2.3.4"), std::string("a-b.c-d.test"), label63 + ".test", longest}) {
    std::string name;
    EXPECT_EQ(parse(Builder().sni(good).build(), &name), HelloStatus::kOk) << good;
    EXPECT_EQ(name, good);
  }
  for (const std::string& bad :
       {std::string("a\0b.test", 8), std::string("a.test\0", 7), std::string("exa mple.test"), std::string("a/b.test"),
        std::string("a:443"), std::string("a..b"), std::string(".a.test"), std::string("a.test."), std::string("."),
        std::string("caf\xc3\xa9.test"), std::string("*.example.test"), std::string("a\r\nb"),
        std::string(64, 'a') + ".test", longest + "e", std::string(300, 'a')}) {
    EXPECT_EQ(parse(Builder().sni(bad).build()), HelloStatus::kMalformed) << bad;
  }
}

TEST(ClientHello, RandomGarbageNeverCrashes) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<size_t> length(0, 700);
  for (int i = 0; i < 20000; ++i) {
    std::string data(length(rng), '\0');
    for (char& c : data) c = static_cast<char>(byte(rng));
    // Half of them start like a handshake record so the parser gets further.
    if (i % 2 == 0 && data.size() >= 6) {
      data[0] = 22;
      data[1] = 3;
      data[5] = 1;
    }
    std::string name;
    if (parse(data, &name) == HelloStatus::kOk) {
      EXPECT_TRUE(plausibleHost(name)) << name;
    }
  }
}

TEST(ClientHello, MutatedRealHellosNeverCrash) {
  std::string hello = openSslClientHello("mutate.example.test");
  std::mt19937 rng(99);
  std::uniform_int_distribution<size_t> position(0, hello.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 20000; ++i) {
    std::string bad = hello;
    int flips = 1 + i % 4;
    for (int f = 0; f < flips; ++f) bad[position(rng)] = static_cast<char>(byte(rng));
    if (i % 3 == 0) bad.resize(position(rng));
    std::string name;
    if (parse(bad, &name) == HelloStatus::kOk) {
      EXPECT_TRUE(plausibleHost(name)) << name;
    }
  }
}

}  // namespace
}  // namespace moat::egress
