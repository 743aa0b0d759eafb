#include "mcp/session.h"

#include <thread>

#include "mcp/tools.h"

namespace moat::mcp {
namespace {

// A string member of a client's object, "" when it is absent or not a string
// (json::value throws on another type, and a client's message must not end
// the session or moatd).
std::string stringField(const json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

void CallContext::cancel() {
  cancelled_ = true;
  cv_.notify_all();
}

void CallContext::status(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  status_ = message;
}

void CallContext::tick() {
  if (!wantsProgress()) return;
  std::string message;
  double progress;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    message = status_;
    progress = ++progress_;
  }
  notify_(notification("notifications/progress",
                       {{"progressToken", token_}, {"progress", progress}, {"message", message}}));
}

bool CallContext::sleepFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, d, [this] { return cancelled_.load(); });
}

Session::Session(RestBackend& backend, std::string name, std::string kind)
    : rest_(backend), name_(std::move(name)), kind_(std::move(kind)) {}

Session::~Session() { close(); }

json Session::parseError(const std::string& why) { return errorResponse(nullptr, kParseError, "parse error: " + why); }

void Session::close() {
  std::string environment;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, call] : inFlight_) call->cancel();
    environment = defaultEnvironment_;
  }
  if (!environment.empty()) (void)rest_.call("DELETE", "/v1/environments/" + environment, "");
}

json Session::initialize(const json& params) {
  std::string requested = stringField(params, "protocolVersion");
  version_ = negotiateVersion(requested);
  return {{"protocolVersion", version_},
          {"capabilities", {{"tools", {{"listChanged", false}}}, {"resources", {{"listChanged", false}}}}},
          {"serverInfo", {{"name", name_}, {"title", "moat sandboxes"}, {"version", "0.1.0"}}},
          {"instructions",
           "moat gives you disposable, isolated Linux environments. Tools without environment_id act on this "
           "session's own environment, created on first use and destroyed when the session ends. Commands run "
           "as root inside the environment, which cannot touch the host; the network is off unless a policy "
           "allows hosts. A result starting 'denied by policy' means a rule or a person said no: do not retry "
           "the same action."}};
}

std::optional<json> Session::handle(const json& message, const Notify& notify) {
  Kind kind = kindOf(message);
  if (kind == Kind::kInvalid) {
    json id = message.is_object() && message.contains("id") &&
                      (message["id"].is_string() || message["id"].is_number_integer())
                  ? message["id"]
                  : json(nullptr);
    return errorResponse(id, kInvalidRequest, "invalid request: not a JSON-RPC 2.0 request or notification");
  }
  if (kind == Kind::kResponse) return std::nullopt;  // we send no requests
  const std::string method = message["method"];
  const json params = message.value("params", json::object());
  if (kind == Kind::kNotification) {
    if (method == "notifications/initialized") {
      initialized_ = true;
    } else if (method == "notifications/cancelled" && params.is_object() && params.contains("requestId")) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = inFlight_.find(params["requestId"].dump()); it != inFlight_.end()) it->second->cancel();
    }
    return std::nullopt;
  }
  const json& id = message["id"];
  if (method == "initialize") {
    initialized_ = true;  // clients send notifications/initialized next; requests may come first
    return resultResponse(id, initialize(params));
  }
  if (method == "ping") return resultResponse(id, json::object());
  if (method == "tools/list") return resultResponse(id, {{"tools", Tools::list()}});
  if (method == "resources/list") return resultResponse(id, listResources());
  if (method == "resources/templates/list") return resultResponse(id, {{"resourceTemplates", json::array()}});
  if (method == "resources/read") {
    std::string error;
    auto contents = readResource(params, error);
    if (!contents) return errorResponse(id, kInvalidParams, error);
    return resultResponse(id, *contents);
  }
  if (method != "tools/call") return errorResponse(id, kMethodNotFound, "method not found: " + method);
  if (!params.is_object() || !params.contains("name") || !params["name"].is_string()) {
    return errorResponse(id, kInvalidParams, "tools/call needs params.name (a tool name)");
  }
  if (!Tools::exists(params["name"])) {
    return errorResponse(id, kInvalidParams, "unknown tool: " + params["name"].get<std::string>());
  }
  json token =
      params.contains("_meta") && params["_meta"].is_object() ? params["_meta"].value("progressToken", json()) : json();
  auto call = std::make_shared<CallContext>(token, notify);
  std::string key = id.dump();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return errorResponse(id, kInternalError, "the session has ended");
    inFlight_[key] = call;
  }
  // Progress about once a second while the tool runs, so a client that
  // resets its timeout on progress keeps waiting for a long command.
  std::mutex doneMutex;
  std::condition_variable doneCv;
  bool done = false;
  std::thread ticker;
  if (call->wantsProgress()) {
    ticker = std::thread([&] {
      std::unique_lock<std::mutex> lock(doneMutex);
      while (!doneCv.wait_for(lock, std::chrono::milliseconds(1000), [&] { return done; })) {
        lock.unlock();
        call->tick();
        lock.lock();
      }
    });
  }
  json result;
  try {
    result = callTool(params, *call);
  } catch (const std::exception& e) {
    result = toolError(std::string("internal error: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(doneMutex);
    done = true;
  }
  doneCv.notify_all();
  if (ticker.joinable()) ticker.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inFlight_.erase(key);
  }
  return resultResponse(id, std::move(result));
}

json Session::callTool(const json& params, CallContext& call) {
  json args = params.value("arguments", json::object());
  if (!args.is_object()) return toolError("invalid arguments: must be an object");
  Tools tools(*this, call);
  return tools.call(params["name"], args);
}

std::optional<std::string> Session::environmentFor(const json& args, std::string& error) {
  if (args.contains("environment_id")) return args["environment_id"].get<std::string>();
  std::lock_guard<std::mutex> lock(mutex_);  // one creation even when calls race
  if (closed_) {
    error = "the session has ended";
    return std::nullopt;
  }
  if (!defaultEnvironment_.empty()) return defaultEnvironment_;
  RestResponse r = rest_.call("POST", "/v1/environments", json{{"labels", {{kSessionLabel, kind_}}}}.dump());
  json body = json::parse(r.body, nullptr, false);
  if (r.status != 201 || !body.is_object() || !body.contains("id")) {
    error = "could not create this session's environment: " + Tools::describeFailure(r);
    return std::nullopt;
  }
  defaultEnvironment_ = body["id"];
  return defaultEnvironment_;
}

json Session::listResources() {
  json resources = json::array();
  RestResponse r = rest_.call("GET", "/v1/environments?state=running", "");
  json body = json::parse(r.body, nullptr, false);
  if (r.status == 200 && body.is_object() && body["environments"].is_array()) {
    for (const auto& e : body["environments"]) {
      std::string id = e.value("id", "");
      resources.push_back({{"uri", "moat://environments/" + id},
                           {"name", "environment " + id},
                           {"description", "state, spec and permissions of environment " + id},
                           {"mimeType", "application/json"}});
      resources.push_back({{"uri", "moat://environments/" + id + "/events"},
                           {"name", "events of " + id},
                           {"description", "the recent audit events of environment " + id},
                           {"mimeType", "application/json"}});
    }
  }
  return {{"resources", resources}};
}

std::optional<json> Session::readResource(const json& params, std::string& error) {
  std::string uri = stringField(params, "uri");
  const std::string prefix = "moat://environments/";
  if (uri.compare(0, prefix.size(), prefix) != 0) {
    error = "unknown resource " + uri + " (moat://environments/{id} or moat://environments/{id}/events)";
    return std::nullopt;
  }
  std::string rest = uri.substr(prefix.size());
  bool events = rest.size() > 7 && rest.compare(rest.size() - 7, 7, "/events") == 0;
  std::string id = events ? rest.substr(0, rest.size() - 7) : rest;
  if (id.empty() || id.find_first_not_of("0123456789abcdef") != std::string::npos) {
    error = "not an environment id: " + id;
    return std::nullopt;
  }
  RestResponse r =
      events ? rest_.call("GET", "/v1/events?environment=" + id, "") : rest_.call("GET", "/v1/environments/" + id, "");
  if (r.status != 200) {
    error = Tools::describeFailure(r);
    return std::nullopt;
  }
  std::string text = r.body;
  if (events) {
    json list = json::array();
    size_t start = 0;
    while (start < r.body.size()) {
      size_t end = r.body.find('\n', start);
      if (end == std::string::npos) end = r.body.size();
      if (r.body.compare(start, 6, "data: ") == 0) {
        json e = json::parse(r.body.substr(start + 6, end - start - 6), nullptr, false);
        if (!e.is_discarded()) list.push_back(e);
      }
      start = end + 1;
    }
    if (list.size() > 100) list.erase(list.begin(), list.end() - 100);  // the most recent
    text = list.dump(2);
  }
  return json{{"contents", json::array({{{"uri", uri}, {"mimeType", "application/json"}, {"text", text}}})}};
}

}  // namespace moat::mcp
