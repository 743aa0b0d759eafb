#pragma once

#include <string>
#include <vector>

namespace moat {

// The variables a command in an environment starts with (moat run's and
// moatd's alike): nothing from the host.
std::vector<std::string> baseEnvironment(const std::string& hostname, const std::string& cwd);

}  // namespace moat
