#pragma once

#include <string>
#include <vector>

namespace moat::cli {

// Each subcommand takes the arguments after its name and returns the exit code.
int runCommand(const std::vector<std::string>& args);

}  // namespace moat::cli
