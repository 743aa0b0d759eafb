#pragma once

#include <string>

// What the MCP tools act through: moatd's REST API (docs/API.md), called in
// process by moatd's /mcp or over HTTP by `moat mcp`. One implementation of
// every tool serves both, and a tool can do no more than its caller's token
// may do over REST.
namespace moat::mcp {

struct RestResponse {
  int status = 0;  // 0: moatd could not be reached (body says why)
  std::string body;
  std::string contentType;
};

class RestBackend {
 public:
  virtual ~RestBackend() = default;
  // target: a path with an encoded query ("/v1/environments/x/files?path=%2Fa").
  virtual RestResponse call(const std::string& method, const std::string& target, const std::string& body) = 0;
};

}  // namespace moat::mcp
