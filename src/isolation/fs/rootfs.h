#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "isolation/proc/lxcfs.h"

namespace moat::isolation::fs {

struct BindMount {
  std::string source;  // host path
  std::string target;  // absolute path inside the environment
  bool readOnly = false;
};

// A bind as the child makes it: its source already opened by the parent.
struct PlannedBind {
  int sourceFd = -1;   // O_PATH, owned by the RootPlan
  std::string target;  // absolute path inside the environment
  bool readOnly = false;
  bool directory = true;
  // Volumes: ids mapped through the environment's user namespace, so root
  // inside owns what host root owns there. A template's host directories
  // (/usr): not, so root inside gets only what any unprivileged host user
  // gets (docs/SECURITY.md).
  bool idmapped = true;
};

// Everything the child needs to build an environment's root, prepared by the
// parent (so the child only makes syscalls).
struct RootPlan {
  int lowerFd = -1;             // template lower layer (O_PATH, owned by the caller)
  UniqueFd lowerTree;           // ... as a detached mount (detachTrees)
  std::string lowerMountPoint;  // where the idmapped lower is attached
  std::string upperDir;
  std::string workDir;
  std::string rootMountPoint;         // where the overlay is mounted, then pivoted into
  std::string volumeDir;              // holds lower, upper, work and root
  std::string devDir;                 // prepared /dev (device nodes), bound read-only
  std::vector<PlannedBind> binds;     // template read-only dirs, then user volumes
  std::vector<UniqueFd> bindSources;  // what binds[i].sourceFd borrows
  std::vector<UniqueFd> bindTrees;    // binds[i] as a detached mount (detachBinds)
  // Read-only files attached over /proc/<name> once /proc is mounted (LXCFS's
  // view of the environment's limits); one missing from /proc is skipped.
  std::vector<proc::ProcFileTree> procFiles;
  bool environmentFilesWritten = false;  // by prepareRoot (a fresh volume); else the child's
  uid_t hostRootUid = 0;                 // host uid of root inside (for ownership)
  gid_t hostRootGid = 0;
};

// Parent side: prepares the volume for the overlay (lower, upper, work and
// root directories; the upper layer's top owned by the environment's root)
// and returns the plan. On a volume made just now it also writes the
// environment's files (all names new, nothing there to follow); on a copy
// of a snapshot nothing below upper/ is touched: the child writes them as
// the environment's root (writeEnvironmentFiles).
// The files moat writes into every environment's /etc (name, bytes).
std::vector<std::pair<std::string, std::string>> environmentFiles(const std::string& hostname);

Result<RootPlan> prepareRoot(const std::string& volumeDir, int lowerFd, const std::string& hostname, uid_t hostRootUid,
                             gid_t hostRootGid);

// Parent side: opens `source` (a host path; symlinks on the way followed
// only when root owns them: os::openHostPath) and adds it to the plan.
Status addBind(RootPlan& plan, const std::string& source, const std::string& target, bool readOnly, bool idmapped);

// Parent side, in the host's mount namespace (a mount can only be copied
// there): the lower layer and each bind's source as detached mounts with
// their attributes, ids mapped through usernsFd where the bind says so.
Status detachTrees(RootPlan& plan, int usernsFd);

// The /dev every environment gets, built once in the storage pool (so that
// the mounts made from it name no host path in /proc/self/mountinfo): the
// device nodes null, zero, full, random, urandom and tty, mount points for
// pts and shm, and the usual links. Bound read-only, it costs two mount
// calls instead of a tmpfs and a bind per device.
Result<std::string> ensureDevSkeleton(const std::string& poolRoot);

// Child side, as host root inside a fresh mount namespace: mounts the
// overlay root (lower idmapped through usernsFd), pivots into it, then
// mounts the binds, /proc and a minimal /dev onto mount points resolved
// inside it without following any symlink, and masks sensitive /proc
// entries. Once the overlay is mounted no path is resolved outside it.
Status buildRoot(const RootPlan& plan, int usernsFd);

// Child side, after buildRoot, as root of the environment's user namespace
// (so it can reach nothing the environment cannot): /etc/hostname and
// /etc/hosts (replaced, never written through), /workspace and /tmp when
// the tree has none. Where the environment's files make that impossible
// (its /etc is a link to another file system, say), it is left as it is.
Status writeEnvironmentFiles(const std::string& hostname);

// Checks a -v target: absolute, no "..", not over /proc, /dev or /.
Status validateBindTarget(const std::string& target);

}  // namespace moat::isolation::fs
