#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "mcp/backend.h"
#include "mcp/session.h"

namespace moat::api {

// One MCP session over Streamable HTTP (docs/MCP.md): the token that opened
// it (only it may use it), whose it is, and the session with the API it
// calls.
struct McpHttpSession {
  std::string authorization;
  std::string owner;  // the master or the key id, for the per-key limit
  bool master = false;
  std::unique_ptr<mcp::RestBackend> rest;
  std::unique_ptr<mcp::Session> session;
  std::chrono::steady_clock::time_point lastUsed = std::chrono::steady_clock::now();
};

// moatd's open MCP sessions by id, within limits: so many in all and per
// key, and ended after a while unused. Its own lock, held only to look up;
// sessions are closed outside it.
struct McpSessionLimits {
  size_t sessions = 256;
  size_t perKey = 16;  // one key cannot take every session
  std::chrono::steady_clock::duration idle = std::chrono::minutes(30);
};

class McpSessions {
 public:
  using Limits = McpSessionLimits;
  explicit McpSessions(Limits limits = {}) : limits_(limits) {}
  ~McpSessions() { closeAll(); }

  // Added under `id`, or why not (a limit, named).
  std::optional<std::string> add(const std::string& id, std::shared_ptr<McpHttpSession> session);
  // The session `id` if `authorization` opened it (now counted as used);
  // another token's session does not exist for this caller.
  std::shared_ptr<McpHttpSession> find(const std::string& id, const std::string& authorization);
  // Taken out (to close) if `authorization` opened it.
  std::shared_ptr<McpHttpSession> remove(const std::string& id, const std::string& authorization);
  // Ends the sessions unused for longer than the limit.
  void expire(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  void closeAll();
  size_t size();

 private:
  const Limits limits_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<McpHttpSession>> sessions_;
};

}  // namespace moat::api
