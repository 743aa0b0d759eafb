#include "agent/wire.h"

#include <algorithm>

#include "mcp/protocol.h"

namespace moat::agent {

std::unique_ptr<Wire> wireFor(ProviderKind kind) {
  return kind == ProviderKind::kAnthropic ? anthropicWire() : openAiWire();
}

const char* providerName(ProviderKind kind) { return kind == ProviderKind::kAnthropic ? "anthropic" : "openai"; }

json parseArguments(const std::string& text) {
  if (text.empty()) return json::object();
  json parsed = mcp::parseBounded(text);
  if (parsed.is_discarded()) return text;
  return parsed;
}

std::string errorMessageOf(const std::string& body) {
  json j = mcp::parseBounded(body);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    return j["error"]["message"];
  }
  return "";
}

uint64_t usageCount(const json& usage, const char* key) {
  if (!usage.is_object() || !usage.contains(key) || !usage[key].is_number_integer()) return 0;
  return usage[key].is_number_unsigned() ? usage[key].get<uint64_t>()
                                         : static_cast<uint64_t>(std::max<int64_t>(0, usage[key].get<int64_t>()));
}

}  // namespace moat::agent
