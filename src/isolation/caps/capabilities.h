#pragma once

#include <vector>

namespace moat::isolation::caps {

// The capabilities root inside an environment keeps (in its own user
// namespace only). Everything else leaves the bounding set for good.
const std::vector<int>& environmentCapabilities();

// moat-init's: the environment's and CAP_SYS_PTRACE, which the exec gate
// and the disk view need to read and follow the programs of every user
// inside (a process that changed its ids is not dumpable). Every command
// moat-init launches leaves it behind before its exec (init/launch.cc).
const std::vector<int>& initCapabilities();

}  // namespace moat::isolation::caps
