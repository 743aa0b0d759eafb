#include "agent/redact.h"

#include <cctype>
#include <cstring>

namespace moat::agent {
namespace {

constexpr const char* kSecret = "[redacted: a secret of this run]";
constexpr const char* kCredential = "[redacted: a credential]";

size_t replaceAll(std::string& text, const std::string& what, const std::string& with) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + with.size())) {
    text.replace(at, what.size(), with);
    ++n;
  }
  return n;
}

bool tokenChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

// A word (a run of letters, digits, '_' and '-') shaped like a token of a
// known kind: OpenAI and Anthropic keys, GitHub, Slack, AWS access key ids,
// Google API keys. Scanned by hand: std::regex recurses per character.
bool credentialShaped(const char* w, size_t n) {
  auto starts = [&](const char* prefix) {
    return n >= std::strlen(prefix) && std::strncmp(w, prefix, std::strlen(prefix)) == 0;
  };
  if (starts("sk-") && n >= 23) return true;
  if ((starts("ghp_") || starts("gho_") || starts("ghu_") || starts("ghs_") || starts("ghr_")) && n >= 40) return true;
  if (starts("github_pat_") && n >= 33) return true;
  if ((starts("xoxa-") || starts("xoxb-") || starts("xoxp-") || starts("xoxr-") || starts("xoxs-")) && n >= 15) {
    return true;
  }
  if (starts("AIza") && n >= 39) return true;
  if (starts("AKIA") && n == 20) {
    for (size_t i = 4; i < n; ++i) {
      if (!std::isupper(static_cast<unsigned char>(w[i])) && !std::isdigit(static_cast<unsigned char>(w[i]))) {
        return false;
      }
    }
    return true;
  }
  return false;
}

// PEM private keys, from BEGIN to END (to the end of the text when no END
// follows: a cut key is still a key).
size_t redactPem(std::string& text) {
  size_t n = 0;
  for (size_t at = text.find("-----BEGIN "); at != std::string::npos; at = text.find("-----BEGIN ", at)) {
    size_t headerEnd = text.find("-----", at + 11);
    if (headerEnd == std::string::npos) break;
    if (text.compare(headerEnd - 11, 11, "PRIVATE KEY") != 0) {
      at = headerEnd + 5;
      continue;
    }
    size_t end = text.find("-----END ", headerEnd + 5);
    if (end != std::string::npos) end = text.find("-----", end + 9);
    end = end == std::string::npos ? text.size() : end + 5;
    text.replace(at, end - at, kCredential);
    at += std::strlen(kCredential);
    ++n;
  }
  return n;
}

}  // namespace

Redacted redact(const std::string& text, const std::vector<std::string>& secrets) {
  Redacted out{text, 0};
  for (const auto& secret : secrets) {
    if (secret.size() >= 4) out.replaced += replaceAll(out.text, secret, kSecret);
  }
  out.replaced += redactPem(out.text);
  std::string result;
  result.reserve(out.text.size());
  const std::string& t = out.text;
  for (size_t i = 0; i < t.size();) {
    if (!tokenChar(t[i]) || (i > 0 && tokenChar(t[i - 1]))) {
      result += t[i++];
      continue;
    }
    size_t end = i;
    while (end < t.size() && tokenChar(t[end])) ++end;
    if (credentialShaped(t.data() + i, end - i)) {
      result += kCredential;
      ++out.replaced;
    } else {
      result.append(t, i, end - i);
    }
    i = end;
  }
  out.text = std::move(result);
  return out;
}

}  // namespace moat::agent
