#include "agent/wire.h"

namespace moat::agent {

std::unique_ptr<Wire> wireFor(ProviderKind kind) {
  return kind == ProviderKind::kAnthropic ? anthropicWire() : openAiWire();
}

const char* providerName(ProviderKind kind) { return kind == ProviderKind::kAnthropic ? "anthropic" : "openai"; }

json parseArguments(const std::string& text) {
  if (text.empty()) return json::object();
  json parsed = json::parse(text, nullptr, false);
  if (parsed.is_discarded()) return text;
  return parsed;
}

std::string errorMessageOf(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    return j["error"]["message"];
  }
  return "";
}

uint64_t usageCount(const json& usage, const char* key) {
  return usage.is_object() && usage.contains(key) && usage[key].is_number_unsigned() ? usage[key].get<uint64_t>() : 0;
}

}  // namespace moat::agent
