#include <chrono>

#include "api/api.h"
#include "api/validation.h"

// The gate in the API: every side effect is checked against the
// environment's permissions before it happens (allow, ask, deny), and the
// endpoints for permissions and approvals (docs/GATE.md).
namespace moat::api {
namespace {

ApiError gateError(const Error& e) {
  // Permissions::parse names the field: "<field>: <problem>" or "unknown field <field> (...)".
  std::string field;
  if (e.code == Code::kUnknownField) {
    field = e.context.substr(std::string("unknown field ").size());
    field = field.substr(0, field.find(' '));
  } else {
    field = e.context.substr(0, e.context.find(": "));
  }
  return {400, e.code == Code::kUnknownField ? "unknown_field" : "invalid_request", e.context, field};
}

json approvalJson(const store::ApprovalRecord& a) {
  json action = json::parse(a.action, nullptr, false);
  json j = {{"id", a.id},
            {"environment", a.environment},
            {"scope", a.scope},
            {"action", action.is_discarded() ? json(a.action) : action},
            {"requester", a.requester},
            {"created_at", timestamp(a.createdAtMs)},
            {"state", store::stateName(a.state)}};
  if (a.state != store::ApprovalState::kPending) {
    j["decided_by"] = a.decidedBy;
    j["decided_at"] = timestamp(a.decidedAtMs);
    j["reason"] = a.reason;
    j["remember"] = a.remember;
  }
  return j;
}

HttpResponse denied(const gate::Action& action, const std::string& message, const json& rule,
                    const std::string& approval = "") {
  json err = {{"code", "denied_by_policy"},
              {"message", message},
              {"scope", gate::scopeName(action.scope)},
              {"action", action.toJson()}};
  if (!rule.is_null()) err["rule"] = rule;
  if (!approval.empty()) err["approval"] = approval;
  return respond(403, {{"error", err}});
}

std::string describe(const gate::Evaluation& e) {
  std::string where = e.layer < 0    ? "the API key's ceiling"
                      : e.layer == 0 ? "the environment's permissions"
                                     : "permission layer " + std::to_string(e.layer);
  if (e.rule < 0) return "no rule of " + where + " matched (deny by default)";
  return "rule " + std::to_string(e.rule + 1) + " of " + where;
}

}  // namespace

Result<gate::Permissions> Api::parsePermissions(const json& j, const gate::Permissions& base, ApiError& error) {
  auto parsed = gate::Permissions::parse(j, base);
  if (!parsed.ok()) {
    error = gateError(parsed.error());
    return parsed.error();
  }
  return parsed.value();
}

std::optional<HttpResponse> Api::check(const HttpRequest& req, const Principal& principal, const std::string& id,
                                       const gate::Action& action) {
  auto evaluation = permissionLayers_.evaluate(id, action, principal.ceiling.get());
  if (!evaluation.ok()) return errorResponse(fromError(evaluation.error()));
  const gate::Evaluation& e = evaluation.value();
  if (e.decision == gate::Decision::kAllow) return std::nullopt;
  if (e.decision == gate::Decision::kDeny) {
    audit_.record("gate.denied", id, principal.owner(), {{"action", action.toJson()}, {"rule", e.ruleJson}});
    std::string loading;
    for (const auto& [k, v] : action.env) {
      if (gate::loadsCode(k)) loading += (loading.empty() ? "" : ", ") + k;
    }
    if (!loading.empty() && e.rule < 0) {
      loading =
          " (it sets " + loading + ", which makes programs load code: only a rule naming it in \"env\" allows that)";
    }
    return denied(action, std::string(gate::scopeName(action.scope)) + " denied by " + describe(e) + loading,
                  e.ruleJson);
  }
  // Ask: a person decides. An approval already granted for this very action
  // (to a caller that chose not to wait) is used up now.
  if (approvals_.consumeGrant(id, action, principal.owner())) return std::nullopt;
  auto approval = approvals_.request(id, action, principal.owner());
  if (!approval.ok()) return errorResponse(fromError(approval.error()));
  audit_.record("approval.requested", id, principal.owner(), approvalJson(approval.value()));
  if (req.prefer.find("respond-async") != std::string::npos) {
    HttpResponse r = respond(202, {{"approval", approvalJson(approval.value())},
                                   {"message", "waiting for a person's decision: follow GET /v1/approvals/" +
                                                   approval->id + "?wait=60, then repeat the request"}});
    r.headers = {{"Location", "/v1/approvals/" + approval->id}};
    return r;
  }
  auto decided = approvals_.await(approval->id, std::chrono::milliseconds(options_.approvalTimeoutMs));
  if (!decided.ok()) return errorResponse(fromError(decided.error()));
  const store::ApprovalRecord& a = decided.value();
  if (a.state == store::ApprovalState::kApproved) {
    approvals_.markUsed(a.id);  // this request was the one it was for
    return std::nullopt;
  }
  std::string why = a.state == store::ApprovalState::kDenied
                        ? "denied by " + a.decidedBy + (a.reason.empty() ? "" : ": " + a.reason)
                        : "approval expired: " + a.reason;
  return denied(action, std::string(gate::scopeName(action.scope)) + " asked a person (approval " + a.id + "); " + why,
                e.ruleJson, a.id);
}

HttpResponse Api::permissionsRoute(const HttpRequest& req, const Principal& principal, const std::string& id) {
  if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  if (req.method == "GET") {
    auto layers = permissionLayers_.permissions(id);
    if (!layers.ok()) return errorResponse(fromError(layers.error()));
    json out = {{"permissions", layers->front().toJson()}, {"layers", gate::layersToJson(layers.value())}};
    if (principal.ceiling) out["ceiling"] = principal.ceiling->toJson();
    return respond(200, out);
  }
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"permissions", "replace"}, "")) return errorResponse(*e);
  if (!j.contains("permissions")) return errorResponse(invalid("permissions", "required"));
  bool replace = false;
  if (j.contains("replace")) {
    if (!j["replace"].is_boolean()) return errorResponse(invalid("replace", "must be true or false"));
    replace = j["replace"];
  }
  // Replacing can loosen: only the master or a key trusted with it. Adding a
  // layer can only tighten, so the environment's owner may.
  if (replace && !principal.may("permissions")) {
    return errorResponse({403, "forbidden",
                          "replacing permissions can loosen them: it needs the master token "
                          "or the 'permissions' scope (without \"replace\", a layer is added, which only tightens)",
                          "replace"});
  }
  gate::Permissions base = replace ? environments_.config().defaultPermissions : gate::Permissions::allowAll();
  auto parsed = parsePermissions(j["permissions"], base, perr);
  if (!parsed.ok()) return errorResponse(perr);
  Status s = permissionLayers_.setPermissions(id, parsed.value(), replace);
  if (!s.ok()) return errorResponse(fromError(s.error()));
  audit_.record("policy.changed", id, principal.owner(), {{"permissions", parsed->toJson()}, {"replace", replace}});
  auto layers = permissionLayers_.permissions(id);
  if (!layers.ok()) return errorResponse(fromError(layers.error()));
  return respond(200, {{"permissions", layers->front().toJson()}, {"layers", gate::layersToJson(layers.value())}});
}

HttpResponse Api::approvalsRoute(const HttpRequest& req, const Principal& principal) {
  std::string id = pathSegment(req.path, 2);
  if (!principal.may("approve")) {
    // A key follows the approvals it asked for (a 202's Location), nothing
    // more: another's, or none, is the same 403.
    bool own = false;
    if (req.method == "GET" && !id.empty() && pathSegment(req.path, 3).empty()) {
      auto a = approvals_.get(id);
      own = a.ok() && a.value() && !principal.keyId.empty() && a.value()->requester == principal.keyId;
    }
    if (!own) {
      return errorResponse({403, "forbidden",
                            "approvals need the master token or the 'approve' scope (a key may follow the ones it "
                            "asked for)",
                            ""});
    }
  }
  if (!pathSegment(req.path, 3).empty()) return errorResponse({404, "not_found", "no such endpoint: " + req.path, ""});
  if (id.empty()) {
    if (auto e = onlyQuery(req, {"state", "environment"})) return errorResponse(*e);
    store::ApprovalFilter filter;
    if (auto it = req.query.find("state"); it != req.query.end()) {
      filter.state = store::approvalStateNamed(it->second);
      if (!filter.state) return errorResponse(invalid("state", "pending, approved, denied or expired"));
    }
    if (auto it = req.query.find("environment"); it != req.query.end()) filter.environment = it->second;
    auto list = approvals_.list(filter);
    if (!list.ok()) return errorResponse(fromError(list.error()));
    json arr = json::array();
    for (const auto& a : list.value()) arr.push_back(approvalJson(a));
    return respond(200, {{"approvals", arr}});
  }
  if (req.method == "GET") {
    if (auto e = onlyQuery(req, {"wait"})) return errorResponse(*e);
    uint64_t wait = 0;
    if (auto e = queryNumber(req, "wait", 300, 10, wait)) return errorResponse(*e);
    auto a = approvals_.watch(id, std::chrono::seconds(wait));
    if (!a.ok()) return errorResponse(fromError(a.error()));
    return respond(200, approvalJson(a.value()));
  }
  if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"decision", "reason", "remember"}, "")) return errorResponse(*e);
  if (!j.contains("decision") || !j["decision"].is_string() ||
      (j["decision"] != "approve" && j["decision"] != "deny")) {
    return errorResponse(invalid("decision", "required: \"approve\" or \"deny\""));
  }
  bool approve = j["decision"] == "approve";
  std::string reason;
  if (j.contains("reason")) {
    if (!j["reason"].is_string() || j["reason"].get<std::string>().size() > 1024) {
      return errorResponse(invalid("reason", "must be a string of at most 1024 bytes"));
    }
    reason = j["reason"];
  }
  bool remember = false;
  if (j.contains("remember")) {
    if (!j["remember"].is_boolean()) return errorResponse(invalid("remember", "must be true or false"));
    remember = j["remember"];
  }
  auto existing = approvals_.get(id);
  if (!existing.ok()) return errorResponse(fromError(existing.error()));
  if (!existing.value()) return errorResponse({404, "not_found", "no approval " + id, ""});
  // An agent must not wave its own requests through, nor those of the
  // programs it runs (its environments' connections ask as "environment").
  if (!principal.master && existing.value()->requester == principal.keyId) {
    return errorResponse({403, "forbidden", "a key cannot decide the approvals it asked for", ""});
  }
  if (!principal.master && environments_.ownerOf(existing.value()->environment) == principal.keyId) {
    return errorResponse({403, "forbidden", "a key cannot decide the approvals of the environments it created", ""});
  }
  auto decided = approvals_.decide(id, approve, principal.owner(), reason, remember);
  if (!decided.ok()) return errorResponse(fromError(decided.error()));
  audit_.record("approval.decided", decided->environment, principal.owner(), approvalJson(decided.value()));
  if (remember) {
    // The decision becomes a rule for exactly this action on that environment.
    auto action = gate::actionFromJson(decided->action);
    if (action.ok()) {
      gate::Rule rule;
      rule.decision = approve ? gate::Decision::kAllow : gate::Decision::kDeny;
      switch (action->scope) {
        case gate::Scope::kRunCommand: {
          std::vector<std::string> exact;
          // A program's argv as it was judged: the file it named first.
          auto judged = action->op == "program" ? judgedArgv(action->program, action->argv) : action->argv;
          for (const auto& a : judged) exact.push_back(gate::globEscape(a));
          rule.match = exact;
          // As narrow as what was shown: the code-loading variables it set.
          std::vector<std::string> loading;
          for (const auto& [k, v] : action->env) {
            if (gate::loadsCode(k)) loading.push_back(gate::globEscape(k));
          }
          if (!loading.empty()) rule.env = loading;
          break;
        }
        case gate::Scope::kReadFile:
        case gate::Scope::kWriteFile:
          rule.path = gate::globEscape(gate::normalizePath(action->path));
          // Of that one operation (a read, not a stat; a write, not a remove).
          if (!action->op.empty() && !action->tree) rule.op = action->op;
          break;
        case gate::Scope::kNetwork:
          rule.host = gate::globEscape(action->host);
          if (action->port) rule.port = action->port;
          break;
      }
      // An allow must hold in every layer that could have asked; a deny
      // needs only one.
      Status s = permissionLayers_.rememberRule(decided->environment, action->scope, rule, approve);
      if (!s.ok()) return errorResponse(fromError(s.error()));
    }
  }
  return respond(200, approvalJson(decided.value()));
}

}  // namespace moat::api
