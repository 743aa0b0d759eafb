#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "manager/init_connection.h"

namespace moat::manager {

// One warm pool: `size` environments of this template and spec kept ready.
// A 0 resource is the default spec's.
struct WarmPool {
  std::string templateName = "host";
  double cpus = 0;
  uint64_t ramMb = 0;
  double storageGb = 0;
  uint64_t pids = 0;
  // Unset: moatd's default isolation (resolved with the resources).
  std::optional<backend::Isolation> isolation;
  size_t size = 0;
  // Whether an environment of this template and spec is one this pool keeps.
  bool keeps(const std::string& templ, double c, uint64_t ram, double storage, uint64_t p, backend::Isolation i) const {
    return templ == templateName && c == cpus && ram == ramMb && storage == storageGb && p == pids &&
           i == isolation.value_or(backend::Isolation::kNamespaces);
  }
};

// An environment made ahead of time, waiting for a create of its pool's spec.
struct ReadyEnvironment {
  std::string id;
  std::shared_ptr<InitConnection> connection;
  size_t pool = 0;  // index into WarmPools::pools()
};

// A pool's figures for /metrics: ready now, claims so far.
struct PoolCount {
  WarmPool spec;
  uint64_t ready = 0;
  uint64_t claims = 0;
};

// The environments kept warm, per pool, and what is under way to refill
// them: bookkeeping only (the manager makes and destroys environments, and
// counts them against its capacity). Its own lock, held only to count.
class WarmPools {
 public:
  // Pools of one (template, spec) each, their resources resolved.
  explicit WarmPools(std::vector<WarmPool> pools) : pools_(std::move(pools)) {
    creating_.assign(pools_.size(), 0);
    retryAfterMs_.assign(pools_.size(), 0);
    claims_.assign(pools_.size(), 0);
  }
  const std::vector<WarmPool>& pools() const { return pools_; }  // never changes
  // The pool that keeps environments of exactly this template and spec.
  std::optional<size_t> poolFor(const std::string& templ, double cpus, uint64_t ramMb, double storageGb, uint64_t pids,
                                backend::Isolation isolation) const;

  // The first pool short of its size (ready and being made) and not backing
  // off at `nowMs`.
  std::optional<size_t> shortOf(int64_t nowMs);
  // A refill of `pool` has begun; it ends with refilled() or refillFailed()
  // (the pool then backs off for 5 s).
  void refilling(size_t pool);
  void refilled(ReadyEnvironment ready);
  void refillFailed(size_t pool, int64_t nowMs);

  // A claim: the newest ready environment of `pool`, taken out; none when
  // the pool is empty. It ends with claimed(), or putBack() when it could
  // not be completed.
  std::optional<ReadyEnvironment> take(size_t pool, int64_t nowMs);
  void claimed(size_t pool);
  void putBack(ReadyEnvironment ready);
  // When the last claim began (the refill waits for the claimer's first commands).
  int64_t lastClaimMs();

  // A ready environment whose moat-init went: taken out, or none when `id`
  // is not one.
  std::optional<ReadyEnvironment> remove(const std::string& id);
  std::vector<ReadyEnvironment> takeAll();
  std::vector<std::pair<std::string, std::shared_ptr<InitConnection>>> connections();
  size_t ready();
  uint64_t claims();
  std::vector<PoolCount> counts();

 private:
  const std::vector<WarmPool> pools_;
  std::mutex mutex_;
  std::vector<ReadyEnvironment> ready_;  // oldest first
  std::vector<size_t> creating_;         // per pool
  std::vector<int64_t> retryAfterMs_;    // per pool: after a failed refill
  std::vector<uint64_t> claims_;         // per pool
  uint64_t allClaims_ = 0;
  int64_t lastClaimMs_ = 0;
};

}  // namespace moat::manager
