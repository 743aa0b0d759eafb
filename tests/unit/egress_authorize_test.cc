// What the egress proxy decides for one connection: the policy on the
// name, the gate, then the policy on the address the name resolves to.
// No namespace and no network: the gate, the resolver and the host's own
// addresses are the test's.
#include <gtest/gtest.h>

#include "egress/authorize.h"

namespace moat::egress {
namespace {

using json = nlohmann::json;

struct World {
  std::vector<std::string> asked;  // "host:port listed" per gate question
  std::vector<std::string> resolved;
  GateAnswer answer{true, ""};
  std::map<std::string, uint32_t> addresses;
  std::set<uint32_t> hostOwn;

  Lookups lookups(bool withGate = true) {
    Lookups l;
    if (withGate) {
      l.gate = [this](const std::string&, const std::string& host, uint16_t port, bool listed) {
        asked.push_back(host + ":" + std::to_string(port) + (listed ? " listed" : " unlisted"));
        return answer;
      };
    }
    l.resolve = [this](const std::string& host) -> Result<std::vector<uint32_t>> {
      resolved.push_back(host);
      auto it = addresses.find(host);
      if (it == addresses.end()) return Error::make(Code::kNotFound, host + ": no such name");
      return std::vector<uint32_t>{it->second};
    };
    l.hostLocal = [this](uint32_t a) { return hostOwn.count(a) > 0; };
    return l;
  }
};

Policy policy(const json& j) {
  auto p = Policy::parse(j);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().context);
  return p.ok() ? p.value() : Policy{};
}

constexpr uint32_t kPublic = 0x5DB8D822;  // 93.184.216.34

TEST(EgressAuthorize, AListedNameIsCheckedAgainstTheCeilingThenResolvedAndConnected) {
  World w;
  w.addresses["pypi.org"] = kPublic;
  auto d = authorize(policy({{"allow", {"pypi.org:443"}}}), {"env", "pypi.org", 443, "", ""}, w.lookups());
  EXPECT_TRUE(d.allowed) << d.why;
  EXPECT_FALSE(d.byGate);
  EXPECT_EQ(d.rule, "allow[0]");
  EXPECT_EQ(d.address, kPublic);
  EXPECT_EQ(w.asked, (std::vector<std::string>{"pypi.org:443 listed"}));
}

TEST(EgressAuthorize, ADeniedNameNeverReachesTheGateOrTheResolver) {
  World w;
  w.addresses["evil.example"] = kPublic;
  auto d = authorize(policy({{"mode", "open"}, {"deny", {"evil.example"}}}), {"env", "evil.example", 443, "", ""},
                     w.lookups());
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "deny[0]");
  EXPECT_EQ(d.why, "evil.example:443 is denied by the network policy (deny[0])");
  EXPECT_TRUE(w.asked.empty());
  EXPECT_TRUE(w.resolved.empty());
}

TEST(EgressAuthorize, AnUnlistedNameIsTheGatesToDecideAndWithoutAGateIsRefused) {
  World w;
  w.addresses["example.com"] = kPublic;
  const Policy allowlist = policy({{"allow", {"pypi.org"}}});
  w.answer = {false, "network: deny"};
  auto refused = authorize(allowlist, {"env", "example.com", 443, "", ""}, w.lookups());
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(refused.rule, "gate");
  EXPECT_EQ(refused.why, "example.com:443 is not on the allowlist (network: deny)");
  EXPECT_TRUE(w.resolved.empty()) << "nothing is looked up before the gate says yes";
  w.answer = {true, ""};
  auto allowed = authorize(allowlist, {"env", "example.com", 443, "", ""}, w.lookups());
  EXPECT_TRUE(allowed.allowed);
  EXPECT_TRUE(allowed.byGate);
  EXPECT_EQ(w.asked, (std::vector<std::string>{"example.com:443 unlisted", "example.com:443 unlisted"}));
  auto noGate = authorize(allowlist, {"env", "example.com", 443, "", ""}, w.lookups(false));
  EXPECT_FALSE(noGate.allowed);
  EXPECT_EQ(noGate.why, "example.com:443 is not on the allowlist (not on the allowlist)");
}

TEST(EgressAuthorize, AListedNameTheCeilingRefusesIsRefused) {
  World w;
  w.addresses["pypi.org"] = kPublic;
  w.answer = {false, "the key's ceiling: network deny"};
  auto d = authorize(policy({{"allow", {"pypi.org"}}}), {"env", "pypi.org", 443, "", ""}, w.lookups());
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "ceiling");
  EXPECT_EQ(d.why, "pypi.org:443 is refused (the key's ceiling: network deny)");
  EXPECT_TRUE(w.resolved.empty());
}

// DNS rebinding: an allowed name whose address is private, or one of
// moatd's host's own, is refused once resolved.
TEST(EgressAuthorize, AnAllowedNameThatResolvesToAPrivateOrHostAddressIsRefused) {
  World w;
  w.addresses["rebind.example"] = 0xA9FEA9FE;  // 169.254.169.254: cloud metadata
  w.addresses["mine.example"] = 0xC0000221;    // 192.0.2.33, one of the host's
  w.hostOwn.insert(0xC0000221);
  const Policy open = policy("open");
  auto metadata = authorize(open, {"env", "rebind.example", 80, "GET", "/"}, w.lookups());
  EXPECT_FALSE(metadata.allowed);
  EXPECT_EQ(metadata.why.rfind("rebind.example resolves to 169.254.169.254, which the policy refuses", 0), 0u)
      << metadata.why;
  auto host = authorize(open, {"env", "mine.example", 22, "", ""}, w.lookups());
  EXPECT_FALSE(host.allowed);
  EXPECT_EQ(host.why.rfind("mine.example resolves to 192.0.2.33, which the policy refuses", 0), 0u) << host.why;
  // Without a way to tell the host's addresses, every one counts as the host's.
  Lookups blind = w.lookups();
  blind.hostLocal = nullptr;
  w.addresses["pypi.org"] = kPublic;
  EXPECT_FALSE(authorize(open, {"env", "pypi.org", 443, "", ""}, blind).allowed);
  // Unless an allow entry names that network.
  auto named = authorize(policy({{"allow", {"169.254.169.254/32"}}, {"mode", "open"}}),
                         {"env", "rebind.example", 80, "GET", "/"}, w.lookups());
  EXPECT_TRUE(named.allowed) << named.why;
}

TEST(EgressAuthorize, ANameThatDoesNotResolveIsRefusedWithTheResolversWords) {
  World w;
  auto d = authorize(policy("open"), {"env", "nowhere.example", 443, "", ""}, w.lookups());
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.why, "nowhere.example: no such name");
}

}  // namespace
}  // namespace moat::egress
