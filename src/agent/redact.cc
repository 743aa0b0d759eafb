#include "agent/redact.h"

#include <regex>

namespace moat::agent {
namespace {

size_t replaceAll(std::string& text, const std::string& what, const std::string& with) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + with.size())) {
    text.replace(at, what.size(), with);
    ++n;
  }
  return n;
}

// Shapes of credentials: PEM private keys; OpenAI, Anthropic, GitHub,
// Slack, AWS access key ids and Google API keys.
const std::vector<std::regex>& shapes() {
  static const std::vector<std::regex> all = {
      std::regex("-----BEGIN [A-Z ]*PRIVATE KEY-----[\\s\\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
      std::regex("\\bsk-(?:ant-|proj-)?[A-Za-z0-9_\\-]{20,}"),
      std::regex("\\bgh[pousr]_[A-Za-z0-9]{36,}"),
      std::regex("\\bgithub_pat_[A-Za-z0-9_]{22,}"),
      std::regex("\\bxox[abprs]-[A-Za-z0-9\\-]{10,}"),
      std::regex("\\bAKIA[0-9A-Z]{16}\\b"),
      std::regex("\\bAIza[0-9A-Za-z_\\-]{35}"),
  };
  return all;
}

}  // namespace

Redacted redact(const std::string& text, const std::vector<std::string>& secrets) {
  Redacted out{text, 0};
  for (const auto& secret : secrets) {
    if (secret.size() >= 4) out.replaced += replaceAll(out.text, secret, "[redacted: a secret of this run]");
  }
  for (const auto& shape : shapes()) {
    std::string result;
    size_t last = 0;
    for (auto it = std::sregex_iterator(out.text.begin(), out.text.end(), shape); it != std::sregex_iterator(); ++it) {
      result.append(out.text, last, static_cast<size_t>(it->position()) - last);
      result += "[redacted: a credential]";
      last = static_cast<size_t>(it->position() + it->length());
      ++out.replaced;
    }
    if (last > 0) {
      result.append(out.text, last, std::string::npos);
      out.text = std::move(result);
    }
  }
  return out;
}

}  // namespace moat::agent
