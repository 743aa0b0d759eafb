// /v1/agents (docs/AGENTS.md): agent runs moatd drives itself. A run's
// environment is made through this same API with its creator's own
// Authorization, and so are its tools (the MCP tools, in process): a run
// can do no more than its creator may over REST, every action through the
// gate.
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <set>

#include "agent/https_client.h"
#include "agent/provider.h"
#include "agent/replay.h"
#include "agent/run.h"
#include "api/agent_runs.h"
#include "api/api.h"
#include "api/in_process_rest.h"
#include "api/validation.h"
#include "common/clock.h"
#include "common/hex.h"
#include "mcp/session.h"
#include "mcp/tools.h"

namespace moat::api {
namespace {

// The MCP tools a run's model is offered: everything within its one
// environment (which the run names; the model does not).
const std::set<std::string>& agentTools() {
  static const std::set<std::string> names = {
      "run_command",  "read_file",     "write_file",          "edit_file",  "list_files",
      "search_files", "start_process", "read_process_output", "send_input", "kill_process",
  };
  return names;
}

class McpToolbox final : public agent::Toolbox {
 public:
  McpToolbox(Api& api, const std::string& authorization, std::string environment, gate::ApprovalCenter& approvals)
      : rest_(api, authorization, "moatd-agent"),
        session_(rest_, "moat-agent", "agent"),
        environment_(std::move(environment)),
        approvals_(approvals) {}

  std::vector<agent::ToolSpec> tools() override {
    std::vector<agent::ToolSpec> out;
    for (const auto& t : mcp::Tools::list()) {
      if (!agentTools().count(t.value("name", ""))) continue;
      json schema = t["inputSchema"];
      if (schema.contains("properties")) schema["properties"].erase("environment_id");
      if (schema.contains("required") && schema["required"].is_array()) {
        json kept = json::array();
        for (const auto& r : schema["required"]) {
          if (r != "environment_id") kept.push_back(r);
        }
        schema["required"] = kept;
      }
      out.push_back({t["name"], t.value("description", ""), schema});
    }
    return out;
  }

  agent::ToolResult call(const agent::ToolCall& c) override {
    agent::ToolResult result{c.id, c.name, "", true};
    if (cancelled_) {
      result.content = "the run was stopped";
      return result;
    }
    if (!agentTools().count(c.name)) {
      result.content = "there is no tool named '" + c.name + "'";
      return result;
    }
    if (!c.arguments.is_object()) {
      result.content = "the arguments of " + c.name + " must be a JSON object";
      return result;
    }
    json args = c.arguments;
    if (args.contains("environment_id")) {
      result.content = "environment_id is not an argument here: the run's environment is implied";
      return result;
    }
    args["environment_id"] = environment_;
    auto context = std::make_shared<mcp::CallContext>(json(), nullptr);
    {
      // Published and checked under one lock: a cancel either sees this
      // call or is seen by it.
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_) {
        result.content = "the run was stopped";
        return result;
      }
      current_ = context;
    }
    json answer = mcp::Tools(session_, *context).call(c.name, args);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      current_.reset();
    }
    for (const auto& part : answer.value("content", json::array())) {
      if (part.value("type", "") == "text") result.content += part.value("text", "");
    }
    result.isError = answer.value("isError", false);
    return result;
  }

  void cancel() override {
    std::shared_ptr<mcp::CallContext> current;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cancelled_ = true;
      current = current_;
    }
    if (current) current->cancel();
    // A tool waiting for a person ends now.
    approvals_.closeEnvironment(environment_, "its agent run was stopped");
  }

 private:
  InProcessRest rest_;
  mcp::Session session_;
  std::string environment_;
  gate::ApprovalCenter& approvals_;
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::shared_ptr<mcp::CallContext> current_;
};

// A host a key's run may not send its requests to (agent::localAddress),
// by name or address: refused at once when the run is created, and checked
// again on every connection (PostOptions::refuseLocal), since a name may
// resolve elsewhere later.
bool localHost(const std::string& host) {
  struct addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  // Unresolvable now: the client checks each address it connects to anyway.
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool local = false;
  for (auto* a = found; a && !local; a = a->ai_next) local = agent::localAddress(a->ai_addr);
  ::freeaddrinfo(found);
  return local;
}

std::optional<ApiError> providerFields(const json& p, const Principal& principal, bool localAllowed,
                                       agent::ProviderConfig& out) {
  if (!p.is_object())
    return invalid("provider", "must be an object: {kind, model, base_url?, api_key? | api_key_env?}");
  if (auto e = onlyFields(p, {"kind", "model", "base_url", "api_key", "api_key_env", "max_tokens"}, "provider.")) {
    return e;
  }
  if (!p.contains("kind") || !p["kind"].is_string() || (p["kind"] != "anthropic" && p["kind"] != "openai")) {
    return invalid("provider.kind", "one of anthropic, openai, replay");
  }
  out.kind = p["kind"] == "anthropic" ? agent::ProviderKind::kAnthropic : agent::ProviderKind::kOpenAi;
  if (!p.contains("model") || !p["model"].is_string() || p["model"].get<std::string>().empty() ||
      p["model"].get<std::string>().size() > 256) {
    return invalid("provider.model", "required: the model's name, at most 256 bytes");
  }
  out.model = p["model"];
  if (p.contains("base_url")) {
    if (!p["base_url"].is_string()) return invalid("provider.base_url", "must be a string");
    out.baseUrl = p["base_url"];
    auto url = agent::parseUrl(out.baseUrl);
    if (!url.ok()) return invalid("provider.base_url", url.error().context);
    if (!principal.master && !localAllowed && localHost(url->host)) {
      return ApiError{403, "forbidden",
                      "provider.base_url: " + url->host +
                          " is moatd's own host or network; only the master token may send a run's requests there "
                          "(moatd --agent-local-providers lets keys)",
                      "provider.base_url"};
    }
  }
  if (p.contains("api_key") && p.contains("api_key_env")) {
    return invalid("provider.api_key", "give api_key or api_key_env, not both");
  }
  if (p.contains("api_key")) {
    if (!p["api_key"].is_string() || p["api_key"].get<std::string>().size() > 4096) {
      return invalid("provider.api_key", "must be a string of at most 4096 bytes");
    }
    out.apiKey = p["api_key"];
  } else if (p.contains("api_key_env")) {
    // moatd's own variables: a key could send any of them to a server it names.
    if (!principal.master) {
      return ApiError{403, "forbidden", "provider.api_key_env: only the master token may use moatd's variables",
                      "provider.api_key_env"};
    }
    if (!p["api_key_env"].is_string()) return invalid("provider.api_key_env", "must be a variable's name");
    const char* value = std::getenv(p["api_key_env"].get<std::string>().c_str());
    if (!value || !*value) {
      return invalid("provider.api_key_env",
                     p["api_key_env"].get<std::string>() + " is not set in moatd's environment");
    }
    out.apiKey = value;
  }
  if (p.contains("max_tokens")) {
    if (auto e = number(p["max_tokens"], "provider.max_tokens", 1, 1000000, true, out.maxTokens)) return e;
  }
  return std::nullopt;
}

}  // namespace

json Api::agentJson(const AgentRunEntry& entry) {
  agent::RunStatus s = entry.run->status();
  std::string state = agent::runStateName(s.state);
  if (s.state == agent::RunState::kRunning && s.inTool) {
    store::ApprovalFilter filter;
    filter.state = store::ApprovalState::kPending;
    filter.environment = entry.environment;
    auto pending = approvals_.list(filter);
    if (pending.ok() && !pending->empty()) state = "waiting_approval";
  }
  json j = {{"id", entry.id},
            {"state", state},
            {"environment", entry.environment},
            {"keep_environment", entry.keepEnvironment},
            {"iterations", s.iterations},
            {"max_iterations", entry.maxIterations},
            {"usage", {{"input_tokens", s.inputTokens}, {"output_tokens", s.outputTokens}}},
            {"provider", {{"kind", entry.kind}, {"model", entry.model}, {"base_url", entry.baseUrl}}},
            {"labels", entry.labels},
            {"created_at", timestamp(entry.createdAtMs)}};
  if (s.state == agent::RunState::kCompleted) j["result"] = s.result;
  if (!s.error.empty()) j["error"] = s.error;
  if (s.endedAtMs) j["ended_at"] = timestamp(s.endedAtMs);
  return j;
}

std::shared_ptr<AgentRunEntry> Api::visibleRun(const Principal& principal, const std::string& id) {
  auto entry = agentRuns_.get(id);
  if (!entry || (!principal.master && entry->owner != principal.keyId)) return nullptr;
  return entry;
}

HttpResponse Api::createAgent(const HttpRequest& req, const Principal& principal) {
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j,
                          {"instruction", "provider", "permissions", "max_iterations", "timeout_s", "token_budget",
                           "spec", "template", "snapshot", "network", "secrets", "labels", "keep_environment"},
                          "")) {
    return errorResponse(*e);
  }
  if (!j.contains("instruction") || !j["instruction"].is_string() || j["instruction"].get<std::string>().empty() ||
      j["instruction"].get<std::string>().size() > (64u << 10)) {
    return errorResponse(invalid("instruction", "required: what to do, at most 64 KiB of text"));
  }
  if (!j.contains("provider")) return errorResponse(invalid("provider", "required: {kind, model, ...}"));
  agent::ProviderConfig provider;
  // A replay: another run's recorded turns, the caller's own and ended.
  std::unique_ptr<agent::Model> model;
  std::string replayed;
  if (j["provider"].is_object() && j["provider"].value("kind", json()) == "replay") {
    const json& p = j["provider"];
    if (auto e = onlyFields(p, {"kind", "run"}, "provider.")) return errorResponse(*e);
    if (!p.contains("run") || !p["run"].is_string()) {
      return errorResponse(invalid("provider.run", "required: the id of the run to replay"));
    }
    replayed = p["run"];
    auto source = visibleRun(principal, replayed);
    if (!source) return errorResponse({404, "not_found", "no agent run " + replayed, "provider.run"});
    if (source->run->status().state == agent::RunState::kRunning) {
      return errorResponse({409, "conflict", "run " + replayed + " has not ended yet", "provider.run"});
    }
    auto turns = agent::ReplayModel::turnsOf(source->run->transcript());
    if (!turns.ok()) {
      return errorResponse(
          {409, "conflict", "run " + replayed + " cannot be replayed: " + turns.error().context, "provider.run"});
    }
    model = std::make_unique<agent::ReplayModel>(std::move(turns.value()), source->model);
  } else if (auto e = providerFields(j["provider"], principal, options_.agentLocalProviders, provider)) {
    return errorResponse(*e);
  }
  agent::RunSettings settings;
  settings.instruction = j["instruction"];
  if (j.contains("max_iterations")) {
    if (auto e = number(j["max_iterations"], "max_iterations", 1, 1000, true, settings.maxIterations)) {
      return errorResponse(*e);
    }
  }
  if (j.contains("token_budget")) {
    if (auto e = number(j["token_budget"], "token_budget", 1, 1e12, true, settings.tokenBudget)) {
      return errorResponse(*e);
    }
  }
  int64_t timeoutS = 3600;
  if (j.contains("timeout_s")) {
    if (auto e = number(j["timeout_s"], "timeout_s", 1, 86400, true, timeoutS)) return errorResponse(*e);
  }
  settings.timeout = std::chrono::seconds(timeoutS);
  bool keep = false;
  if (j.contains("keep_environment")) {
    if (!j["keep_environment"].is_boolean()) return errorResponse(invalid("keep_environment", "must be true or false"));
    keep = j["keep_environment"];
  }
  std::map<std::string, std::string> labels;
  if (j.contains("labels")) {
    if (auto e = stringMap(j["labels"], "labels", false, labels)) return errorResponse(*e);
  }

  if (Status room = agentRuns_.admit(principal.owner()); !room.ok()) return errorResponse(fromError(room.error()));
  const uint64_t keyTokens = principal.master ? 0 : options_.agentKeyTokensPerDay;
  if (agentRuns_.spent(principal.owner(), keyTokens)) {
    return errorResponse(
        {429, "capacity",
         "this key's agent token budget for today (" + std::to_string(keyTokens) + ") is spent; it renews at 00:00 UTC",
         ""});
  }
  // The environment: made as its creator would make it, marked as the run's.
  auto entry = std::make_shared<AgentRunEntry>();
  auto id = randomHex(6);
  if (!id.ok()) return errorResponse(fromError(id.error()));
  entry->id = id.value();
  json create = json::object();
  for (const char* k : {"permissions", "spec", "template", "snapshot", "network", "secrets"}) {
    if (j.contains(k)) create[k] = j[k];
  }
  json envLabels = labels;
  // Marked for the sweep at moatd's next start, unless it is to be kept.
  if (!keep) envLabels[kAgentLabel] = kAgentLabelValue;
  envLabels[kAgentRunLabel] = entry->id;
  create["labels"] = envLabels;
  create["task_id"] = "agent-" + entry->id;
  // Lives through the run and a while after (kept, it is the creator's to end).
  create["ttl_s"] = std::min<int64_t>(timeoutS + 600, environments_.config().maxTtlS);
  InProcessRest rest(*this, req.authorization, req.remote);
  mcp::RestResponse made = rest.call("POST", "/v1/environments", create.dump());
  if (made.status != 201) {
    HttpResponse refused;
    refused.status = made.status;
    refused.body = made.body;
    refused.contentType = made.contentType;
    return refused;
  }
  json env = json::parse(made.body, nullptr, false);
  entry->environment = env.value("id", "");
  if (j.contains("secrets") && j["secrets"].is_array()) {
    for (const auto& s : j["secrets"]) {
      if (s.is_object() && s.contains("value") && s["value"].is_string()) settings.secrets.push_back(s["value"]);
    }
  }
  entry->owner = principal.owner();
  entry->keepEnvironment = keep;
  AgentRuns& runs = agentRuns_;
  settings.spend = [&runs, owner = entry->owner, keyTokens](uint64_t tokens) {
    return runs.spend(owner, tokens, keyTokens);
  };
  if (!model) {
    agent::PostOptions post;
    post.refuseLocal = !principal.master && !options_.agentLocalProviders;
    auto client = std::make_unique<agent::Provider>(provider, agent::RetryPolicy{}, post);
    entry->baseUrl = client->baseUrl();
    model = std::move(client);
  } else {
    entry->baseUrl = "replay:" + replayed;
  }
  entry->kind = model->kind();
  entry->model = model->model();
  entry->maxIterations = settings.maxIterations;
  entry->createdAtMs = nowMs();
  entry->labels = labels;
  const std::string environment = entry->environment, owner = entry->owner, runId = entry->id;
  audit::Recorder& audit = audit_;
  entry->run =
      std::make_unique<agent::Run>(std::move(settings), std::move(model),
                                   std::make_unique<McpToolbox>(*this, req.authorization, environment, approvals_),
                                   [&audit, environment, owner, runId](const std::string& kind, const json& data) {
                                     json d = data;
                                     d["run"] = runId;
                                     audit.record(kind, environment, owner, std::move(d));
                                   });
  manager::EnvironmentService& environments = environments_;
  entry->run->start([&environments, environment, owner, keep](const agent::RunStatus&) {
    if (!keep) (void)environments.destroy(environment, "its agent run ended", owner);
  });
  agentRuns_.add(entry);
  return respond(201, agentJson(*entry));
}

HttpResponse Api::listAgents(const Principal& principal) {
  json runs = json::array();
  for (const auto& entry : agentRuns_.list(principal.master ? "" : principal.keyId)) runs.push_back(agentJson(*entry));
  return respond(200, {{"agents", runs}});
}

HttpResponse Api::getAgent(const Principal& principal, const std::string& id) {
  auto entry = visibleRun(principal, id);
  if (!entry) return errorResponse({404, "not_found", "no agent run " + id, ""});
  return respond(200, agentJson(*entry));
}

HttpResponse Api::stopAgent(const Principal& principal, const std::string& id) {
  auto entry = visibleRun(principal, id);
  if (!entry) return errorResponse({404, "not_found", "no agent run " + id, ""});
  entry->run->stop("stopped by " + principal.owner());
  return respond(200, agentJson(*entry));
}

HttpResponse Api::agentTranscript(const HttpRequest& req, const Principal& principal, const std::string& id) {
  uint64_t after = 0, waitS = 0;
  for (const auto& [k, v] : req.queryAll) {
    if (k != "after" && k != "wait") return errorResponse({400, "unknown_field", "unknown query parameter " + k, k});
    uint64_t& out = k == "after" ? after : waitS;
    const uint64_t max = k == "after" ? UINT32_MAX : 60;
    if (v.empty() || v.size() > 10 || v.find_first_not_of("0123456789") != std::string::npos || std::stoull(v) > max) {
      return errorResponse(invalid(k, "a whole number from 0 to " + std::to_string(max)));
    }
    out = std::stoull(v);
  }
  auto entry = visibleRun(principal, id);
  if (!entry) return errorResponse({404, "not_found", "no agent run " + id, ""});
  json steps = json::array();
  for (const auto& s : entry->run->stepsAfter(after, std::chrono::seconds(waitS))) {
    json step = s.data;
    step["seq"] = s.seq;
    step["at"] = timestamp(s.atMs);
    step["kind"] = s.kind;
    steps.push_back(std::move(step));
  }
  json j = {{"id", id}, {"steps", steps}};
  std::string streaming = entry->run->streaming();
  if (!streaming.empty()) j["streaming"] = streaming;
  return respond(200, j);
}

void Api::stopAgentRuns() { agentRuns_.stopAll("moatd is stopping"); }

void Api::endOrphanedAgentEnvironments() {
  store::EnvironmentFilter filter;
  filter.labels[kAgentLabel] = kAgentLabelValue;
  auto orphans = environments_.list(filter);
  if (!orphans.ok()) return;
  for (const auto& e : orphans.value()) {
    if (e.state != store::EnvironmentState::kRunning && e.state != store::EnvironmentState::kPaused) continue;
    (void)environments_.destroy(e.id, "its agent run ended with the moatd that ran it", "moatd");
  }
}

}  // namespace moat::api
