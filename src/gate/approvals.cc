#include "gate/approvals.h"

#include "common/clock.h"
#include "common/hex.h"

namespace moat::gate {
namespace {

using json = nlohmann::json;

int64_t now() { return moat::nowMs(); }

}  // namespace

Result<Action> actionFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Error::make(Code::kStore, "an approval's action is not a JSON object");
  Action a;
  std::string scope = j.value("scope", "");
  if (scope == "read_file")
    a.scope = Scope::kReadFile;
  else if (scope == "write_file")
    a.scope = Scope::kWriteFile;
  else if (scope == "run_command")
    a.scope = Scope::kRunCommand;
  else if (scope == "network")
    a.scope = Scope::kNetwork;
  else
    return Error::make(Code::kStore, "an approval's action has an unknown scope");
  if (j.contains("argv") && j["argv"].is_array()) {
    for (const auto& arg : j["argv"]) {
      if (arg.is_string()) a.argv.push_back(arg);
    }
  }
  a.path = j.value("path", "");
  a.host = j.value("host", "");
  a.port = static_cast<uint16_t>(j.value("port", 0));
  a.size = j.value("size", static_cast<uint64_t>(0));
  a.op = j.value("op", "");
  a.tree = j.value("tree", false);
  a.sha256 = j.value("sha256", "");
  a.program = j.value("program", "");
  if (j.contains("parents") && j["parents"].is_array()) {
    for (const auto& p : j["parents"]) {
      if (p.is_string()) a.parents.push_back(p);
    }
  }
  if (j.contains("env") && j["env"].is_object()) {
    for (auto it = j["env"].begin(); it != j["env"].end(); ++it) {
      if (it.value().is_string()) a.env[it.key()] = it.value();
    }
  }
  return a;
}

Status ApprovalCenter::recover() {
  return store_.expirePendingApprovals("moatd restarted while it was pending; ask again", now());
}

Result<store::ApprovalRecord> ApprovalCenter::request(const std::string& environment, const Action& action,
                                                      const std::string& requester) {
  store::ApprovalRecord a;
  MOAT_ASSIGN(a.id, randomHex(6));
  a.environment = environment;
  a.scope = scopeName(action.scope);
  // A file path is bytes (a query parameter may carry any): bytes that are
  // not UTF-8 are shown, and stored, as U+FFFD instead of failing the request
  // with an exception (found by fuzz/permissions.cc). Such an approval still
  // answers the request that waits on it; a grant or a remembered rule made
  // from it names the replaced path, matches nothing, and the gate asks again.
  a.action = action.toJson().dump(-1, ' ', false, json::error_handler_t::replace);
  a.requester = requester;
  a.createdAtMs = now();
  a.state = store::ApprovalState::kPending;
  MOAT_TRY(store_.insertApproval(a));
  return a;
}

Result<store::ApprovalRecord> ApprovalCenter::watch(const std::string& id, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    auto record = store_.getApproval(id);
    if (!record.ok()) return record.error();
    if (!record.value()) return Error::make(Code::kNotFound, "no approval " + id);
    if (record.value()->state != store::ApprovalState::kPending || stopping_) return *record.value();
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      auto last = store_.getApproval(id);
      if (!last.ok()) return last.error();
      return *last.value();
    }
  }
}

Result<store::ApprovalRecord> ApprovalCenter::await(const std::string& id, std::chrono::milliseconds timeout) {
  MOAT_ASSIGN(auto record, watch(id, timeout));
  if (record.state != store::ApprovalState::kPending) return record;
  std::string why = "no decision within " + std::to_string(timeout.count() / 1000) + " s";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) why = "moatd is stopping";
  }
  auto expired = finish(id, store::ApprovalState::kExpired, "moatd", why, false);
  if (expired.ok()) return expired;
  // Decided at the last moment: that decision stands.
  auto current = store_.getApproval(id);
  if (!current.ok()) return current.error();
  return *current.value();
}

Result<store::ApprovalRecord> ApprovalCenter::finish(const std::string& id, store::ApprovalState state,
                                                     const std::string& by, const std::string& reason, bool remember) {
  std::lock_guard<std::mutex> lock(mutex_);
  MOAT_ASSIGN(auto found, store_.getApproval(id));
  if (!found) return Error::make(Code::kNotFound, "no approval " + id);
  store::ApprovalRecord a = *found;
  if (a.state != store::ApprovalState::kPending) {
    return Error::make(Code::kConflict, "approval " + id + " is already " + store::stateName(a.state) +
                                            (a.decidedBy.empty() ? "" : " (by " + a.decidedBy + ")"));
  }
  a.state = state;
  a.decidedBy = by;
  a.reason = reason;
  a.decidedAtMs = now();
  a.remember = remember;
  MOAT_TRY(store_.updateApproval(a));
  cv_.notify_all();
  return a;
}

Result<store::ApprovalRecord> ApprovalCenter::decide(const std::string& id, bool approve, const std::string& decidedBy,
                                                     const std::string& reason, bool remember) {
  return finish(id, approve ? store::ApprovalState::kApproved : store::ApprovalState::kDenied, decidedBy, reason,
                remember);
}

void ApprovalCenter::markUsed(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = store_.getApproval(id);
  if (!found.ok() || !found.value()) return;
  store::ApprovalRecord a = *found.value();
  a.used = true;
  (void)store_.updateApproval(a);
}

bool ApprovalCenter::consumeGrant(const std::string& environment, const Action& action, const std::string& requester) {
  std::lock_guard<std::mutex> lock(mutex_);
  store::ApprovalFilter filter;
  filter.state = store::ApprovalState::kApproved;
  filter.environment = environment;
  auto approved = store_.listApprovals(filter);
  if (!approved.ok()) return false;
  int64_t oldest = now() - kGrantLifetimeMs;
  for (auto& a : approved.value()) {
    if (a.used || a.requester != requester || a.decidedAtMs < oldest) continue;
    auto granted = actionFromJson(a.action);
    if (!granted.ok() || !granted->same(action)) continue;
    a.used = true;
    return store_.updateApproval(a).ok();
  }
  return false;
}

void ApprovalCenter::closeEnvironment(const std::string& environment, const std::string& reason) {
  store::ApprovalFilter filter;
  filter.state = store::ApprovalState::kPending;
  filter.environment = environment;
  auto pending = store_.listApprovals(filter);
  if (!pending.ok()) return;
  for (const auto& a : pending.value()) (void)finish(a.id, store::ApprovalState::kExpired, "moatd", reason, false);
}

void ApprovalCenter::shutdown() {
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = true;
  cv_.notify_all();
}

}  // namespace moat::gate
