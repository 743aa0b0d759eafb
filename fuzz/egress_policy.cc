// An environment's network policy and secrets (src/egress/policy.h,
// secrets.h): parsed from API callers, asked by the proxy and the resolver
// about every destination an environment tries.
//
// Input lines: a network policy (JSON), secrets (JSON), then requests:
// "d <host> <port> <address|-> <method|-> <path>" (decide) or
// "s <host> <text>" (substitute; "$0".."$9" in the text stand for the
// placeholders of the secrets). Checked, besides not crashing:
// - the policy as stored (toJson -> parse) decides every request as before;
// - an allowed special address (private, loopback, metadata) or one of
//   moatd's own is always covered by an allow entry's address range;
// - secrets read back from the store are the same secrets;
// - substitute never lets a placeholder through to a host it is not bound
//   to, and leaves no placeholder of a bound secret behind.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "egress/policy.h"
#include "egress/secrets.h"

using namespace moat::egress;
using json = nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& what) {
  __builtin_printf("egress_policy: %s\n", what.c_str());
  std::abort();
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool sameVerdict(const Verdict& a, const Verdict& b) {
  return a.outcome == b.outcome && a.rule == b.rule && a.inspect == b.inspect;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto in = lines(std::string(reinterpret_cast<const char*>(data), size));
  if (in.empty()) return 0;
  Policy policy;
  std::optional<Policy> stored;
  json pj = json::parse(in[0], nullptr, false);
  if (!pj.is_discarded()) {
    auto parsed = Policy::parse(pj);
    if (parsed.ok()) {
      policy = parsed.value();
      auto again = Policy::parse(policy.toJson());
      if (!again.ok()) fail("a policy does not parse back from toJson: " + again.error().message());
      stored = again.value();
      if (stored->mode != policy.mode || stored->maxConnections != policy.maxConnections ||
          stored->allow.size() != policy.allow.size() || stored->deny.size() != policy.deny.size() ||
          stored->bandwidthBytesPerS + 1 < policy.bandwidthBytesPerS ||
          stored->bandwidthBytesPerS > policy.bandwidthBytesPerS + 1) {
        fail("toJson -> parse changed the policy");
      }
    }
  }
  std::vector<Secret> secrets;
  if (in.size() > 1) {
    json sj = json::parse(in[1], nullptr, false);
    if (!sj.is_discarded()) {
      auto parsed = parseSecrets(sj);
      if (parsed.ok()) {
        secrets = parsed.value();
        auto back = secretsFromStored(secretsToStored(secrets).dump());
        if (!back.ok() || back->size() != secrets.size()) fail("secrets do not read back from the store");
        for (size_t i = 0; i < secrets.size(); ++i) {
          const Secret &a = secrets[i], &b = back.value()[i];
          if (a.name != b.name || a.value != b.value || a.hosts != b.hosts || a.header != b.header ||
              a.headerFormat != b.headerFormat || a.placeholder != b.placeholder) {
            fail("a secret changed in the store");
          }
        }
        (void)secretsToPublic(secrets).dump();
      }
    }
  }

  for (size_t i = 2; i < in.size() && i < 40; ++i) {
    const std::string& line = in[i];
    if (line.size() < 2 || line[1] != ' ') continue;
    std::istringstream words(line.substr(2));
    if (line[0] == 'd') {
      Destination d;
      std::string port, address, method;
      words >> d.host >> port >> address >> method;
      std::getline(words >> std::ws, d.path);
      d.port = static_cast<uint16_t>(std::atoi(port.c_str()));
      if (address != "-") d.address = parseIpv4(address);
      if (method != "-") d.method = method;
      d.hostLocal = !d.host.empty() && (d.host[0] & 1);
      Verdict v = decide(policy, d);
      if (stored && !sameVerdict(v, decide(*stored, d))) fail("the stored policy decides otherwise");
      std::optional<uint32_t> addr = d.address ? d.address : parseIpv4(canonicalHost(d.host));
      if (v.outcome == Outcome::kAllow && addr && (isSpecialAddress(*addr) || d.hostLocal)) {
        bool covered = false;
        for (const auto& e : policy.allow) covered |= e.network && e.network->contains(*addr);
        if (!covered) fail("a special address was allowed without an allow entry for it: " + formatIpv4(*addr));
      }
      for (const auto& form : requestPathForms(d.path)) {
        if (form.empty() || form[0] != '/') fail("a request path form is not absolute");
      }
    } else if (line[0] == 's') {
      std::string host;
      words >> host;
      std::string text;
      std::getline(words >> std::ws, text);
      for (size_t at = text.find('$'); at != std::string::npos && at + 1 < text.size(); at = text.find('$', at + 1)) {
        size_t k = static_cast<size_t>(text[at + 1] - '0');
        if (k < secrets.size()) text.replace(at, 2, secrets[k].placeholder);
      }
      std::string out = text;
      auto leaked = substitute(secrets, host, out);
      for (const auto& s : secrets) {
        bool present = text.find(s.placeholder) != std::string::npos;
        if (present && !s.boundTo(host) && !leaked) fail("a placeholder went to a host it is not bound to");
        if (!leaked && out.find(s.placeholder) != std::string::npos && s.boundTo(host)) {
          fail("a bound placeholder was left in place");
        }
      }
      if (leaked && out != text) fail("a refused request was rewritten");
    }
  }
  return 0;
}
