#include <arpa/inet.h>

#include <mutex>
#include <optional>

#include "api/api.h"
#include "api/validation.h"

// Egress in the API (docs/EGRESS.md): an environment's network policy and
// secrets, and the gate's part in egress decisions.
namespace moat::api {
namespace {

// Policy::parse and parseSecrets name the field: "<field>: <problem>".
ApiError fieldError(const Error& e) {
  return {400, "invalid_request", e.context, e.context.substr(0, e.context.find(": "))};
}

json networkJson(const egress::Policy& policy, const store::EnvironmentRecord& record) {
  json j = {{"network", policy.toJson()}};
  if (record.netSlot >= 0) {
    auto link = egress::EgressNetwork::linkFor(static_cast<uint32_t>(record.netSlot));
    std::string gateway = egress::formatIpv4(ntohl(link.gateway));
    j["link"] = json{{"address", egress::formatIpv4(ntohl(link.address))},
                     {"gateway", gateway},
                     {"proxy", "http://" + gateway + ":" + std::to_string(egress::kProxyPort)}};
  }
  return j;
}

}  // namespace

std::optional<ApiError> Api::parseNetwork(const json& body, manager::CreateRequest& create) {
  if (body.contains("network")) {
    auto policy = egress::Policy::parse(body["network"]);
    if (!policy.ok()) return fieldError(policy.error());
    create.network = policy.value();
  }
  if (body.contains("secrets")) {
    auto secrets = egress::parseSecrets(body["secrets"]);
    if (!secrets.ok()) return fieldError(secrets.error());
    for (const auto& s : secrets.value()) {
      if (create.env.count(s.name)) return invalid("secrets", "secret " + s.name + " is also in \"env\"");
    }
    create.secrets = secrets.value();
  }
  return std::nullopt;
}

HttpResponse Api::networkRoute(const HttpRequest& req, const Principal& principal, const std::string& id) {
  if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  if (req.method == "GET") {
    auto policy = networks_.network(id);
    if (!policy.ok()) return errorResponse(fromError(policy.error()));
    auto record = environments_.get(id);
    if (!record.ok()) return errorResponse(fromError(record.error()));
    return respond(200, networkJson(policy.value(), record.value()));
  }
  // A new policy can open the network: like replacing permissions.
  if (!principal.may("permissions")) {
    return errorResponse({403, "forbidden",
                          "changing the network policy can loosen it: it needs the master token or the "
                          "'permissions' scope",
                          ""});
  }
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  if (auto e = onlyFields(body.value(), {"network"}, "")) return errorResponse(*e);
  if (!body->contains("network")) return errorResponse(invalid("network", "required"));
  auto policy = egress::Policy::parse((*body)["network"]);
  if (!policy.ok()) return errorResponse(fieldError(policy.error()));
  Status s = networks_.setNetwork(id, policy.value());
  if (!s.ok()) return errorResponse(fromError(s.error()));
  audit_.record("network.changed", id, principal.owner(), {{"network", policy->toJson()}});
  auto record = environments_.get(id);
  if (!record.ok()) return errorResponse(fromError(record.error()));
  return respond(200, networkJson(policy.value(), record.value()));
}

Result<gate::Evaluation> Api::networkEvaluation(const std::string& id, const gate::Action& action, bool listed) {
  // An environment's own connections answer to the ceiling of the key that
  // created it, listed destinations too: the policy it was created with
  // cannot take it past that (docs/GATE.md, "Key ceilings").
  std::string owner = environments_.ownerOf(id);
  std::shared_ptr<const gate::Permissions> ceiling;
  if (!owner.empty() && owner != "master") {
    auto read = keys_.ceilingOf(owner);
    if (!read.ok()) {
      return Error::make(read.error().code,
                         "the ceiling of the key that created it cannot be read: " + read.error().message());
    }
    ceiling = read.value();
  }
  if (!listed) return permissionLayers_.evaluate(id, action, ceiling.get());
  if (!ceiling) return gate::Evaluation{gate::Decision::kAllow, 0, -1, nullptr};  // the policy's word stands
  auto v = ceiling->evaluate(action);
  return gate::Evaluation{v.decision, -1, v.rule, v.ruleJson};
}

egress::GateAnswer Api::networkGate(const std::string& id, const std::string& host, uint16_t port, bool listed) {
  gate::Action action;
  action.scope = gate::Scope::kNetwork;
  action.host = host;
  action.port = port;
  action.op = "connect";
  auto evaluation = networkEvaluation(id, action, listed);
  if (!evaluation.ok()) return {false, evaluation.error().message()};
  const gate::Evaluation& e = evaluation.value();
  const std::string who =
      e.layer < 0 ? "the ceiling of the API key that created the environment" : "the network permission";
  if (e.decision == gate::Decision::kAllow) return {true, listed ? "on the allowlist" : "allowed by " + who};
  if (e.decision == gate::Decision::kDeny) {
    // The environment asks this at will (a connection each): paced, within
    // its share of the log.
    audit_.recordByEnvironment("gate.denied", id,
                               {{"action", action.toJson()}, {"rule", e.ruleJson}, {"layer", e.layer}},
                               kEnvironmentGateEvents);
    return {false, who + " denies it"};
  }
  return askForEnvironment(id, action, "network");
}

egress::GateProbeAnswer Api::networkProbe(const std::string& id, const std::string& host, bool listed) {
  gate::Action action;
  action.scope = gate::Scope::kNetwork;
  action.host = host;
  auto evaluation = networkEvaluation(id, action, listed);
  if (!evaluation.ok()) return egress::GateProbeAnswer::kDeny;
  const gate::Decision decision = evaluation->decision;
  return decision == gate::Decision::kAllow ? egress::GateProbeAnswer::kAllow
         : decision == gate::Decision::kAsk ? egress::GateProbeAnswer::kAsk
                                            : egress::GateProbeAnswer::kDeny;
}

}  // namespace moat::api
