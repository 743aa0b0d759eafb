#pragma once

#include <cstdint>

namespace moat {

// Wall-clock milliseconds since the epoch: what the store and the API show.
int64_t nowMs();

}  // namespace moat
