#include "egress/secrets.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "common/glob.h"
#include "common/hex.h"
#include "egress/policy.h"
#include "egress/public_suffix.h"

namespace moat::egress {
namespace {

using json = nlohmann::json;

bool envName(const std::string& s) {
  if (s.empty() || s.size() > 128 || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

bool headerName(const std::string& s) {
  return !s.empty() && s.size() <= 128 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

bool headerSafe(const std::string& s) {
  return std::none_of(s.begin(), s.end(), [](char c) { return c == '\r' || c == '\n' || c == '\0'; });
}

void replaceAll(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

// Why `host` (canonical) cannot receive a secret, or "" when it can: a name
// (letters, digits, "-", "_", dots between non-empty labels) or a glob whose
// wildcards ("*", "?") all lie left of at least two literal labels, so that
// it stays inside one named domain ("*.example.com", "api-?.example.com";
// not "*", "*.*", "*.com", "api.*", nor "*.0.1", which matches addresses).
// Nor may what follows the last wildcard be a public suffix ("*.co.uk",
// "*.github.io") or hold one ("*.amazonaws.com" reaches into
// "s3.amazonaws.com"): "*" crosses dots, so the glob would match hosts that
// anyone can register.
std::string secretHostProblem(const std::string& host) {
  if (host.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-_*?") != std::string::npos) {
    return "must be a host name or glob";
  }
  size_t labels = 0, literalAfterWildcard = 0;
  bool wildcard = false;
  size_t start = 0, literalStart = 0;
  while (start <= host.size()) {
    size_t end = host.find('.', start);
    if (end == std::string::npos) end = host.size();
    if (end == start) return "must be a host name or glob (an empty label)";
    ++labels;
    if (host.find_first_of("*?", start) < end) {
      wildcard = true;
      literalAfterWildcard = 0;
      literalStart = end + 1;
    } else {
      ++literalAfterWildcard;
    }
    start = end + 1;
  }
  std::string last = host.substr(host.rfind('.') + 1);
  if (wildcard && last.find_first_not_of("0123456789") == std::string::npos) {
    return "a glob cannot stand for addresses (\"" + host + "\" matches IP literals): a secret belongs to named hosts";
  }
  if (wildcard && literalAfterWildcard < 2) {
    return "a glob must keep its wildcards left of two named labels (\"*.example.com\", not \"" + host +
           "\"): a secret belongs to named hosts";
  }
  if (!wildcard) return "";
  const auto& suffixes = systemPublicSuffixes();
  if (!suffixes.ok()) {
    return "a glob cannot be checked against the public suffix list: " + suffixes.error().message() +
           "; name the hosts instead";
  }
  const std::string domain = host.substr(literalStart);
  if (suffixes->isPublicSuffix(domain)) {
    return "\"" + domain + "\" is a public suffix (publicsuffix.org): \"" + host +
           "\" would match hosts that anyone can register; name the hosts, or glob inside one registered domain";
  }
  if (std::string below = suffixes->suffixBelow(domain); !below.empty()) {
    return "\"" + domain + "\" holds public suffixes (\"" + below + "\"), and \"*\" crosses dots: \"" + host +
           "\" would match hosts that anyone can register there; name the hosts";
  }
  return "";
}

}  // namespace

bool Secret::boundTo(const std::string& host) const {
  std::string h = canonicalHost(host);
  return std::any_of(hosts.begin(), hosts.end(), [&](const std::string& g) { return globMatch(g, h, false); });
}

Result<std::vector<Secret>> parseSecrets(const json& j) {
  if (!j.is_array() || j.size() > 64) return Error::invalidField("secrets", "must be an array of at most 64 secrets");
  std::vector<Secret> out;
  std::set<std::string> names;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string f = "secrets[" + std::to_string(i) + "]";
    const json& s = j[i];
    if (!s.is_object()) return Error::invalidField(f, "must be an object {name, value, hosts, header?}");
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() != "name" && it.key() != "value" && it.key() != "hosts" && it.key() != "header") {
        return Error::invalidField(f + "." + it.key(), "unknown field (name, value, hosts, header)");
      }
    }
    Secret secret;
    if (!s.contains("name") || !s["name"].is_string() || !envName(s["name"])) {
      return Error::invalidField(f + ".name", "required: an environment variable name (letters, digits, '_')");
    }
    secret.name = s["name"];
    if (!names.insert(secret.name).second) return Error::invalidField(f + ".name", "duplicate secret " + secret.name);
    if (!s.contains("value") || !s["value"].is_string() || s["value"].get<std::string>().empty() ||
        s["value"].get<std::string>().size() > 16384 || !headerSafe(s["value"])) {
      return Error::invalidField(f + ".value", "required: a non-empty string (at most 16 KiB, no line breaks)");
    }
    secret.value = s["value"];
    if (!s.contains("hosts") || !s["hosts"].is_array() || s["hosts"].empty() || s["hosts"].size() > 64) {
      return Error::invalidField(f + ".hosts", "required: the hosts (globs) that may receive it");
    }
    for (size_t k = 0; k < s["hosts"].size(); ++k) {
      const json& h = s["hosts"][k];
      std::string hf = f + ".hosts[" + std::to_string(k) + "]";
      if (!h.is_string() || h.get<std::string>().empty() || h.get<std::string>().size() > 253) {
        return Error::invalidField(hf, "must be a host name or glob");
      }
      std::string host = canonicalHost(h);
      if (std::string problem = secretHostProblem(host); !problem.empty()) return Error::invalidField(hf, problem);
      secret.hosts.push_back(host);
    }
    if (s.contains("header")) {
      if (!s["header"].is_string() || !headerSafe(s["header"]))
        return Error::invalidField(f + ".header", "must be a header");
      std::string h = s["header"];
      auto colon = h.find(':');
      secret.header = h.substr(0, colon);
      secret.headerFormat = colon == std::string::npos ? "{value}" : h.substr(colon + 1);
      while (!secret.headerFormat.empty() && secret.headerFormat[0] == ' ') secret.headerFormat.erase(0, 1);
      if (!headerName(secret.header) || secret.headerFormat.find("{value}") == std::string::npos) {
        return Error::invalidField(f + ".header", "must be \"Name\" or \"Name: text with {value}\"");
      }
    }
    MOAT_ASSIGN(std::string random, randomHex(16));
    secret.placeholder = "moat-secret-" + random;
    out.push_back(std::move(secret));
  }
  return out;
}

json secretsToStored(const std::vector<Secret>& secrets) {
  json out = json::array();
  for (const auto& s : secrets) {
    out.push_back({{"name", s.name},
                   {"value", s.value},
                   {"hosts", s.hosts},
                   {"header", s.header},
                   {"header_format", s.headerFormat},
                   {"placeholder", s.placeholder}});
  }
  return out;
}

Result<std::vector<Secret>> secretsFromStored(const std::string& text) {
  std::vector<Secret> out;
  if (text.empty()) return out;
  json j = json::parse(text, nullptr, false);
  if (!j.is_array()) return Error::make(Code::kCorrupt, "stored secrets are not a JSON array");
  for (const auto& s : j) {
    Secret secret;
    try {
      secret.name = s.at("name");
      secret.value = s.at("value");
      secret.hosts = s.at("hosts").get<std::vector<std::string>>();
      secret.header = s.at("header");
      secret.headerFormat = s.at("header_format");
      secret.placeholder = s.at("placeholder");
    } catch (const json::exception& e) {
      return Error::make(Code::kCorrupt, std::string("stored secret: ") + e.what());
    }
    out.push_back(std::move(secret));
  }
  return out;
}

json secretsToPublic(const std::vector<Secret>& secrets) {
  json out = json::array();
  for (const auto& s : secrets) {
    json one = {{"name", s.name}, {"hosts", s.hosts}};
    if (!s.header.empty()) one["header"] = s.header;
    out.push_back(one);
  }
  return out;
}

std::optional<std::string> substitute(const std::vector<Secret>& secrets, const std::string& host, std::string& text) {
  for (const auto& s : secrets) {
    if (text.find(s.placeholder) == std::string::npos) continue;
    if (!s.boundTo(host)) return s.name;
  }
  for (const auto& s : secrets) replaceAll(text, s.placeholder, s.value);
  return std::nullopt;
}

}  // namespace moat::egress
