#include "api/mcp_sessions.h"

#include <vector>

namespace moat::api {

std::optional<std::string> McpSessions::add(const std::string& id, std::shared_ptr<McpHttpSession> session) {
  // Counted and added at once: parallel initializes cannot all fit.
  std::lock_guard<std::mutex> lock(mutex_);
  if (sessions_.size() >= limits_.sessions) {
    return "too many MCP sessions open (" + std::to_string(limits_.sessions) + "); end some with DELETE /mcp";
  }
  size_t mine = 0;
  for (const auto& [other, open] : sessions_) mine += open->owner == session->owner ? 1 : 0;
  if (!session->master && mine >= limits_.perKey) {
    return "this key has " + std::to_string(mine) + " MCP sessions open (at most " + std::to_string(limits_.perKey) +
           " per key); end some with DELETE /mcp";
  }
  sessions_[id] = std::move(session);
  return std::nullopt;
}

std::shared_ptr<McpHttpSession> McpSessions::find(const std::string& id, const std::string& authorization) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->authorization != authorization) return nullptr;
  it->second->lastUsed = std::chrono::steady_clock::now();
  return it->second;
}

std::shared_ptr<McpHttpSession> McpSessions::remove(const std::string& id, const std::string& authorization) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->authorization != authorization) return nullptr;
  auto session = std::move(it->second);
  sessions_.erase(it);
  return session;
}

void McpSessions::expire(std::chrono::steady_clock::time_point now) {
  std::vector<std::shared_ptr<McpHttpSession>> expired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (now - it->second->lastUsed > limits_.idle) {
        expired.push_back(std::move(it->second));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : expired) s->session->close();
}

void McpSessions::closeAll() {
  std::map<std::string, std::shared_ptr<McpHttpSession>> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all.swap(sessions_);
  }
  for (auto& [id, s] : all) s->session->close();
}

size_t McpSessions::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  return sessions_.size();
}

}  // namespace moat::api
