// The warm pools' thread: it makes environments ahead of time, as far as
// capacity leaves room, for creates of their spec to claim.
#include <chrono>

#include "common/clock.h"
#include "manager/environment_manager.h"

namespace moat::manager {

void EnvironmentManager::poolLoop() {
  // A claimed environment's first commands come right after the claim; the
  // refill (a create: milliseconds of CPU) waits until they have run, so it
  // does not compete with them on a small machine.
  constexpr int64_t kRefillAfterClaimMs = 10;
  std::unique_lock<std::mutex> lock(threadsMutex_);
  while (!stopping_) {
    int64_t quietAt = pools_.lastClaimMs() + kRefillAfterClaimMs;
    if (nowMs() < quietAt) {
      poolCv_.wait_for(lock, std::chrono::milliseconds(quietAt - nowMs()));
      continue;
    }
    lock.unlock();
    refillPool();
    lock.lock();
    if (stopping_) break;
    poolCv_.wait_for(lock, std::chrono::milliseconds(500));
  }
}

backend::Spec EnvironmentManager::poolSpec(size_t pool) const {
  const WarmPool& p = pools_.pools()[pool];
  return specFor(p.templateName, p.cpus, p.ramMb, p.storageGb, p.pids,
                 p.isolation.value_or(backend::Isolation::kNamespaces));
}

std::optional<size_t> EnvironmentManager::poolFor(const store::EnvironmentRecord& record) const {
  return pools_.poolFor(record.templateName, record.cpus, record.ramMb, record.storageGb, record.pids,
                        backend::isolationNamed(record.isolation).value_or(backend::Isolation::kNamespaces));
}

void EnvironmentManager::refillPool() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(threadsMutex_);
      if (stopping_ || detached_) return;
    }
    // Only this thread refills: the pool found short stays short until it does.
    auto pool = pools_.shortOf(nowMs());
    if (!pool) return;
    const uint64_t ramMb = pools_.pools()[*pool].ramMb;
    if (!capacity_.take(ramMb).ok()) return;  // real requests come first
    pools_.refilling(*pool);
    auto spec = poolSpec(*pool);
    spec.id = backend::newEnvironmentId();  // named, so that a failed create can be cleaned up
    auto created = backend_.create(spec);
    if (!created.ok()) (void)backend_.destroy(spec.id);  // made but not handed over (a lost descriptor)
    std::shared_ptr<InitConnection> connection;
    if (created.ok()) {
      std::string id = created->id;
      connection = connect(id, std::move(created->control));
      warmUp(connection, id);
      if (connection->closed()) {
        (void)backend_.destroy(id);
        created = Error::make(Code::kGone, "a pool environment ended while warming up");
      }
    }
    if (!created.ok()) {
      capacity_.release(ramMb);
      pools_.refillFailed(*pool, nowMs());
      continue;
    }
    pools_.refilled(ReadyEnvironment{created->id, std::move(connection), *pool});
  }
}

}  // namespace moat::manager
