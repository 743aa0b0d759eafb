#pragma once

#include <string>

#include "common/result.h"

namespace moat::os {

// What the pid 1 of a (virtual) machine does to it: a microVM guest's
// moat-init (init/guest.h).

// Loads the kernel module in file `path` (finit_module, no parameters). A
// module already loaded is fine.
Status loadKernelModule(const std::string& path);

// Writes what is cached and powers the machine off (returns only if that
// fails).
void powerOff();

// Mixes `seed` into the kernel's entropy pool, credited (RNDADDENTROPY),
// and reseeds its generator from it at once (RNDRESEEDCRNG): a machine
// restored from a saved image must not go on with the image's randomness.
Status addEntropy(const std::string& seed);

// Sets the wall clock (CLOCK_REALTIME) to `ns` since the epoch.
Status setRealtime(uint64_t ns);

}  // namespace moat::os
