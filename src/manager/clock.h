#pragma once

#include <cstdint>

namespace moat::manager {

// Wall-clock milliseconds since the epoch: what the store and the API show.
int64_t nowMs();

}  // namespace moat::manager
