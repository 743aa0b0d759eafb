#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "mcp/backend.h"
#include "mcp/protocol.h"

// One MCP session (docs/MCP.md): the protocol's methods, the tools, and the
// session's default environment. Transport-free: stdio (`moat mcp`) and
// Streamable HTTP (moatd's /mcp) hand it messages.
namespace moat::mcp {

using Notify = std::function<void(const json& message)>;

// A tool call in flight: cancellation, and what its progress notifications say.
class CallContext {
 public:
  CallContext(json progressToken, Notify notify) : token_(std::move(progressToken)), notify_(std::move(notify)) {}
  bool cancelled() const { return cancelled_.load(); }
  void cancel();
  // What a progress notification says while the call runs.
  void status(const std::string& message);
  // Sends one progress notification (the ticker calls this about once a second).
  void tick();
  bool wantsProgress() const { return !token_.is_null() && notify_ != nullptr; }
  // Waits up to `d`; returns early (true) when cancelled.
  bool sleepFor(std::chrono::milliseconds d);

 private:
  json token_;
  Notify notify_;
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string status_ = "working";
  double progress_ = 0;
};

// The label a session's default environment carries: {kSessionLabel: kind}
// ("session" for `moat mcp`, kMoatdSession for moatd's /mcp, whose sessions
// end with the moatd that holds them).
inline constexpr const char* kSessionLabel = "moat-mcp";
inline constexpr const char* kMoatdSession = "moatd-session";

class Session {
 public:
  explicit Session(RestBackend& backend, std::string name = "moat", std::string kind = "session");
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // One request or notification. Requests are answered (tool calls block
  // until done, cancelled or failed); notifications and responses get
  // nothing. `notify` carries this request's progress notifications.
  // Thread-safe: a cancellation arrives while the call it names runs.
  std::optional<json> handle(const json& message, const Notify& notify);
  // The answer to bytes that are not JSON.
  static json parseError(const std::string& why);
  // Cancels what runs and destroys the default environment. Idempotent.
  void close();
  bool initialized() const { return initialized_.load(); }
  const std::string& protocolVersion() const { return version_; }

 private:
  json initialize(const json& params);
  json callTool(const json& params, CallContext& call);
  json listResources();
  std::optional<json> readResource(const json& params, std::string& error);
  // The environment a tool acts on: `environment_id`, or the session's own
  // (made on first use).
  std::optional<std::string> environmentFor(const json& args, std::string& error);

  RestBackend& rest_;
  std::string name_;
  std::string kind_;
  std::string version_;
  std::atomic<bool> initialized_{false};
  std::mutex mutex_;
  std::string defaultEnvironment_;
  bool closed_ = false;
  std::map<std::string, std::shared_ptr<CallContext>> inFlight_;  // request id (dumped) -> call
  friend class Tools;
};

}  // namespace moat::mcp
