#include "egress/public_suffix.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include "egress/secrets.h"

namespace moat::egress {
namespace {

using nlohmann::json;

TEST(PublicSuffix, UnicodeLabelsBecomeTheirAsciiForm) {
  // RFC 3492 and IANA's own examples.
  EXPECT_EQ(asciiLabel("bücher"), "xn--bcher-kva");
  EXPECT_EQ(asciiLabel("münchen"), "xn--mnchen-3ya");
  EXPECT_EQ(asciiLabel("公司"), "xn--55qx5d");
  EXPECT_EQ(asciiLabel("中国"), "xn--fiqs8s");
  EXPECT_EQ(asciiLabel("Example"), "example");
  EXPECT_EQ(asciiLabel("\xff"), "");      // not UTF-8
  EXPECT_EQ(asciiLabel("\xc0\xae"), "");  // an overlong "."
}

TEST(PublicSuffix, RulesWildcardsAndExceptions) {
  auto list = PublicSuffixList::parse(
      "// ===BEGIN ICANN DOMAINS===\n"
      "com\nuk\nco.uk\n*.ck\n!www.ck\n\n"
      "公司.cn   // trailing words are not part of a rule\n"
      "// ===BEGIN PRIVATE DOMAINS===\n"
      "s3.amazonaws.com\r\n"
      "github.io\n");
  EXPECT_EQ(list.size(), 8u);
  for (const char* suffix :
       {"com", "co.uk", "uk", "anything.ck", "xn--55qx5d.cn", "s3.amazonaws.com", "github.io", "localtld"}) {
    EXPECT_TRUE(list.isPublicSuffix(suffix)) << suffix;
  }
  for (const char* registered : {"example.com", "example.co.uk", "www.ck", "a.anything.ck", "amazonaws.com",
                                 "bucket.s3.amazonaws.com", "user.github.io", "example.localtld"}) {
    EXPECT_FALSE(list.isPublicSuffix(registered)) << registered;
  }
  EXPECT_EQ(list.suffixBelow("amazonaws.com"), "s3.amazonaws.com");
  EXPECT_EQ(list.suffixBelow("uk"), "co.uk");
  EXPECT_EQ(list.suffixBelow("ck"), "*.ck");
  EXPECT_EQ(list.suffixBelow("cn"), "xn--55qx5d.cn");
  EXPECT_EQ(list.suffixBelow("example.com"), "");
  EXPECT_EQ(list.suffixBelow("s3.amazonaws.com"), "");
}

std::string secretHostError(const std::string& host) {
  auto parsed = parseSecrets(json::parse(R"([{"name": "A", "value": "v", "hosts": [")" + host + R"("]}])"));
  return parsed.ok() ? "" : parsed.error().context;
}

// Against the system's list (Debian's publicsuffix package, which
// scripts/install-deps.sh installs).
TEST(PublicSuffix, SecretGlobsStayInsideOneRegisteredDomain) {
  ASSERT_TRUE(systemPublicSuffixes().ok()) << systemPublicSuffixes().error().message();
  EXPECT_GT(systemPublicSuffixes()->size(), 5000u);
  for (const char* open :
       {"*.co.uk", "*.github.io", "?.herokuapp.com", "*.googleapis.com", "api-?.s3.amazonaws.com", "*.xn--55qx5d.cn"}) {
    std::string error = secretHostError(open);
    EXPECT_NE(error.find("is a public suffix"), std::string::npos) << open << ": " << error;
  }
  // Above a public suffix: "*" crosses dots into names that others register.
  std::string above = secretHostError("*.amazonaws.com");
  EXPECT_NE(above.find("holds public suffixes"), std::string::npos) << above;
  for (const char* fine :
       {"*.github.com", "*.example.co.uk", "api-?.example.com", "user.github.io", "co.uk", "s3.amazonaws.com"}) {
    EXPECT_EQ(secretHostError(fine), "") << fine;
  }
}

TEST(PublicSuffix, WithoutTheListGlobsAreRefusedAndNamesStillWork) {
  ::setenv("MOAT_PUBLIC_SUFFIX_LIST", "/nonexistent/public_suffix_list.dat", 1);
  std::string error = secretHostError("*.example.com");
  std::string named = secretHostError("api.example.com");
  ::unsetenv("MOAT_PUBLIC_SUFFIX_LIST");
  EXPECT_NE(error.find("/nonexistent/public_suffix_list.dat"), std::string::npos) << error;
  EXPECT_NE(error.find("name the hosts"), std::string::npos) << error;
  EXPECT_EQ(named, "");
  EXPECT_EQ(secretHostError("*.example.com"), "");  // the system's list again
}

}  // namespace
}  // namespace moat::egress
