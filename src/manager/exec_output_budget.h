#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/result.h"

namespace moat::manager {

// What one caller's (a key's, or the master token's) blocking execs in
// flight may hold of output at once (ManagerConfig::execOutputPerCaller):
// bounds what a flood of execs makes moatd hold, and keeps a flooding key's
// execs from using up another's.
class ExecOutputBudget {
 public:
  explicit ExecOutputBudget(uint64_t perCaller) : perCaller_(perCaller) {}
  // Counts `bytes` against `caller` until the returned handle is released
  // (the budget must outlive it); `capacity` when they would not fit.
  Result<std::shared_ptr<void>> reserve(const std::string& caller, uint64_t bytes);
  uint64_t held(const std::string& caller);

 private:
  const uint64_t perCaller_;
  std::mutex mutex_;
  std::map<std::string, uint64_t> reserved_;  // callers holding none are not kept
};

}  // namespace moat::manager
