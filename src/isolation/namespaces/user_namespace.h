#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/result.h"
#include "common/unique_fd.h"
#include "os/file_lock.h"

namespace moat::isolation::namespaces {

// Root inside an environment is host uid `hostBase`; ids 0..count-1 inside map
// to hostBase..hostBase+count-1 outside. Never host uid 0.
struct IdMap {
  uint32_t hostBase = 0;
  uint32_t count = 65536;
};

// A host id range held for one environment's life: no other environment on
// this host (of this moatd, another moatd, or a `moat run`) gets the same
// range while the lease lives. Each of the 16,384 ranges of moat's window
// (0x40000000 upwards, far above any real user's ids) is a lock file in
// `lockDir`; a process that dies gives its ranges back.
struct IdMapLease {
  IdMap map;
  os::FileLock lock;
};
inline constexpr const char* kIdMapLockDir = "/run/moat/idmaps";
inline constexpr uint32_t kIdMapSlots = 16384;
inline constexpr uint32_t kIdMapWindow = 0x40000000u;  // host id of range 0's root
// The range `hostBase` begins, if it is one of the window's.
std::optional<uint32_t> idMapSlotOf(uint32_t hostBase);
// Takes the first free range from a random one on (from `start`, in tests);
// `exhausted` when every range is held.
Result<IdMapLease> leaseIdMap(const std::string& lockDir = kIdMapLockDir, std::optional<uint32_t> start = std::nullopt);

// Creates a user namespace with `map` for uids and gids and returns an fd to
// it. The short-lived process that created it is reaped before returning; the
// fd keeps the namespace alive. Used for idmapped mounts and joined by the
// environment's init after its mounts are in place.
Result<UniqueFd> createUserNamespace(const IdMap& map);

// A user namespace made ahead, with the lease on the range it maps: for a
// creator that keeps a few ready between requests (moatd's spawner), since
// leasing a range and making its namespace take ~0.2-0.3 ms of a create.
struct ReadyUserNamespace {
  IdMapLease lease;
  UniqueFd ns;
};
Result<ReadyUserNamespace> readyUserNamespace();

}  // namespace moat::isolation::namespaces
