#pragma once

#include <sys/types.h>

#include <cstdint>

#include "common/result.h"
#include "common/unique_fd.h"

namespace moat::isolation::namespaces {

// Root inside an environment is host uid `hostBase`; ids 0..count-1 inside map
// to hostBase..hostBase+count-1 outside. Never host uid 0.
struct IdMap {
  uint32_t hostBase = 0;
  uint32_t count = 65536;
};

// Picks a host id range for a new environment from moat's reserved window
// (0x40000000 upwards, far above any real user's ids).
IdMap allocateIdMap();

// Creates a user namespace with `map` for uids and gids and returns an fd to
// it. The short-lived process that created it is reaped before returning; the
// fd keeps the namespace alive. Used for idmapped mounts and joined by the
// environment's init after its mounts are in place.
Result<UniqueFd> createUserNamespace(const IdMap& map);

}  // namespace moat::isolation::namespaces
