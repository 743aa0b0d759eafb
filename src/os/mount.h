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
// Drops what the kernel caches of the block device at `path` (BLKFLSBUF)
// before it is mounted: a restored microVM guest's disk is not the one it
// probed before it was saved, so nothing read then may be taken for its
// contents.
Status dropBlockDeviceCache(const std::string& path);

}  // namespace moat::os
