#include <gtest/gtest.h>

#include "egress/policy.h"
#include "egress/secrets.h"

namespace moat::egress {
namespace {

using json = nlohmann::json;

Policy parsed(const json& j) {
  auto p = Policy::parse(j);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().context);
  return p.ok() ? p.value() : Policy{};
}

std::string parseError(const json& j) {
  auto p = Policy::parse(j);
  return p.ok() ? "" : p.error().context;
}

Outcome outcome(const Policy& p, const std::string& host, uint16_t port, std::optional<uint32_t> address = {},
                const std::string& method = "", const std::string& path = "") {
  return decide(p, Destination{host, port, address, method, path}).outcome;
}

TEST(EgressPolicy, ModesAndShorthands) {
  EXPECT_EQ(parsed("none").mode, Mode::kNone);
  EXPECT_EQ(parsed("open").mode, Mode::kOpen);
  EXPECT_EQ(parsed(json::object()).mode, Mode::kAllowlist);
  EXPECT_EQ(parsed({{"mode", "none"}}).mode, Mode::kNone);
  EXPECT_EQ(outcome(parsed("none"), "example.com", 443), Outcome::kDeny);
}

TEST(EgressPolicy, ErrorsNameTheField) {
  EXPECT_EQ(parseError({{"mode", "sometimes"}}).rfind("network.mode:", 0), 0u);
  EXPECT_EQ(parseError({{"allow", {"[::1]:80"}}}).rfind("network.allow[0]:", 0), 0u);
  EXPECT_EQ(parseError({{"allow", {"a b"}}}).rfind("network.allow[0]:", 0), 0u);
  EXPECT_EQ(parseError({{"allow", {"10.0.0.0/33"}}}).rfind("network.allow[0]:", 0), 0u);
  EXPECT_EQ(parseError({{"allow", {"host:99999"}}}).rfind("network.allow[0]:", 0), 0u);
  EXPECT_EQ(parseError({{"deny", {{{"host", "x"}, {"verbs", {"GET"}}}}}}).rfind("network.deny[0].verbs:", 0), 0u);
  EXPECT_EQ(parseError({{"allow", {{{"host", "x"}, {"paths", {"relative"}}}}}}).rfind("network.allow[0].paths[0]:", 0),
            0u);
  EXPECT_EQ(parseError({{"allow", {{{"host", "x"}, {"ports", {0}}}}}}).rfind("network.allow[0].ports[0]:", 0), 0u);
  EXPECT_EQ(parseError({{"colour", 1}}).rfind("network.colour:", 0), 0u);
  EXPECT_EQ(parseError({{"max_connections", 0}}).rfind("network.max_connections:", 0), 0u);
  EXPECT_EQ(parseError(42).rfind("network:", 0), 0u);
}

TEST(EgressPolicy, HostGlobsPortsAndDenyFirst) {
  Policy p =
      parsed({{"allow", {"*.pypi.org", "api.github.com:443", "files.example.com"}}, {"deny", {"evil.pypi.org"}}});
  EXPECT_EQ(outcome(p, "files.pypi.org", 443), Outcome::kAllow);
  EXPECT_EQ(outcome(p, "FILES.PyPI.org", 443), Outcome::kAllow);
  EXPECT_EQ(outcome(p, "pypi.org", 443), Outcome::kUnlisted);  // "*." needs a label
  EXPECT_EQ(outcome(p, "evil.pypi.org", 443), Outcome::kDeny);
  EXPECT_EQ(outcome(p, "api.github.com", 443), Outcome::kAllow);
  EXPECT_EQ(outcome(p, "api.github.com", 80), Outcome::kUnlisted);
  EXPECT_EQ(outcome(p, "api.github.com", 0), Outcome::kAllow);  // a DNS question: any port
  EXPECT_EQ(outcome(p, "github.com", 443), Outcome::kUnlisted);
}

TEST(EgressPolicy, SpecialAddressesNeedAnExplicitRange) {
  Policy p = parsed({{"allow", {"internal.example.com", "10.1.0.0/16"}}});
  // A listed name that resolves to loopback, metadata or a private range.
  EXPECT_EQ(outcome(p, "internal.example.com", 443, 0x7F000001), Outcome::kDeny);
  EXPECT_EQ(outcome(p, "internal.example.com", 443, 0xA9FEA9FE), Outcome::kDeny);
  EXPECT_EQ(outcome(p, "internal.example.com", 443, 0x0A020003), Outcome::kDeny);
  // ... unless a range covers that address.
  EXPECT_EQ(outcome(p, "internal.example.com", 443, 0x0A010203), Outcome::kAllow);
  EXPECT_EQ(outcome(p, "10.1.2.3", 5432), Outcome::kAllow);
  EXPECT_EQ(outcome(p, "10.2.2.3", 5432), Outcome::kDeny);
  EXPECT_EQ(outcome(p, "internal.example.com", 443, 0xCB007101), Outcome::kAllow);  // public
  // Open mode refuses special addresses too.
  EXPECT_EQ(outcome(parsed("open"), "anything.example", 80, 0x7F000001), Outcome::kDeny);
  EXPECT_EQ(outcome(parsed("open"), "169.254.169.254", 80), Outcome::kDeny);
  EXPECT_EQ(outcome(parsed("open"), "anything.example", 80, 0xCB007101), Outcome::kAllow);
}

TEST(EgressPolicy, AddressClassification) {
  for (const char* a : {"0.1.2.3", "10.0.0.1", "100.64.0.1", "127.0.0.1", "169.254.169.254", "172.16.0.1",
                        "172.31.255.255", "192.168.1.1", "192.0.0.8", "198.18.0.1", "224.0.0.1", "255.255.255.255"}) {
    ASSERT_TRUE(parseIpv4(a).has_value()) << a;
    EXPECT_TRUE(isSpecialAddress(*parseIpv4(a))) << a;
  }
  for (const char* a : {"1.1.1.1", "8.8.8.8", "172.32.0.1", "203.0.113.10", "198.51.100.30", "100.128.0.1"}) {
    EXPECT_FALSE(isSpecialAddress(*parseIpv4(a))) << a;
  }
  for (const char* bad : {"", "1.2.3", "1.2.3.4.5", "256.1.1.1", "01.2.3.4", "1.2.3.4 ", "a.b.c.d", "1..2.3"}) {
    EXPECT_FALSE(parseIpv4(bad).has_value()) << bad;
  }
  EXPECT_EQ(formatIpv4(0xCB00710A), "203.0.113.10");
}

TEST(EgressPolicy, MethodAndPathRulesNeedTheRequest) {
  Policy p = parsed({{"allow", {{{"host", "api.github.com"}, {"methods", {"get"}}, {"paths", {"/repos/**"}}}}}});
  Verdict tunnel = decide(p, Destination{"api.github.com", 443, std::nullopt, "", ""});
  EXPECT_EQ(tunnel.outcome, Outcome::kAllow);
  EXPECT_TRUE(tunnel.inspect);  // decided per request: TLS is intercepted
  EXPECT_EQ(outcome(p, "api.github.com", 443, {}, "GET", "/repos/moat/issues?page=2"), Outcome::kAllow);
  EXPECT_EQ(outcome(p, "api.github.com", 443, {}, "POST", "/repos/moat/issues"), Outcome::kUnlisted);
  EXPECT_EQ(outcome(p, "api.github.com", 443, {}, "GET", "/user"), Outcome::kUnlisted);
  EXPECT_EQ(outcome(p, "api.github.com", 443, {}, "GET", "/repos/../user"), Outcome::kUnlisted);
  Policy d = parsed({{"mode", "open"}, {"deny", {{{"host", "api.example.com"}, {"methods", {"DELETE"}}}}}});
  EXPECT_TRUE(decide(d, Destination{"api.example.com", 443, std::nullopt, "", ""}).inspect);
  EXPECT_EQ(outcome(d, "api.example.com", 443, {}, "DELETE", "/x"), Outcome::kDeny);
  EXPECT_EQ(outcome(d, "api.example.com", 443, {}, "GET", "/x"), Outcome::kAllow);
}

TEST(EgressPolicy, TrailingDotIsTheSameHost) {
  Policy p = parsed({{"mode", "open"}, {"deny", {"evil.example.com", "blocked.example.org."}}});
  EXPECT_EQ(outcome(p, "evil.example.com.", 443), Outcome::kDeny);
  EXPECT_EQ(outcome(p, "EVIL.example.COM.", 443), Outcome::kDeny);
  EXPECT_EQ(outcome(p, "blocked.example.org", 443), Outcome::kDeny);
  EXPECT_EQ(canonicalHost("Api.Example.COM."), "api.example.com");
  EXPECT_EQ(canonicalHost("."), ".");
  Secret s;
  s.hosts = {"api.example.com"};
  EXPECT_TRUE(s.boundTo("API.example.com."));
}

TEST(EgressPolicy, HostLocalAddressesAreSpecial) {
  Policy open = parsed("open");
  Destination d{"host.example.com", 443, 0xCB007105u, "", ""};  // 203.0.113.5
  EXPECT_EQ(decide(open, d).outcome, Outcome::kAllow);
  d.hostLocal = true;
  EXPECT_EQ(decide(open, d).outcome, Outcome::kDeny);
  EXPECT_EQ(decide(parsed({{"allow", {"203.0.113.0/24"}}}), d).outcome, Outcome::kAllow);  // an explicit range
}

TEST(EgressPolicy, PathRulesSeeWhatServersSee) {
  Policy p = parsed({{"allow", {{{"host", "api.example.com"}, {"paths", {"/repos/**"}}}}},
                     {"deny", {{{"host", "api.example.com"}, {"paths", {"/repos/secret/**"}}}}}});
  for (const char* path : {"/repos/%2e%2e/admin", "/repos/%2E%2E/admin", "/repos/..%2fadmin", "/repos/..;/admin",
                           "/repos/..\\admin", "/repos/x/..%5c..%5cadmin", "/repos/x#/../../admin",
                           "/admin/%2e%2e/repos/x", "/repos/%73ecret/key", "/repos/secret;x/key"}) {
    EXPECT_NE(outcome(p, "api.example.com", 443, {}, "GET", path), Outcome::kAllow) << path;
  }
  for (const char* path : {"/repos/a", "/repos/a%20b", "/repos/a/../b", "/repos/x?q=/../../admin"}) {
    EXPECT_EQ(outcome(p, "api.example.com", 443, {}, "GET", path), Outcome::kAllow) << path;
  }
  EXPECT_EQ(requestPathForms("/a/%2e%2e/b?x"), (std::vector<std::string>{"/a/%2e%2e/b", "/b"}));
  EXPECT_EQ(requestPathForms("/a/b"), (std::vector<std::string>{"/a/b"}));
}

TEST(EgressPolicy, MethodsCompareInUpperCase) {
  Policy p =
      parsed({{"allow", {"api.example.com"}}, {"deny", {{{"host", "api.example.com"}, {"methods", {"DELETE"}}}}}});
  EXPECT_EQ(outcome(p, "api.example.com", 443, {}, "delete", "/x"), Outcome::kDeny);
  EXPECT_EQ(outcome(p, "api.example.com", 443, {}, "Delete", "/x"), Outcome::kDeny);
  EXPECT_EQ(outcome(p, "api.example.com", 443, {}, "GET", "/x"), Outcome::kAllow);
}

TEST(EgressPolicy, RoundTripsAsWritten) {
  json written = {{"mode", "allowlist"},
                  {"allow", {"*.pypi.org", {{"host", "api.github.com"}, {"methods", {"GET"}}}}},
                  {"deny", json::array()},
                  {"max_connections", 8}};
  Policy p = parsed(written);
  Policy again = parsed(p.toJson());
  EXPECT_EQ(again.toJson(), p.toJson());
  EXPECT_EQ(again.maxConnections, 8u);
}

TEST(EgressSecrets, ParseAndSubstitute) {
  auto s = parseSecrets(json::parse(
      R"([{"name": "GH_TOKEN", "value": "ghp_real", "hosts": ["api.github.com", "raw.githubusercontent.com", "*.github.com"],
           "header": "Authorization: Bearer {value}"}])"));
  ASSERT_TRUE(s.ok()) << s.error().context;
  const Secret& secret = s->front();
  EXPECT_EQ(secret.placeholder.rfind("moat-secret-", 0), 0u);
  EXPECT_EQ(secret.header, "Authorization");
  EXPECT_EQ(secret.headerFormat, "Bearer {value}");
  EXPECT_TRUE(secret.boundTo("API.github.com"));
  EXPECT_TRUE(secret.boundTo("raw.githubusercontent.com"));
  EXPECT_TRUE(secret.boundTo("uploads.github.com"));
  EXPECT_FALSE(secret.boundTo("github.com.evil.test"));
  std::string header = "token " + secret.placeholder;
  EXPECT_FALSE(substitute(*s, "api.github.com", header).has_value());
  EXPECT_EQ(header, "token ghp_real");
  std::string leak = "token " + secret.placeholder;
  auto refused = substitute(*s, "evil.test", leak);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(*refused, "GH_TOKEN");
  EXPECT_EQ(leak, "token " + secret.placeholder);  // untouched
  json pub = secretsToPublic(*s);
  EXPECT_EQ(pub.dump().find("ghp_real"), std::string::npos);
  auto back = secretsFromStored(secretsToStored(*s).dump());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->front().placeholder, secret.placeholder);
  EXPECT_EQ(back->front().value, "ghp_real");
}

TEST(EgressSecrets, RefusesWhatCouldLeakOrConfuse) {
  auto err = [](const char* text) {
    auto s = parseSecrets(json::parse(text));
    return s.ok() ? std::string() : s.error().context;
  };
  EXPECT_EQ(err(R"([{"name": "A", "value": "v", "hosts": ["*"]}])").rfind("secrets[0].hosts[0]:", 0), 0u);
  // Globs that match (nearly) any host, any host under a top-level domain,
  // any last label, or IP addresses are refused as "*" is.
  for (const char* broad : {"*.*", "**", "?*", "*?", "*.com", "api.*", "api.example.*", "*.*.com", "10.0.0.*", "*.0.1",
                            "?.1.2.3", "a..b", ".example.com"}) {
    std::string text = std::string(R"([{"name": "A", "value": "v", "hosts": [")") + broad + R"("]}])";
    EXPECT_EQ(err(text.c_str()).rfind("secrets[0].hosts[0]:", 0), 0u) << broad;
  }
  for (const char* named : {"api.github.com", "*.github.com", "api-?.example.com", "*.a.example.co.uk", "localhost",
                            "registry.npmjs.org"}) {
    std::string text = std::string(R"([{"name": "A", "value": "v", "hosts": [")") + named + R"("]}])";
    EXPECT_EQ(err(text.c_str()), "") << named;
  }
  EXPECT_EQ(err(R"([{"name": "1A", "value": "v", "hosts": ["x"]}])").rfind("secrets[0].name:", 0), 0u);
  EXPECT_EQ(err(R"([{"name": "A", "value": "a\r\nX-Evil: 1", "hosts": ["x"]}])").rfind("secrets[0].value:", 0), 0u);
  EXPECT_EQ(
      err(R"([{"name": "A", "value": "v", "hosts": ["x"], "header": "Bad Name"}])").rfind("secrets[0].header:", 0), 0u);
  EXPECT_EQ(err(R"([{"name": "A", "value": "v", "hosts": ["x"]}, {"name": "A", "value": "w", "hosts": ["y"]}])")
                .rfind("secrets[1].name:", 0),
            0u);
  EXPECT_EQ(err(R"([{"name": "A", "value": "v", "hosts": ["x"], "colour": 1}])").rfind("secrets[0].colour:", 0), 0u);
}

}  // namespace
}  // namespace moat::egress
