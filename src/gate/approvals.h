#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "gate/permissions.h"
#include "store/store.h"

// Approvals: an action whose verdict is "ask" waits for a person. Each one
// is a record in the store (pending -> approved | denied | expired), so a
// restart loses none; the requests waiting on them wait here.
namespace moat::gate {

class ApprovalCenter {
 public:
  explicit ApprovalCenter(store::Store& store) : store_(store) {}

  // At start: approvals a previous moatd left pending have nobody waiting
  // any more; they become expired, saying so.
  Status recover();
  Result<store::ApprovalRecord> request(const std::string& environment, const Action& action,
                                        const std::string& requester);
  // Blocks until a person decides or `timeout` passes; on timeout the
  // approval expires (the answer is then deny, and says so).
  Result<store::ApprovalRecord> await(const std::string& id, std::chrono::milliseconds timeout);
  // Like await, but only waits: the approval stays pending (long polling).
  Result<store::ApprovalRecord> watch(const std::string& id, std::chrono::milliseconds timeout);
  // "conflict" when it is no longer pending.
  Result<store::ApprovalRecord> decide(const std::string& id, bool approve, const std::string& decidedBy,
                                       const std::string& reason, bool remember);
  // An approved approval for exactly this action, asked by the same caller,
  // decided less than kGrantLifetime ago, that no request has used yet (the
  // asker chose not to wait): consumed by this call.
  bool consumeGrant(const std::string& environment, const Action& action, const std::string& requester);
  // The waiting request that asked for it goes ahead: the grant is used.
  void markUsed(const std::string& id);
  static constexpr int64_t kGrantLifetimeMs = 10 * 60 * 1000;
  Result<std::optional<store::ApprovalRecord>> get(const std::string& id) { return store_.getApproval(id); }
  Result<std::vector<store::ApprovalRecord>> list(const store::ApprovalFilter& filter) {
    return store_.listApprovals(filter);
  }
  // The environment is gone: its pending approvals expire with `reason`.
  void closeEnvironment(const std::string& environment, const std::string& reason);
  // moatd stops: every waiter returns now.
  void shutdown();

 private:
  Result<store::ApprovalRecord> finish(const std::string& id, store::ApprovalState state, const std::string& by,
                                       const std::string& reason, bool remember);

  store::Store& store_;
  std::mutex mutex_;  // serializes decisions; guards stopping_
  std::condition_variable cv_;
  bool stopping_ = false;
};

// The action of an approval record, back from its JSON.
Result<Action> actionFromJson(const std::string& text);

}  // namespace moat::gate
