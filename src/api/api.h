#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/agent_runs.h"
#include "api/board_sessions.h"
#include "api/http.h"
#include "api/key_admission.h"
#include "api/keys.h"
#include "api/mcp_sessions.h"
#include "api/metrics.h"
#include "api/port_proxy.h"
#include "api/previews.h"
#include "api/rate_limit.h"
#include "api/routes.h"
#include "api/validation.h"
#include "audit/log.h"
#include "gate/approvals.h"
#include "manager/environment_manager.h"

namespace moat::templates {
class Catalog;
struct Built;
}  // namespace moat::templates

namespace moat::api {

// The REST API of moatd (docs/API.md, api/openapi.yaml): authentication,
// request validation (unknown fields and out-of-range values are errors that
// name the field), and a typed call into the environment manager.
struct ApiOptions {
  std::string stateDir;
  bool accessLog = false;  // a log line per request (moatd --access-log)
  // Whether this host runs microVM environments, and on what ("kvm" or
  // "tcg"): shown by /healthz.
  bool microvmAvailable = false;
  std::string microvmAccel;
  std::string microvmAccelWhy;  // what chose it (/healthz)
  // How long a request whose action needs a person's approval waits.
  int64_t approvalTimeoutMs = 120000;
  // Requests one API key may have in progress at once (from its headers
  // until its answer, or its stream, ends); one more is 429 `capacity`.
  // Half of moatd's connections: a flooding key leaves the rest to others.
  // The master token is not counted.
  size_t maxRequestsPerKey = 256;
  // Requests per second one API key may send (bursts of twice that); more
  // wait their turn, up to 2 s, and beyond are 429 `capacity` with a
  // Retry-After (moatd --key-rate; 0: no limit). The master token is not
  // limited.
  double keyRequestsPerSecond = 200;
  // API keys' agent runs may call providers on moatd's own host and
  // networks (otherwise only the master token's may: a key could make
  // moatd POST to services only moatd reaches).
  bool agentLocalProviders = false;
  // Tokens one API key's agent runs may use per UTC day, in all (moatd
  // --agent-key-tokens; 0: no limit). The master token is not limited.
  uint64_t agentKeyTokensPerDay = 0;
  // Where the board's page and assets are (docs/BOARD.md); empty: no board.
  std::string boardDir;
  // Preview URLs are http://<secret>.<previewDomain>:<port>/ (docs/PORTS.md;
  // moatd --preview-domain). A request whose Host is under it never reaches
  // the API.
  std::string previewDomain = "preview.localhost";
  // The port proxy's deadlines (moatd --port-timeout sets idle).
  PortProxyLimits portLimits;
  // Proxied connections (port requests and previews, each held until its
  // answer or WebSocket ends) open at once: in all, and per owner (the
  // caller of a port request, the maker of a preview). moatd sets half and a
  // quarter of --max-connections: proxied traffic, which a preview URL lets
  // anyone send, never takes the places the API itself needs.
  size_t maxPortConnections = 256;
  size_t maxPortConnectionsPerOwner = 128;
};

// What a request made with the board's session cookie acts as: the
// session's token, or why it is refused (an unknown session, a missing CSRF
// header, a foreign Origin or Host). Neither without a cookie.
struct BoardCredentials {
  bool viaSession = false;
  std::string token;
  std::optional<ApiError> refusal;
};

// An environment as the API shows it.
nlohmann::json environmentJson(const store::EnvironmentRecord& record);

// What an environment's own doing makes the log record (audit::EnvironmentShare):
// the gate's refusals, and its programs' starts when the gate judges them.
constexpr audit::Pace kEnvironmentGateEvents{20, 100};
constexpr audit::Pace kEnvironmentProgramEvents{50, 200};
// Questions to a person on an environment's own behalf waiting at once, and
// its programs waiting for one (each on a thread).
constexpr size_t kPendingQuestionsPerEnvironment = 16;
constexpr size_t kExecAsksInFlight = 64;
// The labels of an agent run's environment: {kAgentRunLabel: run id}, and
// {kAgentLabel: kAgentLabelValue} unless it is kept after the run (moatd
// destroys those left running at its next start).
inline constexpr const char* kAgentLabel = "moat-agent";
inline constexpr const char* kAgentLabelValue = "moatd";
inline constexpr const char* kAgentRunLabel = "moat-agent-run";

class Api {
 public:
  // `audit`: where events are recorded and read from (none: nothing is
  // recorded and the audit endpoints answer 404).
  Api(manager::EnvironmentManager& manager, Keys& keys, gate::ApprovalCenter& approvals, std::string masterToken,
      ApiOptions options = {}, audit::Log* audit = nullptr);
  ~Api();  // ends the MCP sessions while everything they call still exists
  HttpResponse handle(const HttpRequest& request);
  // Named templates (docs/TEMPLATES.md); set before serving.
  void setTemplates(templates::Catalog* catalog) { templates_ = catalog; }
  // Before the body: unauthenticated requests are refused unread, and the
  // body limit is 16 MiB for file writes, 1 MiB for everything else.
  Preflight preflight(const HttpRequest& head);
  // What preflight() decides (it logs a refusal when asked to).
  Preflight admit(const HttpRequest& head);
  // network.cc: the gate's say on a destination off an environment's
  // allowlist (asks a person and waits when the permission is "ask"), and
  // whether it would ask, for the egress controller.
  // listed: the policy allows the destination (only the creating key's
  // ceiling can still refuse it or ask).
  egress::GateAnswer networkGate(const std::string& id, const std::string& host, uint16_t port, bool listed);
  // What the resolver may do with a name, without waiting (listed: the
  // policy allows it; only the creating key's ceiling still counts).
  egress::GateProbeAnswer networkProbe(const std::string& id, const std::string& host, bool listed);
  // environment_gate.cc: the exec gate (manager::EnvironmentManager::setExecGate):
  // whether an environment's programs need judging, and the judgment of one
  // (answered at once, or from a thread of its own once a person decides).
  init::ExecPolicy execPolicyFor(const std::string& id);
  void execCheck(const std::string& id, const init::ExecCheck& check, manager::InitConnection::ExecAnswer answer);
  // What moat-init judged by itself (init::ExecPolicy::kLocal): into the log.
  void execReport(const std::string& id, const init::ExecReport& report);
  // At stop, after the approvals shut down: the exec questions' threads end.
  void waitForExecAsks();
  // mcp.cc: ends every MCP session (their default environments go). At stop.
  void closeMcpSessions();
  // mcp.cc: at start, before serving: destroys the default environments of
  // the MCP sessions a previous moatd held (it was killed; they ended with it).
  void endOrphanedMcpEnvironments();
  // At start: environments of template builds a previous moatd left are
  // destroyed, and snapshots of templates no ready template names deleted.
  void endOrphanedTemplateBuilds();
  // Agent runs (docs/AGENTS.md): all end (stopped) at moatd's stop; at its
  // start, the environments of runs a previous moatd ran are destroyed.
  void stopAgentRuns();
  void endOrphanedAgentEnvironments();
  // An environment ended (manager::EnvironmentManager::onEnded): an agent
  // run in it stops.
  void agentEnvironmentEnded(const std::string& id, const std::string& reason) {
    agentRuns_.environmentEnded(id, reason);
  }
  // ports.cc: an environment ended: its previews are revoked.
  void portsEnvironmentEnded(const std::string& id);
  // The TCP port moatd serves on, for preview URLs (0: the Host header's).
  void setPreviewPort(int port) { previewPort_ = port; }
  // At stop: requests waiting for their turn under the key rate limit are
  // answered 503 at once, and none waits from now on.
  void stopWaiting();
  // A connection the HTTP server turned away (503): counted in /metrics
  // with the errors the handlers answer.
  void countRefusedConnection() { countError("unavailable"); }
  // Every endpoint, in api/openapi.yaml's order (api/routes.h).
  static const std::vector<Route>& routes();

 private:
  // The route table's verdict (404, 405, 403, a key's foreign environment,
  // an unexpected query), or the handler's answer.
  HttpResponse route(const HttpRequest& request, const Principal& principal);
  // environments.cc: /v1/environments and /v1/environments/{id}.
  HttpResponse listEnvironments(const HttpRequest& request, const Principal& principal);
  HttpResponse createEnvironment(const HttpRequest& request, const Principal& principal);
  HttpResponse getEnvironment(const std::string& id);
  HttpResponse destroyEnvironment(const Principal& principal, const std::string& id);
  HttpResponse environmentStats(const std::string& id);
  HttpResponse setEnvironmentTimeout(const HttpRequest& request, const Principal& principal, const std::string& id);
  // POST .../pause (pause true) and .../resume.
  HttpResponse pauseEnvironment(const HttpRequest& request, const Principal& principal, const std::string& id,
                                bool pause);
  HttpResponse keysRoute(const HttpRequest& request, const Principal& principal);
  // One file per resource: exec.cc, files.cc, processes.cc, shell.cc, events.cc.
  // The command of a request that sends no `cmd`: the environment's image's
  // Entrypoint then Cmd (docs/TEMPLATES.md); an error naming `cmd` when it has none.
  std::optional<ApiError> imageCommand(const std::string& id, std::vector<std::string>& argv);
  HttpResponse execRoute(const HttpRequest& request, const Principal& principal, const std::string& id);
  HttpResponse filesRoute(const HttpRequest& request, const Principal& principal, const std::string& id,
                          const std::string& sub);
  HttpResponse processesRoute(const HttpRequest& request, const Principal& principal, const std::string& id);
  HttpResponse shellRoute(const HttpRequest& request, const Principal& principal, const std::string& id);
  // gate.cc: permissions and approvals.
  HttpResponse permissionsRoute(const HttpRequest& request, const Principal& principal, const std::string& id);
  HttpResponse approvalsRoute(const HttpRequest& request, const Principal& principal);
  // network.cc: an environment's network policy.
  HttpResponse networkRoute(const HttpRequest& request, const Principal& principal, const std::string& id);
  // snapshots.cc: /v1/snapshots, and an environment's snapshots, restore and fork.
  HttpResponse snapshotsRoute(const HttpRequest& request, const Principal& principal);
  HttpResponse templatesRoute(const HttpRequest& request, const Principal& principal, const std::string& name);
  // template_build.cc: a template from a recipe, built on the catalog's thread.
  struct BuildRecipe {
    std::string base;
    std::vector<std::string> run;
    std::map<std::string, std::string> env;
  };
  static constexpr const char* kTemplateBuildLabel = "moat.template_build";  // on a build's environment
  HttpResponse startTemplateBuild(const HttpRequest& request, const Principal& principal, const json& body);
  Result<templates::Built> runTemplateBuild(const HttpRequest& request, const Principal& principal,
                                            const std::string& name, const BuildRecipe& recipe,
                                            const std::function<void(const std::string&)>& progress,
                                            const std::function<bool()>& stopping);
  HttpResponse environmentSnapshotsRoute(const HttpRequest& request, const Principal& principal, const std::string& id,
                                         const std::string& sub);
  // GET /v1/environments/{id}/changes: against its template or a snapshot.
  HttpResponse changesRoute(const HttpRequest& request, const Principal& principal, const std::string& id);
  // A ready snapshot the caller may use (a key: only its own); not_found otherwise.
  Result<store::SnapshotRecord> visibleSnapshot(const Principal& principal, const std::string& id);
  // The create request's "network" and "secrets".
  std::optional<ApiError> parseNetwork(const json& body, manager::CreateRequest& create);
  // The gate before a side effect: nothing when it may happen; otherwise the
  // answer (403 denied_by_policy, or 202 while a person decides).
  std::optional<HttpResponse> check(const HttpRequest& request, const Principal& principal, const std::string& id,
                                    const gate::Action& action);
  Result<gate::Permissions> parsePermissions(const json& j, const gate::Permissions& base, ApiError& error);
  HttpResponse eventsRoute(const HttpRequest& request, const Principal& principal);
  HttpResponse verifyRoute(const HttpRequest& request, const Principal& principal);
  // A refused token (401), for the audit log.
  void recordAuthFailure(const HttpRequest& request, const std::string& token, const std::string& why);
  // network.cc: what a network action of the environment's own gets: with
  // the ceiling of the key that created it (none for the master's); listed
  // (the policy allows it): from that ceiling alone.
  Result<gate::Evaluation> networkEvaluation(const std::string& id, const gate::Action& action, bool listed);
  // A question to a person for the environment's own doing (a connection, a
  // program): one waiting question per action, at most
  // kPendingQuestionsPerEnvironment at once. Blocks until decided.
  egress::GateAnswer askForEnvironment(const std::string& id, const gate::Action& action, const char* scope);
  HttpResponse mcpRoute(const HttpRequest& request, const Principal& principal);
  // ports.cc: /v1/environments/{id}/ports/{port}/..., previews, and a
  // request to a preview host (no token: the URL's secret is the grant).
  HttpResponse portsRoute(const HttpRequest& request, const Principal& principal, const std::string& id,
                          const std::string& port);
  HttpResponse previewsRoute(const HttpRequest& request, const Principal& principal, const std::string& id,
                             const std::string& previewId);
  HttpResponse previewRequest(const HttpRequest& request, const std::string& secret);
  // `actor`: whom the audit names ("" for a preview's visitor); `owner`:
  // whose proxied connections it counts among (the preview's maker).
  HttpResponse proxyToPort(const HttpRequest& request, const std::string& id, const PortForward& forward,
                           const std::string& actor, const std::string& owner, const std::string& previewId);
  std::string previewUrl(const std::string& secret, const HttpRequest& request) const;
  // Whether an Authorization value holds moatd's master token or an API
  // key's token in any form (any scheme or case, Basic's user or password).
  bool carriesMoatCredential(const std::string& authorization) const;
  // A place among the proxied connections: moatd's, the owner's and the
  // environment's (a refusal: 429 naming which is full).
  struct PortAdmission {
    std::shared_ptr<void> hold;
    std::optional<ApiError> refusal;
  };
  PortAdmission admitPortConnection(const std::string& id, const std::string& owner, bool viaPreview);
  HttpResponse createAgent(const HttpRequest& request, const Principal& principal);
  HttpResponse listAgents(const Principal& principal);
  HttpResponse getAgent(const Principal& principal, const std::string& id);
  HttpResponse stopAgent(const Principal& principal, const std::string& id);
  HttpResponse agentTranscript(const HttpRequest& request, const Principal& principal, const std::string& id);
  nlohmann::json agentJson(const AgentRunEntry& entry);
  // The run, if the caller may see it (a key: its own).
  std::shared_ptr<AgentRunEntry> visibleRun(const Principal& principal, const std::string& id);
  // Host and Origin must be local (DNS rebinding); before authentication.
  std::optional<HttpResponse> mcpGuard(const HttpRequest& head);
  HttpResponse metrics(const Principal& principal);
  void countError(const std::string& code);
  // board.cc: the board's page, assets and sign-in (/, /board/*, /ui/session),
  // answered without a token; and what a request with its cookie acts as.
  static bool isBoardPath(const std::string& path);
  HttpResponse boardRoute(const HttpRequest& request);
  HttpResponse boardAsset(const HttpRequest& request);
  HttpResponse uiSession(const HttpRequest& request);
  std::optional<ApiError> boardGuard(const HttpRequest& request);
  BoardCredentials sessionCredentials(const HttpRequest& request);
  // The master token's or an active key's principal; none for anything else.
  std::optional<Principal> principalOf(const std::string& token);
  // environments.cc: GET /v1/stats, every running environment's use, once
  // or (follow=1) as a stream of readings.
  HttpResponse fleetStatsRoute(const HttpRequest& request, const Principal& principal);
  HttpResponse fleetStats(const Principal& principal);
  // The running environments `principal` sees (a key: its own) with what
  // each uses now, the first `max` of them; one that ended while it was read
  // is left out. `beyond`: how many more ran.
  struct RunningUsage {
    store::EnvironmentRecord record;
    backend::Usage usage;
  };
  Result<std::vector<RunningUsage>> runningUsages(const Principal& principal, size_t max, size_t& beyond);

  // The manager, as the narrow services the handlers use (manager/services.h).
  manager::EnvironmentService& environments_;
  manager::CommandService& commands_;
  manager::PermissionService& permissionLayers_;
  manager::NetworkService& networks_;
  manager::SnapshotService& snapshots_;
  Keys& keys_;
  gate::ApprovalCenter& approvals_;
  std::string masterToken_;
  ApiOptions options_;
  audit::Log* log_;
  audit::Recorder& audit_;
  templates::Catalog* templates_ =
      nullptr;  // none: /v1/templates answers 503  // log_, or a recorder that drops everything
  std::mutex execAsksMutex_;
  std::condition_variable execAsksCv_;
  std::map<std::string, size_t> execAsks_;  // exec questions waiting, per environment
  size_t execAsksTotal_ = 0;
  ApiMetrics metrics_;
  KeyAdmission admission_;  // after metrics_, which it counts waiters in
  BoardSessions boardSessions_;
  // ports.cc: previews, and the proxied connections open per environment.
  static constexpr size_t kPortConnectionsPerEnvironment = 64;
  Previews previews_;
  std::atomic<int> previewPort_{0};
  std::mutex portConnectionsMutex_;
  std::map<std::string, size_t> portConnections_;         // per environment
  std::map<std::string, size_t> portConnectionsByOwner_;  // per owner
  size_t portConnectionsTotal_ = 0;
  // Set by stopWaiting(): streams that wait between their frames end.
  std::mutex streamsMutex_;
  std::condition_variable streamsCv_;
  bool streamsStopping_ = false;
  // mcp.cc: Streamable HTTP at /mcp (docs/MCP.md). Near the end: gone
  // early, while everything a closing session calls still exists.
  McpSessions mcpSessions_;
  // agents.cc: agent runs (docs/AGENTS.md). Last: stopped first; their
  // tools call this API.
  AgentRuns agentRuns_;
};

}  // namespace moat::api
