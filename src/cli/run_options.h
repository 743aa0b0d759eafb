#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/namespaces/environment.h"
#include "common/result.h"

namespace moat::cli {

struct RunOptions {
  backend::namespaces::EnvironmentSpec spec;
  std::vector<std::string> command;
  std::vector<std::string> env;  // KEY=VALUE from -e
  std::string workdir = "/workspace";
  bool interactive = false;
  double timeoutSeconds = 0;  // 0: none
  bool microvm = false;       // --isolation microvm (docs/MICROVM.md)
  bool help = false;
};

// Parses the arguments after "run". `hostMemoryMb` bounds --memory;
// `lookupHostEnv` serves `-e NAME` (the user passing one host variable on
// purpose). Errors name the offending flag.
Result<RunOptions> parseRunOptions(const std::vector<std::string>& args, uint64_t hostMemoryMb,
                                   const char* (*lookupHostEnv)(const char*));

const char* runUsage();

}  // namespace moat::cli
