// The stub resolver's DNS codec: queries built by hand, answers read back
// with libc's independent parser (ns_initparse), and malformed packets of
// every kind.
#include "egress/dns_message.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <gtest/gtest.h>
#include <resolv.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace moat::egress {
namespace {

std::string u16(unsigned v) { return {static_cast<char>(v >> 8 & 0xff), static_cast<char>(v & 0xff)}; }

std::string wireName(const std::vector<std::string>& labels) {
  std::string out;
  for (const auto& label : labels) out += static_cast<char>(label.size()) + label;
  return out + std::string(1, '\0');
}

std::string header(unsigned id, unsigned flags, unsigned qd, unsigned an = 0, unsigned ns = 0, unsigned ar = 0) {
  return u16(id) + u16(flags) + u16(qd) + u16(an) + u16(ns) + u16(ar);
}

constexpr unsigned kRd = 0x0100;

std::string query(unsigned id, const std::vector<std::string>& labels, unsigned type = kDnsTypeA,
                  unsigned flags = kRd) {
  return header(id, flags, 1) + wireName(labels) + u16(type) + u16(kDnsClassIN);
}

uint32_t ipv4(const char* text) {
  in_addr addr{};
  inet_pton(AF_INET, text, &addr);
  return addr.s_addr;  // network order
}

DnsQuery mustParse(const std::string& packet) {
  auto q = parseDnsQuery(packet);
  EXPECT_TRUE(q.ok()) << q.error().message();
  return q.ok() ? q.value() : DnsQuery{};
}

void expectMalformed(const std::string& packet, const std::string& why) {
  auto q = parseDnsQuery(packet);
  ASSERT_FALSE(q.ok()) << why;
  EXPECT_EQ(q.error().code, Code::kInvalidArgument) << why;
}

// A response as libc's parser reads it.
struct Parsed {
  bool ok = false;
  unsigned id = 0, rcode = 0, qr = 0, rd = 0, ra = 0, aa = 0, opcode = 0;
  int questions = 0, answers = 0, authority = 0, additional = 0;
  std::string questionName;
  unsigned questionType = 0, questionClass = 0;
  std::vector<std::string> answerNames;
  std::vector<uint32_t> addresses;  // network order
  std::vector<uint32_t> ttls;
};

Parsed libcParse(const std::string& packet) {
  Parsed p;
  ns_msg msg;
  if (ns_initparse(reinterpret_cast<const unsigned char*>(packet.data()), static_cast<int>(packet.size()), &msg) != 0) {
    return p;
  }
  p.id = ns_msg_id(msg);
  p.qr = ns_msg_getflag(msg, ns_f_qr);
  p.opcode = ns_msg_getflag(msg, ns_f_opcode);
  p.aa = ns_msg_getflag(msg, ns_f_aa);
  p.rd = ns_msg_getflag(msg, ns_f_rd);
  p.ra = ns_msg_getflag(msg, ns_f_ra);
  p.rcode = ns_msg_getflag(msg, ns_f_rcode);
  p.questions = ns_msg_count(msg, ns_s_qd);
  p.answers = ns_msg_count(msg, ns_s_an);
  p.authority = ns_msg_count(msg, ns_s_ns);
  p.additional = ns_msg_count(msg, ns_s_ar);
  ns_rr rr;
  if (p.questions > 0) {
    if (ns_parserr(&msg, ns_s_qd, 0, &rr) != 0) return p;
    p.questionName = ns_rr_name(rr);
    p.questionType = ns_rr_type(rr);
    p.questionClass = ns_rr_class(rr);
  }
  for (int i = 0; i < p.answers; ++i) {
    if (ns_parserr(&msg, ns_s_an, i, &rr) != 0) return p;
    if (ns_rr_type(rr) != ns_t_a || ns_rr_class(rr) != ns_c_in || ns_rr_rdlen(rr) != 4) return p;
    p.answerNames.push_back(ns_rr_name(rr));
    uint32_t addr;
    memcpy(&addr, ns_rr_rdata(rr), 4);
    p.addresses.push_back(addr);
    p.ttls.push_back(ns_rr_ttl(rr));
  }
  p.ok = true;
  return p;
}

TEST(DnsMessage, ParsesAQuery) {
  DnsQuery q = mustParse(query(0x1234, {"WwW", "Example", "COM"}));
  EXPECT_EQ(q.id, 0x1234);
  EXPECT_EQ(q.name, "www.example.com");
  EXPECT_EQ(q.type, kDnsTypeA);
  EXPECT_EQ(q.qclass, kDnsClassIN);
  EXPECT_TRUE(q.recursionDesired);

  q = mustParse(query(7, {"api", "example", "test"}, kDnsTypeAAAA, 0));
  EXPECT_EQ(q.type, kDnsTypeAAAA);
  EXPECT_FALSE(q.recursionDesired);

  q = mustParse(query(1, {"_dmarc", "a-b", "x0"}));
  EXPECT_EQ(q.name, "_dmarc.a-b.x0");
  EXPECT_EQ(mustParse(query(1, {})).name, "");  // the root
}

TEST(DnsMessage, ParsesWhatResMkqueryBuilds) {
  unsigned char buf[512];
  int n = res_mkquery(ns_o_query, "Host.Example.Test", ns_c_in, ns_t_a, nullptr, 0, nullptr, buf, sizeof buf);
  ASSERT_GT(n, 0);
  DnsQuery q = mustParse(std::string(reinterpret_cast<char*>(buf), static_cast<size_t>(n)));
  EXPECT_EQ(q.name, "host.example.test");
  EXPECT_EQ(q.type, kDnsTypeA);
}

TEST(DnsMessage, IgnoresAnEdnsOptRecord) {
  // What dig sends: the question, then an OPT pseudo-record in additional.
  std::string packet = header(9, kRd | 0x20 /* AD */, 1, 0, 0, 1) + wireName({"a", "test"}) + u16(kDnsTypeA) +
                       u16(kDnsClassIN) + std::string(1, '\0') + u16(41) + u16(1232) + std::string(4, '\0') + u16(0);
  DnsQuery q = mustParse(packet);
  EXPECT_EQ(q.name, "a.test");
}

TEST(DnsMessage, AnswerRoundTrip) {
  DnsQuery q = mustParse(query(0xbeef, {"Api", "Example", "Test"}));
  std::string answer = dnsAnswer(q, {ipv4("192.0.2.1"), ipv4("198.51.100.7")}, 300);
  Parsed p = libcParse(answer);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.id, 0xbeefu);
  EXPECT_EQ(p.qr, 1u);
  EXPECT_EQ(p.opcode, 0u);
  EXPECT_EQ(p.rd, 1u);
  EXPECT_EQ(p.ra, 1u);
  EXPECT_EQ(p.aa, 0u);
  EXPECT_EQ(p.rcode, 0u);
  EXPECT_EQ(p.questions, 1);
  EXPECT_EQ(p.answers, 2);
  EXPECT_EQ(p.authority, 0);
  EXPECT_EQ(p.additional, 0);
  EXPECT_EQ(p.questionName, "api.example.test");
  EXPECT_EQ(p.questionType, kDnsTypeA);
  EXPECT_EQ(p.questionClass, kDnsClassIN);
  EXPECT_EQ(p.answerNames, (std::vector<std::string>{"api.example.test", "api.example.test"}));
  EXPECT_EQ(p.addresses, (std::vector<uint32_t>{ipv4("192.0.2.1"), ipv4("198.51.100.7")}));
  EXPECT_EQ(p.ttls, (std::vector<uint32_t>{300, 300}));

  // Byte for byte: the question echoed, each record naming it by a pointer.
  std::string question = wireName({"api", "example", "test"}) + u16(kDnsTypeA) + u16(kDnsClassIN);
  std::string expected = header(0xbeef, 0x8180, 1, 2) + question;
  for (const char* ip : {"192.0.2.1", "198.51.100.7"}) {
    uint32_t addr = ipv4(ip);
    expected += u16(0xc00c) + u16(kDnsTypeA) + u16(kDnsClassIN) + u16(0) + u16(300) + u16(4) +
                std::string(reinterpret_cast<const char*>(&addr), 4);
  }
  EXPECT_EQ(answer, expected);
}

TEST(DnsMessage, EmptyAnswerIsNoErrorWithoutRecords) {
  DnsQuery q = mustParse(query(5, {"api", "example", "test"}, kDnsTypeAAAA, 0));
  Parsed p = libcParse(dnsAnswer(q, {}, 60));
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.rcode, 0u);
  EXPECT_EQ(p.rd, 0u);
  EXPECT_EQ(p.questions, 1);
  EXPECT_EQ(p.answers, 0);
  EXPECT_EQ(p.questionType, kDnsTypeAAAA);
}

TEST(DnsMessage, ErrorResponses) {
  DnsQuery q = mustParse(query(77, {"blocked", "test"}));
  for (int rcode : {kDnsNxDomain, kDnsRefused, kDnsServFail}) {
    std::string reply = dnsError(q, rcode);
    Parsed p = libcParse(reply);
    ASSERT_TRUE(p.ok);
    EXPECT_EQ(p.id, 77u);
    EXPECT_EQ(p.qr, 1u);
    EXPECT_EQ(p.rcode, static_cast<unsigned>(rcode));
    EXPECT_EQ(p.questions, 1);
    EXPECT_EQ(p.answers, 0);
    EXPECT_EQ(p.questionName, "blocked.test");
  }
}

TEST(DnsMessage, AnswersFitTheUdpLimit) {
  std::vector<uint32_t> many;
  for (uint32_t i = 0; i < 200; ++i) many.push_back(htonl(0x0a000000 + i));
  std::string label63(63, 'a');
  for (const auto& labels : {std::vector<std::string>{"a", "test"},
                             std::vector<std::string>{label63, label63, label63, std::string(61, 'b')}}) {
    DnsQuery q = mustParse(query(1, labels));
    std::string answer = dnsAnswer(q, many, 5);
    EXPECT_LE(answer.size(), kDnsMaxUdpMessage);
    Parsed p = libcParse(answer);
    ASSERT_TRUE(p.ok);
    EXPECT_GT(p.answers, 0);
    EXPECT_EQ(p.addresses, std::vector<uint32_t>(many.begin(), many.begin() + p.answers));
    // As many as fit: one more would not.
    EXPECT_GT(answer.size() + 16, kDnsMaxUdpMessage);
  }
}

TEST(DnsMessage, LongestNameRoundTrips) {
  std::string label63(63, 'a');
  std::vector<std::string> labels = {label63, label63, label63, std::string(61, 'b')};
  DnsQuery q = mustParse(query(1, labels));
  EXPECT_EQ(q.name.size(), 253u);
  Parsed p = libcParse(dnsAnswer(q, {ipv4("192.0.2.9")}, 1));
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.questionName, q.name);
  EXPECT_EQ(p.answerNames, std::vector<std::string>{q.name});
}

TEST(DnsMessage, HandMadeQueryStructsEncodeWellFormed) {
  // Not from the parser: empty and overlong labels must not break the wire.
  DnsQuery q{3, "..a." + std::string(80, 'x') + "..b", kDnsTypeA, kDnsClassIN, true};
  Parsed p = libcParse(dnsAnswer(q, {ipv4("192.0.2.1")}, 1));
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.questionName, "a." + std::string(63, 'x') + ".b");
  DnsQuery huge{3, std::string(2000, 'x') + "." + std::string(2000, 'y'), kDnsTypeA, kDnsClassIN, true};
  for (int i = 0; i < 10; ++i) huge.name += "." + std::string(63, 'z');
  Parsed h = libcParse(dnsError(huge, kDnsRefused));
  ASSERT_TRUE(h.ok);
  EXPECT_LE(h.questionName.size(), 253u);
}

TEST(DnsMessage, EveryTruncationIsMalformed) {
  std::string packet = query(0x4242, {"api", "example", "test"});
  for (size_t n = 0; n < packet.size(); ++n) expectMalformed(packet.substr(0, n), "prefix " + std::to_string(n));
}

TEST(DnsMessage, HeaderChecks) {
  expectMalformed(query(1, {"a"}, kDnsTypeA, 0x8000), "QR=1");
  expectMalformed(query(1, {"a"}, kDnsTypeA, 0x1000), "opcode 2 (status)");
  expectMalformed(query(1, {"a"}, kDnsTypeA, 0x0800), "opcode 1 (inverse)");
  expectMalformed(query(1, {"a"}, kDnsTypeA, 0x2800), "opcode 5 (update)");
  std::string q = wireName({"a", "test"}) + u16(1) + u16(1);
  expectMalformed(header(1, kRd, 0) + q, "qdcount 0");
  expectMalformed(header(1, kRd, 2) + q + q, "qdcount 2");
  expectMalformed(header(1, kRd, 0xffff) + q, "qdcount 65535");
}

TEST(DnsMessage, NameChecks) {
  std::string tail = u16(1) + u16(1);
  // Compression pointers: to the header, to itself (a loop), forward.
  expectMalformed(header(1, 0, 1) + "\xc0\x0c" + tail, "pointer to itself");
  expectMalformed(header(1, 0, 1) +
                      "\x01"
                      "a"
                      "\xc0\x0c" +
                      tail,
                  "pointer loop after a label");
  expectMalformed(header(1, 0, 1) + std::string("\xc0\x00", 2) + tail, "pointer to the header");
  expectMalformed(header(1, 0, 1) + std::string("\x40\x00", 2) + tail, "extended label type 0x40");
  expectMalformed(header(1, 0, 1) + std::string("\x80\x00", 2) + tail, "label type 0x80");
  // Label and name lengths.
  std::string label63(63, 'a');
  expectMalformed(header(1, 0, 1) + "\x3f" + std::string(62, 'a') + std::string(1, '\0') + tail,
                  "label shorter than its length");
  expectMalformed(query(1, {label63, label63, label63, std::string(62, 'b')}), "254 characters");
  expectMalformed(query(1, {label63, label63, label63, label63, label63}), "319 characters");
  std::string manyLabels;
  for (int i = 0; i < 200; ++i) manyLabels += std::string("\x01", 1) + "a";
  expectMalformed(header(1, 0, 1) + manyLabels + std::string(1, '\0') + tail, "400 characters");
  // Bytes that have no place in a host name.
  for (const std::string& label : {std::string("a b"), std::string("a\0b", 3), std::string("a.b"), std::string("\xff"),
                                   std::string("a/b"), std::string("*")}) {
    expectMalformed(query(1, {label, "test"}), "label " + label);
  }
  // Name ends, type/class missing.
  expectMalformed(header(1, 0, 1) + wireName({"a"}) + u16(1), "class missing");
}

TEST(DnsMessage, FormatErrorReplies) {
  EXPECT_FALSE(dnsFormatErrorFor("").has_value());
  EXPECT_FALSE(dnsFormatErrorFor(std::string(11, '\xff')).has_value());
  // A response is never answered.
  EXPECT_FALSE(dnsFormatErrorFor(header(1, 0x8000, 1)).has_value());

  auto reply = dnsFormatErrorFor(header(0xabcd, kRd, 5, 5, 5, 5) + "junk");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(*reply, header(0xabcd, 0x8181, 0));
  Parsed p = libcParse(*reply);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.rcode, static_cast<unsigned>(kDnsFormErr));
  EXPECT_EQ(p.id, 0xabcdu);

  reply = dnsFormatErrorFor(header(2, 0x1000, 1));  // opcode 2
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(*reply, header(2, 0x9080 | kDnsNotImp, 0));

  // Every malformed query with a header gets one.
  EXPECT_TRUE(dnsFormatErrorFor(header(1, 0, 1) + "\xc0\x0c").has_value());
}

TEST(DnsMessage, TcpFraming) {
  std::string a = query(1, {"a", "test"});
  std::string b = query(2, {"b", "test"});
  std::string stream = dnsTcpFrame(a) + dnsTcpFrame(b);
  EXPECT_EQ(stream.substr(0, 2), u16(a.size()));
  size_t consumed = 0;
  for (size_t n = 0; n < a.size() + 2; ++n) {
    EXPECT_FALSE(dnsTcpNextMessage(std::string_view(stream).substr(0, n), &consumed).has_value()) << n;
  }
  auto first = dnsTcpNextMessage(stream, &consumed);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, a);
  EXPECT_EQ(consumed, a.size() + 2);
  auto second = dnsTcpNextMessage(std::string_view(stream).substr(consumed), &consumed);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*second, b);
  EXPECT_EQ(consumed, b.size() + 2);

  auto empty = dnsTcpNextMessage(std::string("\0\0", 2), &consumed);
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(*empty, "");
  EXPECT_EQ(consumed, 2u);
  EXPECT_EQ(dnsTcpFrame(std::string(65535, 'x')).size(), 65537u);
  EXPECT_EQ(dnsTcpFrame(std::string(65536, 'x')), "");
}

TEST(DnsMessage, RandomGarbageNeverCrashes) {
  std::mt19937 rng(4321);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<size_t> length(0, 300);
  std::string valid = query(1, {"api", "example", "test"});
  for (int i = 0; i < 30000; ++i) {
    std::string data;
    if (i % 2 == 0) {
      data.resize(length(rng));
      for (char& c : data) c = static_cast<char>(byte(rng));
    } else {
      data = valid;
      for (int f = 0; f < 1 + i % 3; ++f) data[length(rng) % data.size()] = static_cast<char>(byte(rng));
      data.resize(std::min(data.size(), length(rng)));
    }
    auto q = parseDnsQuery(data);
    if (q.ok()) {
      EXPECT_LE(q.value().name.size(), 253u);
      // Whatever parses answers well-formed.
      EXPECT_TRUE(libcParse(dnsAnswer(q.value(), {ipv4("192.0.2.1")}, 1)).ok);
    } else {
      EXPECT_EQ(q.error().code, Code::kInvalidArgument);
      auto reply = dnsFormatErrorFor(data);
      EXPECT_EQ(reply.has_value(), data.size() >= 12 && (static_cast<uint8_t>(data[2]) & 0x80) == 0);
    }
  }
}

}  // namespace
}  // namespace moat::egress
