// moatd's MCP endpoint: Streamable HTTP at /mcp (docs/MCP.md). The tools
// call this same API in process, with the caller's own token, so MCP can do
// exactly what the caller may do over REST.
#include <cctype>

#include "api/api.h"
#include "api/in_process_rest.h"
#include "api/validation.h"
#include "common/hex.h"
#include "common/text.h"
#include "mcp/session.h"

namespace moat::api {
namespace {

// "localhost", "127.0.0.1", "[::1]", each with an optional port.
bool localName(const std::string& hostPort) {
  std::string h = asciiLower(hostPort);
  std::string host = h;
  if (!h.empty() && h[0] == '[') {
    auto close = h.find(']');
    if (close == std::string::npos) return false;
    host = h.substr(0, close + 1);
    std::string rest = h.substr(close + 1);
    if (!rest.empty() && (rest[0] != ':' || rest.find_first_not_of("0123456789", 1) != std::string::npos)) return false;
  } else if (auto colon = h.find(':'); colon != std::string::npos) {
    host = h.substr(0, colon);
    if (h.find_first_not_of("0123456789", colon + 1) != std::string::npos) return false;
  }
  return host == "localhost" || host == "127.0.0.1" || host == "[::1]";
}

HttpResponse rpcError(int status, const json& id, int code, const std::string& message) {
  HttpResponse r = respond(status, mcp::errorResponse(id, code, message));
  return r;
}

}  // namespace

std::optional<HttpResponse> Api::mcpGuard(const HttpRequest& head) {
  // DNS rebinding: a web page's script reaching moatd through a name it
  // controls carries that name in Host, and its origin in Origin.
  if (!head.host.empty() && !localName(head.host)) {
    return errorResponse(
        {403, "forbidden", "/mcp answers only local Host names (localhost, 127.0.0.1, [::1]); got " + head.host, ""});
  }
  if (!head.origin.empty()) {
    std::string o = asciiLower(head.origin);
    std::string rest = o.rfind("http://", 0) == 0 ? o.substr(7) : o.rfind("https://", 0) == 0 ? o.substr(8) : "";
    if (rest.empty() || !localName(rest)) {
      return errorResponse({403, "forbidden", "/mcp refuses requests from the web origin " + head.origin, ""});
    }
  }
  return std::nullopt;
}

Api::~Api() { closeMcpSessions(); }

void Api::closeMcpSessions() { mcpSessions_.closeAll(); }

void Api::endOrphanedMcpEnvironments() {
  store::EnvironmentFilter filter;
  filter.labels[mcp::kSessionLabel] = mcp::kMoatdSession;
  auto orphans = environments_.list(filter);
  if (!orphans.ok()) return;
  for (const auto& e : orphans.value()) {
    if (e.state != store::EnvironmentState::kRunning && e.state != store::EnvironmentState::kPaused) continue;
    (void)environments_.destroy(e.id, "its MCP session ended with the moatd that held it", "moatd");
  }
}

HttpResponse Api::mcpRoute(const HttpRequest& req, const Principal& principal) {
  if (auto refused = mcpGuard(req)) return *refused;
  mcpSessions_.expire();
  if (req.method == "GET") {
    HttpResponse r =
        errorResponse({405, "method_not_allowed", "GET /mcp: this server sends nothing unasked; POST requests", ""});
    r.headers = {{"Allow", "POST, DELETE"}};
    return r;
  }
  if (!req.mcpProtocolVersion.empty() && std::find(mcp::kProtocolVersions.begin(), mcp::kProtocolVersions.end(),
                                                   req.mcpProtocolVersion) == mcp::kProtocolVersions.end()) {
    return rpcError(400, nullptr, mcp::kInvalidRequest, "unsupported MCP-Protocol-Version " + req.mcpProtocolVersion);
  }
  if (req.method == "DELETE") {
    if (req.mcpSessionId.empty())
      return rpcError(400, nullptr, mcp::kInvalidRequest, "DELETE /mcp needs Mcp-Session-Id");
    auto s = mcpSessions_.remove(req.mcpSessionId, req.authorization);
    if (!s) return rpcError(404, nullptr, mcp::kInvalidRequest, "no such MCP session");
    s->session->close();
    return noContent();
  }
  if (req.method != "POST") return wrongMethod(req, "POST or DELETE");
  json message = mcp::parseBounded(req.body);
  if (message.is_discarded()) return respond(400, mcp::Session::parseError("the body is not JSON"));
  if (message.is_array()) {
    return rpcError(400, nullptr, mcp::kInvalidRequest,
                    "JSON-RPC batches are not supported: send one message per POST");
  }
  mcp::Kind kind = mcp::kindOf(message);
  bool initialize = kind == mcp::Kind::kRequest && message["method"] == "initialize";
  std::shared_ptr<McpHttpSession> s;
  std::string sessionId = req.mcpSessionId;
  if (initialize) {
    auto id = randomHex(16);
    if (!id.ok()) return rpcError(500, message["id"], mcp::kInternalError, id.error().message());
    sessionId = id.value();
    s = std::make_shared<McpHttpSession>();
    s->authorization = req.authorization;
    s->owner = principal.owner();
    s->master = principal.master;
    s->rest = std::make_unique<InProcessRest>(*this, req.authorization, req.remote + " mcp");
    s->session = std::make_unique<mcp::Session>(*s->rest, "moat", mcp::kMoatdSession);
    if (auto full = mcpSessions_.add(sessionId, s)) return rpcError(429, message["id"], mcp::kInternalError, *full);
  } else {
    if (sessionId.empty())
      return rpcError(400, nullptr, mcp::kInvalidRequest, "missing Mcp-Session-Id (initialize first)");
    s = mcpSessions_.find(sessionId, req.authorization);
    if (!s)
      return rpcError(404, nullptr, mcp::kInvalidRequest,
                      "no such MCP session (it ended or expired): initialize again");
  }
  std::vector<std::pair<std::string, std::string>> headers = {{"Mcp-Session-Id", sessionId}};
  if (kind != mcp::Kind::kRequest) {
    (void)s->session->handle(message, nullptr);
    HttpResponse r;
    r.status = 202;
    r.contentType = "";
    r.headers = headers;
    return r;
  }
  bool progress = message.contains("params") && message["params"].is_object() && message["params"].contains("_meta") &&
                  message["params"]["_meta"].is_object() && message["params"]["_meta"].contains("progressToken");
  bool sseOk = req.accept.find("text/event-stream") != std::string::npos;
  if (message["method"] == "tools/call" && progress && sseOk) {
    // Progress notifications, then the answer, on this request's own stream.
    HttpResponse r;
    r.contentType = "text/event-stream";
    r.headers = headers;
    r.stream = [s, message](const BodyWriter& write) {
      std::mutex writeMutex;
      auto frame = [&](const json& m) {
        std::lock_guard<std::mutex> lock(writeMutex);
        return write("event: message\ndata: " + m.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
      };
      auto answer = s->session->handle(message, [&](const json& n) { (void)frame(n); });
      if (answer) (void)frame(*answer);
    };
    return r;
  }
  auto answer = s->session->handle(message, nullptr);
  HttpResponse r = respond(200, answer ? *answer : json::object());
  r.headers = headers;
  return r;
}

}  // namespace moat::api
