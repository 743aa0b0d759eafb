#include "egress/policy.h"

#include <algorithm>
#include <cctype>

#include "common/glob.h"
#include "common/hex.h"
#include "common/path.h"
#include "common/text.h"

namespace moat::egress {
namespace {

using json = nlohmann::json;

bool validHostGlob(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '*' || c == '?';
  });
}

Result<uint16_t> parsePort(const json& j, const std::string& field) {
  if (!j.is_number_integer() || j.get<int64_t>() < 1 || j.get<int64_t>() > 65535) {
    return Error::invalidField(field, "must be a port number (1 to 65535)");
  }
  return static_cast<uint16_t>(j.get<int64_t>());
}

// "name", "name:port", "1.2.3.4", "10.0.0.0/8", "10.0.0.0/8:5432".
Status parseTarget(const std::string& text, const std::string& field, Entry& e, bool portAllowed) {
  if (text.find('[') != std::string::npos || std::count(text.begin(), text.end(), ':') > 1) {
    return Error::invalidField(field, "IPv6 destinations are not supported (environments have no IPv6)");
  }
  std::string target = text;
  auto colon = target.find(':');
  if (colon != std::string::npos) {
    if (!portAllowed) return Error::invalidField(field, "put the port in \"ports\"");
    std::string port = target.substr(colon + 1);
    target.resize(colon);
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) || std::stoi(port) < 1 ||
        std::stoi(port) > 65535) {
      return Error::invalidField(field, "bad port in '" + text + "'");
    }
    e.ports.push_back(static_cast<uint16_t>(std::stoi(port)));
  }
  auto slash = target.find('/');
  std::string addressPart = slash == std::string::npos ? target : target.substr(0, slash);
  if (auto a = parseIpv4(addressPart)) {
    Cidr c{*a, 32};
    if (slash != std::string::npos) {
      std::string bits = target.substr(slash + 1);
      if (bits.empty() || bits.size() > 2 || !std::all_of(bits.begin(), bits.end(), ::isdigit) ||
          std::stoi(bits) > 32) {
        return Error::invalidField(field, "bad prefix length in '" + text + "'");
      }
      c.prefix = std::stoi(bits);
    }
    uint32_t mask = c.prefix == 0 ? 0 : ~uint32_t{0} << (32 - c.prefix);
    c.address &= mask;
    e.network = c;
    return {};
  }
  if (slash != std::string::npos)
    return Error::invalidField(field, "'" + text + "' is neither a host name nor an address range");
  std::string host = canonicalHost(target);
  if (!validHostGlob(host)) {
    return Error::invalidField(field,
                               "'" + text + "' is not a host name (letters, digits, '.', '-', '_', '*' and '?')");
  }
  e.host = host;
  return {};
}

Result<std::vector<std::string>> stringList(const json& j, const std::string& field, size_t max) {
  if (!j.is_array() || j.empty() || j.size() > max) {
    return Error::invalidField(field, "must be a non-empty array of at most " + std::to_string(max) + " strings");
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string() || j[i].get<std::string>().empty() || j[i].get<std::string>().size() > 1024) {
      return Error::invalidField(field + "[" + std::to_string(i) + "]", "must be a non-empty string");
    }
    out.push_back(j[i]);
  }
  return out;
}

Result<Entry> parseEntry(const json& j, const std::string& field) {
  Entry e;
  e.written = j;
  if (j.is_string()) {
    MOAT_TRY(parseTarget(j.get<std::string>(), field, e, true));
    return e;
  }
  if (!j.is_object()) return Error::invalidField(field, "must be a host, an address range or an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k != "host" && k != "ports" && k != "methods" && k != "paths") {
      return Error::invalidField(field + "." + k, "unknown field (host, ports, methods, paths)");
    }
  }
  if (!j.contains("host") || !j["host"].is_string())
    return Error::invalidField(field + ".host", "required: a host or address range");
  MOAT_TRY(parseTarget(j["host"].get<std::string>(), field + ".host", e, false));
  if (j.contains("ports")) {
    if (!j["ports"].is_array() || j["ports"].empty() || j["ports"].size() > 64) {
      return Error::invalidField(field + ".ports", "must be a non-empty array of port numbers");
    }
    for (size_t i = 0; i < j["ports"].size(); ++i) {
      MOAT_ASSIGN(uint16_t p, parsePort(j["ports"][i], field + ".ports[" + std::to_string(i) + "]"));
      e.ports.push_back(p);
    }
  }
  if (j.contains("methods")) {
    MOAT_ASSIGN(e.methods, stringList(j["methods"], field + ".methods", 16));
    for (size_t i = 0; i < e.methods.size(); ++i) {
      auto& m = e.methods[i];
      std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::toupper(c); });
      if (!std::all_of(m.begin(), m.end(), [](unsigned char c) { return std::isupper(c); })) {
        return Error::invalidField(field + ".methods[" + std::to_string(i) + "]", "not an HTTP method");
      }
    }
  }
  if (j.contains("paths")) {
    MOAT_ASSIGN(e.paths, stringList(j["paths"], field + ".paths", 64));
    for (size_t i = 0; i < e.paths.size(); ++i) {
      if (e.paths[i][0] != '/')
        return Error::invalidField(field + ".paths[" + std::to_string(i) + "]", "must start with '/'");
    }
  }
  return e;
}

Result<std::vector<Entry>> parseEntries(const json& j, const std::string& field) {
  if (!j.is_array() || j.size() > 1024) return Error::invalidField(field, "must be an array of at most 1024 entries");
  std::vector<Entry> out;
  for (size_t i = 0; i < j.size(); ++i) {
    MOAT_ASSIGN(Entry e, parseEntry(j[i], field + "[" + std::to_string(i) + "]"));
    out.push_back(std::move(e));
  }
  return out;
}

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool hostMatches(const Entry& e, const Destination& d) {
  if (e.host) return globMatch(*e.host, d.host, false);
  if (!e.network) return false;
  if (auto literal = parseIpv4(d.host)) return e.network->contains(*literal);
  return d.address && e.network->contains(*d.address);
}

// Port 0: any (a DNS question names no port).
bool portMatches(const Entry& e, uint16_t port) {
  return e.ports.empty() || port == 0 || std::find(e.ports.begin(), e.ports.end(), port) != e.ports.end();
}

// Methods compare in upper case: a server that takes "delete" for DELETE
// must not get it past a rule about DELETE. Paths: an allow entry must match
// every form of the path (`all`), a deny entry any form.
bool requestMatches(const Entry& e, const Destination& d, bool all) {
  if (!e.methods.empty() && std::find(e.methods.begin(), e.methods.end(), upper(d.method)) == e.methods.end()) {
    return false;
  }
  if (e.paths.empty()) return true;
  auto matches = [&](const std::string& path) {
    return std::any_of(e.paths.begin(), e.paths.end(), [&](const std::string& p) { return globMatch(p, path, true); });
  };
  auto forms = requestPathForms(d.path);
  return all ? std::all_of(forms.begin(), forms.end(), matches) : std::any_of(forms.begin(), forms.end(), matches);
}

}  // namespace

std::string canonicalHost(std::string host) {
  host = asciiLower(std::move(host));
  if (host.size() > 1 && host.back() == '.') host.pop_back();
  return host;
}

std::vector<std::string> requestPathForms(const std::string& target) {
  // Only the query goes: a server that keeps '#' would resolve
  // "/a#/../../b" to "/b", so the fragment stays part of the path here.
  std::string path = target.substr(0, target.find('?'));
  if (path.empty()) path = "/";
  std::string decoded;
  for (size_t i = 0; i < path.size(); ++i) {
    int hi = 0, lo = 0;
    if (path[i] == '%' && i + 2 < path.size() && (hi = hexValue(path[i + 1])) >= 0 &&
        (lo = hexValue(path[i + 2])) >= 0) {
      decoded.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      decoded.push_back(path[i]);
    }
  }
  std::replace(decoded.begin(), decoded.end(), '\\', '/');
  std::string plain;  // without ";parameters" in any segment
  for (size_t i = 0; i < decoded.size(); ++i) {
    if (decoded[i] == ';') {
      while (i + 1 < decoded.size() && decoded[i + 1] != '/') ++i;
      continue;
    }
    plain.push_back(decoded[i]);
  }
  std::vector<std::string> forms{normalizePath(path)};
  std::string other = normalizePath(plain.empty() ? "/" : plain);
  if (other != forms[0]) forms.push_back(other);
  return forms;
}

const char* modeName(Mode m) {
  switch (m) {
    case Mode::kNone:
      return "none";
    case Mode::kAllowlist:
      return "allowlist";
    case Mode::kOpen:
      return "open";
  }
  return "none";
}

bool Cidr::contains(uint32_t a) const {
  uint32_t mask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
  return (a & mask) == (address & mask);
}

std::optional<uint32_t> parseIpv4(const std::string& text) {
  uint32_t out = 0;
  int parts = 0;
  size_t i = 0;
  while (parts < 4) {
    size_t start = i;
    uint32_t v = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && i - start < 3) {
      v = v * 10 + static_cast<uint32_t>(text[i] - '0');
      ++i;
    }
    if (i == start || v > 255 || (i - start > 1 && text[start] == '0')) return std::nullopt;
    out = (out << 8) | v;
    ++parts;
    if (parts < 4) {
      if (i >= text.size() || text[i] != '.') return std::nullopt;
      ++i;
    }
  }
  if (i != text.size()) return std::nullopt;
  return out;
}

std::string formatIpv4(uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 255) + "." + std::to_string((a >> 8) & 255) + "." +
         std::to_string(a & 255);
}

bool isSpecialAddress(uint32_t a) {
  static const Cidr kSpecial[] = {
      {0x00000000, 8},   // "this network"
      {0x0A000000, 8},   // private
      {0x64400000, 10},  // carrier-grade NAT (and moat's own links)
      {0x7F000000, 8},   // loopback
      {0xA9FE0000, 16},  // link-local: cloud metadata lives here
      {0xAC100000, 12},  // private
      {0xC0000000, 24},  // IETF protocol assignments
      {0xC0A80000, 16},  // private
      {0xC6120000, 15},  // benchmarking
      {0xE0000000, 4},   // multicast
      {0xF0000000, 4},   // reserved, broadcast
  };
  return std::any_of(std::begin(kSpecial), std::end(kSpecial), [a](const Cidr& c) { return c.contains(a); });
}

Result<Policy> Policy::parse(const json& j, const std::string& prefix) {
  Policy p;
  if (j.is_string()) {
    std::string m = j;
    if (m == "none") return p;
    if (m == "open") {
      p.mode = Mode::kOpen;
      return p;
    }
    return Error::invalidField(prefix, "must be \"none\", \"open\" or an object {mode, allow, deny}");
  }
  if (!j.is_object()) return Error::invalidField(prefix, "must be \"none\", \"open\" or an object {mode, allow, deny}");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k != "mode" && k != "allow" && k != "deny" && k != "max_connections" && k != "bandwidth_mbps") {
      return Error::invalidField(prefix + "." + k,
                                 "unknown field (mode, allow, deny, max_connections, bandwidth_mbps)");
    }
  }
  p.mode = Mode::kAllowlist;
  if (j.contains("mode")) {
    const json& m = j["mode"];
    if (m == "none")
      p.mode = Mode::kNone;
    else if (m == "allowlist")
      p.mode = Mode::kAllowlist;
    else if (m == "open")
      p.mode = Mode::kOpen;
    else
      return Error::invalidField(prefix + ".mode", "must be \"none\", \"allowlist\" or \"open\"");
  }
  if (j.contains("allow")) {
    MOAT_ASSIGN(p.allow, parseEntries(j["allow"], prefix + ".allow"));
  }
  if (j.contains("deny")) {
    MOAT_ASSIGN(p.deny, parseEntries(j["deny"], prefix + ".deny"));
  }
  if (j.contains("max_connections")) {
    const json& m = j["max_connections"];
    if (!m.is_number_integer() || m.get<int64_t>() < 1 || m.get<int64_t>() > 4096) {
      return Error::invalidField(prefix + ".max_connections", "must be a whole number from 1 to 4096");
    }
    p.maxConnections = m.get<uint32_t>();
  }
  if (j.contains("bandwidth_mbps")) {
    const json& b = j["bandwidth_mbps"];
    if (!b.is_number() || b.get<double>() < 0.01 || b.get<double>() > 100000) {
      return Error::invalidField(prefix + ".bandwidth_mbps",
                                 "must be a number from 0.01 to 100000 (megabits per second)");
    }
    p.bandwidthBytesPerS = static_cast<uint64_t>(b.get<double>() * 1e6 / 8);
  }
  return p;
}

json Policy::toJson() const {
  json allowJ = json::array(), denyJ = json::array();
  for (const auto& e : allow) allowJ.push_back(e.written);
  for (const auto& e : deny) denyJ.push_back(e.written);
  json j = {{"mode", modeName(mode)}, {"allow", allowJ}, {"deny", denyJ}, {"max_connections", maxConnections}};
  if (bandwidthBytesPerS) j["bandwidth_mbps"] = static_cast<double>(bandwidthBytesPerS) * 8 / 1e6;
  return j;
}

Verdict decide(const Policy& policy, const Destination& dIn) {
  Destination d = dIn;
  d.host = canonicalHost(d.host);
  if (!d.address) d.address = parseIpv4(d.host);
  bool requestVisible = !d.method.empty();
  bool inspect = false;
  if (policy.mode == Mode::kNone) return {Outcome::kDeny, "mode none", nullptr, false};
  for (size_t i = 0; i < policy.deny.size(); ++i) {
    const Entry& e = policy.deny[i];
    if (!hostMatches(e, d) || !portMatches(e, d.port)) continue;
    if (e.inspectsRequests()) {
      if (!requestVisible) {
        inspect = true;  // decided per request once visible
        continue;
      }
      if (!requestMatches(e, d, false)) continue;
    }
    return {Outcome::kDeny, "deny[" + std::to_string(i) + "]", e.written, false};
  }
  if (d.address && (isSpecialAddress(*d.address) || d.hostLocal)) {
    for (size_t i = 0; i < policy.allow.size(); ++i) {
      const Entry& e = policy.allow[i];
      if (e.network && e.network->contains(*d.address) && portMatches(e, d.port) &&
          (!requestVisible || requestMatches(e, d, true))) {
        return {Outcome::kAllow, "allow[" + std::to_string(i) + "]", e.written,
                inspect || (!requestVisible && e.inspectsRequests())};
      }
    }
    return {Outcome::kDeny, (d.hostLocal ? "address of moatd's host " : "special address ") + formatIpv4(*d.address),
            nullptr, false};
  }
  if (policy.mode == Mode::kOpen) return {Outcome::kAllow, "open", "open", inspect};
  for (size_t i = 0; i < policy.allow.size(); ++i) {
    const Entry& e = policy.allow[i];
    if (!hostMatches(e, d) || !portMatches(e, d.port)) continue;
    if (e.inspectsRequests()) {
      if (!requestVisible) return {Outcome::kAllow, "allow[" + std::to_string(i) + "]", e.written, true};
      if (!requestMatches(e, d, true)) continue;
    }
    return {Outcome::kAllow, "allow[" + std::to_string(i) + "]", e.written, inspect};
  }
  return {Outcome::kUnlisted, "not on the allowlist", nullptr, inspect};
}

}  // namespace moat::egress
