#include <gtest/gtest.h>

#include "websocket/frame.h"

namespace moat::websocket {
namespace {

Result<bool> parseOne(Parser& p, const std::string& bytes, Message& m) {
  p.feed(bytes.data(), bytes.size());
  return p.next(m);
}

TEST(WebSocketFrame, RoundTripsEveryLengthForm) {
  for (size_t n : {0ul, 5ul, 125ul, 126ul, 65535ul, 65536ul, 300000ul}) {
    std::string payload(n, 'q');
    Parser server(true, 1 << 20);
    Message m;
    auto r = parseOne(server, encodeFrame(Opcode::kBinary, payload, true), m);
    ASSERT_TRUE(r.ok()) << n << ": " << r.error().message();
    ASSERT_TRUE(r.value()) << n;
    EXPECT_EQ(m.opcode, Opcode::kBinary);
    EXPECT_EQ(m.data, payload);
    Parser client(false, 1 << 20);
    r = parseOne(client, encodeFrame(Opcode::kText, payload, false), m);
    ASSERT_TRUE(r.ok() && r.value()) << n;
    EXPECT_EQ(m.data, payload);
  }
}

TEST(WebSocketFrame, WaitsForWholeFramesFedByteByByte) {
  std::string frame = encodeFrame(Opcode::kText, "hello", true);
  Parser p(true, 1024);
  Message m;
  for (size_t i = 0; i + 1 < frame.size(); ++i) {
    p.feed(&frame[i], 1);
    auto r = p.next(m);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r.value());
  }
  p.feed(&frame.back(), 1);
  auto r = p.next(m);
  ASSERT_TRUE(r.ok() && r.value());
  EXPECT_EQ(m.data, "hello");
}

TEST(WebSocketFrame, JoinsFragmentsAroundControlFrames) {
  // "hel" (text, not FIN), ping, "lo" (continuation, FIN).
  std::string first = encodeFrame(Opcode::kText, "hel", true);
  first[0] = static_cast<char>(first[0] & 0x7f);
  std::string last = encodeFrame(Opcode::kContinuation, "lo", true);
  Parser p(true, 1024);
  std::string all = first + encodeFrame(Opcode::kPing, "p", true) + last;
  p.feed(all.data(), all.size());
  Message m;
  ASSERT_TRUE(p.next(m).value());
  EXPECT_EQ(m.opcode, Opcode::kPing);
  ASSERT_TRUE(p.next(m).value());
  EXPECT_EQ(m.opcode, Opcode::kText);
  EXPECT_EQ(m.data, "hello");
}

TEST(WebSocketFrame, RefusesWhatBreaksTheProtocol) {
  Message m;
  {
    Parser server(true, 1024);  // a client that does not mask
    EXPECT_FALSE(parseOne(server, encodeFrame(Opcode::kBinary, "x", false), m).ok());
  }
  {
    Parser client(false, 1024);  // a server that masks
    EXPECT_FALSE(parseOne(client, encodeFrame(Opcode::kBinary, "x", true), m).ok());
  }
  {
    Parser p(true, 16);  // over the size limit, refused from the header alone
    std::string big = encodeFrame(Opcode::kBinary, std::string(17, 'x'), true);
    EXPECT_FALSE(parseOne(p, big.substr(0, 6), m).ok());
  }
  {
    Parser p(true, 1024);  // reserved bits
    std::string f = encodeFrame(Opcode::kBinary, "x", true);
    f[0] = static_cast<char>(f[0] | 0x40);
    EXPECT_FALSE(parseOne(p, f, m).ok());
  }
  {
    Parser p(true, 1024);  // unknown opcode
    std::string f = encodeFrame(Opcode::kBinary, "x", true);
    f[0] = static_cast<char>(0x83);
    EXPECT_FALSE(parseOne(p, f, m).ok());
  }
  {
    Parser p(true, 1024);  // continuation with nothing to continue
    EXPECT_FALSE(parseOne(p, encodeFrame(Opcode::kContinuation, "x", true), m).ok());
  }
  {
    Parser p(true, 1024);  // a control frame longer than 125 bytes
    EXPECT_FALSE(parseOne(p, encodeFrame(Opcode::kPing, std::string(126, 'p'), true), m).ok());
  }
  {
    Parser p(true, 1ul << 40);  // a 2^63 length does not wrap around
    std::string f = "\x82\xff\x7f\xff\xff\xff\xff\xff\xff\xff";
    f += std::string(4, '\0');
    auto r = parseOne(p, f, m);
    EXPECT_TRUE(!r.ok() || !r.value());
  }
}

TEST(WebSocketFrame, ClosePayloadCarriesCodeAndAShortReason) {
  std::string p = closePayload(1002, std::string(200, 'r'));
  EXPECT_EQ(p.size(), 125u);
  EXPECT_EQ(static_cast<unsigned char>(p[0]), 0x03);
  EXPECT_EQ(static_cast<unsigned char>(p[1]), 0xea);
}

}  // namespace
}  // namespace moat::websocket
