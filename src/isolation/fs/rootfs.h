#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/result.h"

namespace moat::isolation::fs {

struct BindMount {
  std::string source;  // host path
  std::string target;  // absolute path inside the environment
  bool readOnly = false;
};

// Everything the child needs to build an environment's root, prepared by the
// parent (so the child only makes syscalls).
struct RootPlan {
  std::string lowerDir;         // template lower layer (host path)
  std::string lowerMountPoint;  // where the idmapped lower is attached
  std::string upperDir;
  std::string workDir;
  std::string rootMountPoint;   // where the overlay is mounted, then pivoted into
  std::string volumeDir;        // holds lower, upper, work and root
  std::string devDir;           // prepared /dev (device nodes), bound read-only
  std::vector<BindMount> binds;  // template read-only dirs, then user volumes
  uid_t hostRootUid = 0;        // host uid of root inside (for ownership)
  gid_t hostRootGid = 0;
};

// Parent side: prepares the writable layer in `volumeDir` (upper, work and
// mount points, per-environment /etc files owned by the environment's root)
// and returns the plan.
Result<RootPlan> prepareRoot(const std::string& volumeDir, const std::string& lowerDir,
                             const std::string& hostname, uid_t hostRootUid, gid_t hostRootGid);

// The /dev every environment gets, built once in the state directory: the
// device nodes null, zero, full, random, urandom and tty, mount points for
// pts and shm, and the usual links. Bound read-only, it costs two mount
// calls instead of a tmpfs and a bind per device.
Result<std::string> ensureDevSkeleton(const std::string& stateDir);

// Child side, as host root inside a fresh mount namespace: mounts the
// overlay root (lower idmapped through usernsFd), the binds, /proc, a minimal
// /dev, then pivot_root into it and masks sensitive /proc entries.
Status buildRoot(const RootPlan& plan, int usernsFd);

// Checks a -v target: absolute, no "..", not over /proc, /dev or /.
Status validateBindTarget(const std::string& target);

}  // namespace moat::isolation::fs
