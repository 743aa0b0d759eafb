#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

// JSON-RPC 2.0 as MCP uses it: message shapes, error codes, versions.
namespace moat::mcp {

using json = nlohmann::json;

constexpr int kParseError = -32700;
constexpr int kInvalidRequest = -32600;
constexpr int kMethodNotFound = -32601;
constexpr int kInvalidParams = -32602;
constexpr int kInternalError = -32603;

// Newest first; initialize answers with the client's when it is here.
extern const std::vector<std::string> kProtocolVersions;
std::string negotiateVersion(const std::string& requested);

json errorResponse(const json& id, int code, const std::string& message);
json resultResponse(const json& id, json result);
json notification(const std::string& method, json params);

// What a message is. Anything else is an invalid request.
enum class Kind { kRequest, kNotification, kResponse, kInvalid };
Kind kindOf(const json& message);

// A tool's result: text for the model and the same as JSON.
json toolResult(const std::string& text, json structured, bool isError = false);
json toolError(const std::string& text);

// JSON from outside (requests, MCP messages, model providers): parsed
// without exceptions, and discarded (is_discarded()) when it nests deeper
// than kMaxJsonDepth, since copying and writing JSON recurse.
constexpr int kMaxJsonDepth = 64;
json parseBounded(const std::string& text);

// "%2F"-style encoding of a query value or path segment.
std::string urlEncode(const std::string& s);

}  // namespace moat::mcp
