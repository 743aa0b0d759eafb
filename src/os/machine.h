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

}  // namespace moat::os
