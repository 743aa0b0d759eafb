#pragma once

#include <string>

#include "common/result.h"
#include "manager/environment_manager.h"

namespace moat::daemon {

// One `moatd --warm-pool` value: "N" (N environments of the default spec) or
// "N:key=value,..." with keys template ("host" or an absolute directory),
// cpus, ram_mb, storage_gb and pids, checked as a create's spec is (ram_mb at
// most maxRamMb). Errors say what is wrong, for "--warm-pool needs ...".
Result<manager::WarmPool> parseWarmPoolFlag(const std::string& value, double maxRamMb);

}  // namespace moat::daemon
