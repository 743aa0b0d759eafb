#pragma once

#include <string>

#include "api/api.h"
#include "mcp/backend.h"

namespace moat::api {

// The API in process, with a caller's own Authorization: for the tools of
// an MCP session and of an agent run, which can then do exactly what that
// caller may do over REST.
class InProcessRest : public mcp::RestBackend {
 public:
  InProcessRest(Api& api, std::string authorization, std::string remote)
      : api_(api), authorization_(std::move(authorization)), remote_(std::move(remote)) {}
  mcp::RestResponse call(const std::string& method, const std::string& target, const std::string& body) override {
    HttpRequest r;
    r.method = method;
    parseTarget(target, r);
    r.body = body;
    r.authorization = authorization_;
    r.remote = remote_;
    HttpResponse answer = api_.handle(r);
    if (answer.stream || answer.websocket) return {500, "a streamed answer where none was asked for", ""};
    return {answer.status, answer.body, answer.contentType};
  }

 private:
  Api& api_;
  std::string authorization_;
  std::string remote_;
};

}  // namespace moat::api
