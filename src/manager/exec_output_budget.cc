#include "manager/exec_output_budget.h"

namespace moat::manager {

Result<std::shared_ptr<void>> ExecOutputBudget::reserve(const std::string& caller, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = reserved_.find(caller);
  const uint64_t held = it == reserved_.end() ? 0 : it->second;
  if (bytes > perCaller_ || held > perCaller_ - bytes) {
    return Error::make(Code::kCapacity,
                       "at capacity: this caller's execs in flight already hold " + std::to_string(held >> 20) +
                           " MiB of output limits (at most " + std::to_string(perCaller_ >> 20) +
                           " MiB; each exec counts twice its output_limit); retry later or lower output_limit");
  }
  reserved_[caller] = held + bytes;
  return std::shared_ptr<void>(nullptr, [this, caller, bytes](void*) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = reserved_.find(caller);
    if (it != reserved_.end() && (it->second -= bytes) == 0) reserved_.erase(it);
  });
}

uint64_t ExecOutputBudget::held(const std::string& caller) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = reserved_.find(caller);
  return it == reserved_.end() ? 0 : it->second;
}

}  // namespace moat::manager
