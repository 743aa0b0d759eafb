#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

// Mount primitives, old API and the new mount API (open_tree/move_mount).
namespace moat::os {

Status mount(const std::string& source, const std::string& target, const std::string& fstype, unsigned long flags,
             const std::string& data = "");
Status bindMount(const std::string& source, const std::string& target, bool recursive = false);
// Remounts an existing bind mount with the given flags (MS_RDONLY, MS_NOSUID...).
Status remountBind(const std::string& target, unsigned long flags);
Status unmount(const std::string& target, int flags = 0);
Status makeRootPrivate();

struct MountAttrs {
  bool readOnly = false;
  bool noSuid = true;
  bool noDev = true;  // false clears it (a tree of device nodes cloned from a nodev mount)
  bool noExec = false;
  int idmapUsernsFd = -1;  // map ids through this user namespace
  // Leaves its peer group (a copy of a shared mount joins its source's):
  // nothing mounted at the source later appears in it.
  bool makePrivate = false;
};

// A detached copy of the tree at `path` (open_tree OPEN_TREE_CLONE).
Result<UniqueFd> cloneTree(const std::string& path, bool recursive);
// The same of what `fd` (O_PATH will do) refers to.
Result<UniqueFd> cloneTree(int fd, bool recursive);
Status setMountAttrs(int treeFd, const MountAttrs& attrs, bool recursive);
Status attachTree(int treeFd, const std::string& target);
// Attaches onto what targetFd (O_PATH will do) refers to: no path resolved.
Status attachTree(int treeFd, int targetFd, const std::string& shown);
// A new, detached mount of `fstype` (fsopen, fsconfig, fsmount): options
// are key/value strings, an empty value a flag.
Result<UniqueFd> newMount(const std::string& fstype, const std::vector<std::pair<std::string, std::string>>& options,
                          const MountAttrs& attrs);
// pivot_root into `newRoot` and detach the old root.
Status pivotInto(const std::string& newRoot);
// From an initramfs (which pivot_root cannot leave): `newRoot` is moved
// onto / and becomes this process's root and working directory.
Status switchRootFromInitramfs(const std::string& newRoot);
// A root of its own for a child about to exec (a program moat runs on the
// host side, such as QEMU), made by the parent as detached mounts
// (isolation::fs::HelperRoot) and entered by the child, in a mount
// namespace of its own (clone3 with CLONE_NEWNS), by enterRootInChild.
struct RootAttach {
  int tree;    // a detached mount (cloneTree)
  int target;  // where in the root it goes (O_PATH)
};
struct RootPlan {
  int root = -1;  // a detached mount: the new root
  // A directory to attach it on first, as pivot_root needs (any): a path,
  // since a descriptor opened before the child's namespace was made names
  // a mount of its parent's namespace.
  const char* attachAt = nullptr;
  const RootAttach* attach = nullptr;
  size_t attachCount = 0;
  // A directory (O_PATH) in the root for a proc of the child's own pid
  // namespace, read only, of its processes alone (subset=pid); -1: none.
  int procAt = -1;
};
// Makes every mount of the child's namespace private (nothing it does
// reaches the host's mounts, nor theirs it), attaches the plan's mounts
// (private already: MountAttrs::makePrivate),
// mounts its proc and pivots into its root, the old one detached.
// Async-signal-safe: 0, or the errno with *step naming what failed.
int enterRootInChild(const RootPlan& plan, const char** step);
// Drops what the kernel caches of the block device at `path` (BLKFLSBUF)
// before it is mounted: a restored microVM guest's disk is not the one it
// probed before it was saved, so nothing read then may be taken for its
// contents.
Status dropBlockDeviceCache(const std::string& path);

}  // namespace moat::os
