#include <mutex>
#include <thread>

#include "api/api.h"
#include "api/validation.h"

// What the environment itself does and the gate decides: its programs'
// execs (the exec gate: moat-init hands each one over, docs/GATE.md "Every
// program") and, shared with egress, a question to a person on its behalf.
namespace moat::api {

egress::GateAnswer Api::askForEnvironment(const std::string& id, const gate::Action& action, const char* scope) {
  if (approvals_.consumeGrant(id, action, "environment")) return {true, "approved"};
  // The same question already waiting for a person (a client opening
  // several connections, a program retrying) is not asked again: this
  // connection waits for that answer, so that an environment cannot bury
  // the person in copies.
  std::optional<store::ApprovalRecord> waiting;
  size_t pendingFromEnvironment = 0;
  Result<store::ApprovalRecord> approval = Error::make(Code::kInternal, "no approval");
  {
    static std::mutex asking;  // one look-then-ask at a time
    std::lock_guard<std::mutex> lock(asking);
    store::ApprovalFilter filter;
    filter.state = store::ApprovalState::kPending;
    filter.environment = id;
    if (auto pending = approvals_.list(filter); pending.ok()) {
      for (const auto& a : pending.value()) {
        if (a.requester != "environment") continue;
        ++pendingFromEnvironment;
        auto asked = gate::actionFromJson(a.action);
        if (asked.ok() && asked->same(action)) waiting = a;
      }
    }
    // A person answers a few questions at a time: an environment asking
    // for host after host does not bury them (nor the store) in approvals.
    if (!waiting && pendingFromEnvironment >= kPendingQuestionsPerEnvironment) {
      audit_.recordByEnvironment(
          "gate.denied", id,
          {{"action", action.toJson()},
           {"reason", std::to_string(kPendingQuestionsPerEnvironment) + " of its questions already wait for a person"}},
          kEnvironmentGateEvents);
      return {false, std::to_string(kPendingQuestionsPerEnvironment) +
                         " of this environment's questions already wait for a person; ask again later"};
    }
    if (!waiting) approval = approvals_.request(id, action, "environment");
  }
  if (waiting) {
    auto decided = approvals_.watch(waiting->id, std::chrono::milliseconds(options_.approvalTimeoutMs));
    if (!decided.ok()) return {false, decided.error().message()};
    if (decided->state == store::ApprovalState::kApproved) {
      return {true, "approved by " + decided->decidedBy + " (approval " + decided->id + ")"};
    }
    return {false, decided->state == store::ApprovalState::kDenied
                       ? "a person denied it (approval " + decided->id + ")"
                       : "the approval was not decided (approval " + decided->id + ")"};
  }
  if (!approval.ok()) return {false, approval.error().message()};
  // Each one recorded: at most kPendingQuestionsPerEnvironment wait at once.
  audit_.record("approval.requested", id, "environment",
                {{"id", approval->id}, {"scope", scope}, {"action", action.toJson()}});
  auto decided = approvals_.await(approval->id, std::chrono::milliseconds(options_.approvalTimeoutMs));
  if (!decided.ok()) return {false, decided.error().message()};
  if (decided->state == store::ApprovalState::kApproved) {
    approvals_.markUsed(decided->id);
    return {true, "approved by " + decided->decidedBy + " (approval " + decided->id + ")"};
  }
  return {false, decided->state == store::ApprovalState::kDenied
                     ? "a person denied it (approval " + decided->id + ")"
                     : "the approval expired (approval " + decided->id + "): " + decided->reason};
}

init::ExecPolicy Api::execPolicyFor(const std::string& id) {
  // Every layer and the creator's ceiling a plain "allow" of every command:
  // moat-init lets programs run without judging them. Otherwise it judges
  // them by the same rules itself (asking here only about an "ask"): a
  // nested program sets no variables moatd judges, so a rule's "env" plays
  // no part there.
  init::ExecPolicy policy;
  auto layers = permissionLayers_.permissions(id);
  // Not an environment (yet: a warm one, its claimer unknown): moatd judges
  // what it runs, until it is claimed and told.
  if (!layers.ok()) {
    policy.mode = init::ExecPolicy::kAsk;
    return policy;
  }
  std::vector<const gate::Permissions*> all;
  for (const auto& layer : layers.value()) all.push_back(&layer);
  std::shared_ptr<const gate::Permissions> ceiling;
  std::string owner = environments_.ownerOf(id);
  if (!owner.empty() && owner != "master") {
    auto read = keys_.ceilingOf(owner);
    if (!read.ok()) {
      policy.mode = init::ExecPolicy::kAsk;  // judged here, which reads it again
      return policy;
    }
    ceiling = read.value();
    if (ceiling) all.push_back(ceiling.get());
  }
  bool plainAllow = true;
  for (const auto* p : all) {
    const auto& rules = p->scope(gate::Scope::kRunCommand).rules;
    plainAllow = plainAllow && rules.size() == 1 && !rules[0].match && !rules[0].env &&
                 rules[0].decision == gate::Decision::kAllow;
    std::vector<init::ExecRule> layer;
    for (const auto& r : rules) {
      init::ExecRule rule;
      rule.decision = static_cast<uint8_t>(r.decision);
      rule.hasMatch = r.match.has_value();
      if (r.match) rule.match = *r.match;
      layer.push_back(std::move(rule));
    }
    policy.layers.push_back(std::move(layer));
  }
  policy.mode = plainAllow ? init::ExecPolicy::kAllowAll : init::ExecPolicy::kLocal;
  bool fits = policy.layers.size() <= init::ExecPolicy::kMaxLayers;
  for (const auto& layer : policy.layers) fits = fits && layer.size() <= init::ExecPolicy::kMaxRules;
  // More than moat-init takes: every program is asked about, judged here.
  if (!fits) policy.mode = init::ExecPolicy::kAsk;
  if (policy.mode != init::ExecPolicy::kLocal) policy.layers.clear();
  return policy;
}

void Api::execReport(const std::string& id, const init::ExecReport& report) {
  gate::Action action;
  action.scope = gate::Scope::kRunCommand;
  action.op = "program";
  action.argv = report.argv;
  action.program = report.filename;
  action.parents = report.parents;
  if (report.decision == 0) {
    audit_.recordByEnvironment("program.started", id, {{"action", action.toJson()}, {"pid", report.pid}},
                               kEnvironmentProgramEvents);
  } else {
    audit_.recordByEnvironment("gate.denied", id, {{"action", action.toJson()}, {"pid", report.pid}},
                               kEnvironmentGateEvents);
  }
}

void Api::execCheck(const std::string& id, const init::ExecCheck& check, manager::InitConnection::ExecAnswer answer) {
  gate::Action action;
  action.scope = gate::Scope::kRunCommand;
  action.op = "program";
  action.argv = check.argv.empty() ? std::vector<std::string>{check.filename} : check.argv;
  action.program = check.filename;
  action.parents = check.parents;
  auto evaluation = networkEvaluation(id, action, false);
  if (!evaluation.ok() || evaluation->decision == gate::Decision::kDeny) {
    json data = {{"action", action.toJson()}, {"pid", check.pid}};
    if (evaluation.ok())
      data["rule"] = evaluation->ruleJson;
    else
      data["error"] = evaluation.error().message();
    audit_.recordByEnvironment("gate.denied", id, std::move(data), kEnvironmentGateEvents);
    return answer(false);
  }
  if (evaluation->decision == gate::Decision::kAllow) {
    audit_.recordByEnvironment("program.started", id, {{"action", action.toJson()}, {"pid", check.pid}},
                               kEnvironmentProgramEvents);
    return answer(true);
  }
  // Ask: a person decides, while the exec waits in the kernel. Not on the
  // connection's reader thread: each question waits on a thread of its own,
  // at most kPendingQuestionsPerEnvironment of them (askForEnvironment).
  {
    std::lock_guard<std::mutex> lock(execAsksMutex_);
    if (execAsks_[id] >= kExecAsksInFlight) {
      audit_.recordByEnvironment(
          "gate.denied", id,
          {{"action", action.toJson()}, {"reason", "too many of its programs already wait for a person"}},
          kEnvironmentGateEvents);
      return answer(false);
    }
    ++execAsks_[id];
    ++execAsksTotal_;
  }
  std::thread([this, id, action, pid = check.pid, answer = std::move(answer)] {
    egress::GateAnswer decided = askForEnvironment(id, action, "run_command");
    if (decided.allowed) {
      audit_.recordByEnvironment("program.started", id,
                                 {{"action", action.toJson()}, {"pid", pid}, {"reason", decided.why}},
                                 kEnvironmentProgramEvents);
    }
    answer(decided.allowed);
    std::lock_guard<std::mutex> lock(execAsksMutex_);
    if (--execAsks_[id] == 0) execAsks_.erase(id);
    --execAsksTotal_;
    execAsksCv_.notify_all();
  }).detach();
}

void Api::waitForExecAsks() {
  std::unique_lock<std::mutex> lock(execAsksMutex_);
  execAsksCv_.wait(lock, [&] { return execAsksTotal_ == 0; });
}

}  // namespace moat::api
