#pragma once

#include "common/result.h"

namespace moat::os {

// Brings the loopback interface of the caller's network namespace up.
Status bringLoopbackUp();

}  // namespace moat::os
