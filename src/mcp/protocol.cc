#include "mcp/protocol.h"

#include <algorithm>

namespace moat::mcp {

const std::vector<std::string> kProtocolVersions = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"};

std::string negotiateVersion(const std::string& requested) {
  if (std::find(kProtocolVersions.begin(), kProtocolVersions.end(), requested) != kProtocolVersions.end()) {
    return requested;
  }
  return kProtocolVersions.front();
}

json parseBounded(const std::string& text) {
  bool tooDeep = false;
  json::parser_callback_t limit = [&tooDeep](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth) tooDeep = true;
    return !tooDeep;
  };
  json parsed = json::parse(text, limit, false);
  return tooDeep ? json(json::value_t::discarded) : parsed;
}

json errorResponse(const json& id, int code, const std::string& message) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
}

json resultResponse(const json& id, json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json notification(const std::string& method, json params) {
  return {{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
}

Kind kindOf(const json& m) {
  if (!m.is_object() || m.value("jsonrpc", json()) != "2.0") return Kind::kInvalid;
  bool hasId = m.contains("id") && (m["id"].is_string() || m["id"].is_number_integer());
  if (m.contains("method")) {
    if (!m["method"].is_string()) return Kind::kInvalid;
    if (m.contains("params") && !m["params"].is_object() && !m["params"].is_array()) return Kind::kInvalid;
    if (hasId) return Kind::kRequest;
    return m.contains("id") ? Kind::kInvalid : Kind::kNotification;
  }
  if (hasId && (m.contains("result") || m.contains("error"))) return Kind::kResponse;
  return Kind::kInvalid;
}

json toolResult(const std::string& text, json structured, bool isError) {
  json r = {{"content", json::array({{{"type", "text"}, {"text", text}}})}, {"isError", isError}};
  if (!structured.is_null()) r["structuredContent"] = std::move(structured);
  return r;
}

json toolError(const std::string& text) { return toolResult(text, nullptr, true); }

std::string urlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace moat::mcp
