#include "egress/http_target.h"

#include <gtest/gtest.h>

#include <string>

// The proxy's reading of a request's authority (src/egress/http_target.h);
// fuzz/proxy_http.cc checks its promises on arbitrary bytes.
namespace moat::egress {
namespace {

struct Split {
  bool ok;
  std::string host;
  uint16_t port;
};

Split split(const std::string& authority, uint16_t defaultPort = 80) {
  Split s{false, "", 0};
  s.ok = splitAuthority(authority, defaultPort, s.host, s.port);
  return s;
}

TEST(HttpTarget, HostAndPort) {
  auto s = split("example.com:8080");
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(s.host, "example.com");
  EXPECT_EQ(s.port, 8080);
  s = split("pypi.org", 443);
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(s.host, "pypi.org");
  EXPECT_EQ(s.port, 443);
}

TEST(HttpTarget, HostIsCanonical) {
  // A trailing dot or upper case must not make another host of it for the rules.
  auto s = split("API.Example.COM.:443");
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(s.host, "api.example.com");
  EXPECT_EQ(s.port, 443);
  EXPECT_TRUE(split("x_y-z.example").ok);
}

TEST(HttpTarget, RefusesWhatIsNotAHostAndPort) {
  for (const char* bad :
       {"",      ":80", "a:",  "a:0", "a:65536",      "a:123456", "a:8o", "a:+80", "a:-1",          "[::1]:80",
        "[::1]", "a b", "a/b", "a@b", "user@host:80", "a:80:90",  ".",    "a..",   "h\xc3\xa9.com", "a\r\nb"}) {
    EXPECT_FALSE(split(bad).ok) << bad;
  }
  EXPECT_FALSE(split(std::string(254, 'a')).ok);
  EXPECT_TRUE(split(std::string(253, 'a')).ok);
  EXPECT_FALSE(split(std::string(301, 'a')).ok);
}

}  // namespace
}  // namespace moat::egress
