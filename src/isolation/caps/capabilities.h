#pragma once

#include <vector>

namespace moat::isolation::caps {

// The capabilities root inside an environment keeps (in its own user
// namespace only). Everything else leaves the bounding set for good.
const std::vector<int>& environmentCapabilities();

}  // namespace moat::isolation::caps
