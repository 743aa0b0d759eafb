#include "os/mount.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace moat::os {

Status mount(const std::string& source, const std::string& target, const std::string& fstype,
             unsigned long flags, const std::string& data) {
  if (::mount(source.c_str(), target.c_str(), fstype.empty() ? nullptr : fstype.c_str(), flags,
              data.empty() ? nullptr : data.c_str()) != 0) {
    return Error::fromErrno("mount " + (fstype.empty() ? source : fstype) + " on " + target);
  }
  return {};
}

Status bindMount(const std::string& source, const std::string& target, bool recursive) {
  return mount(source, target, "", MS_BIND | (recursive ? MS_REC : 0));
}

Status remountBind(const std::string& target, unsigned long flags) {
  return mount("", target, "", MS_REMOUNT | MS_BIND | flags);
}

Status unmount(const std::string& target, int flags) {
  if (::umount2(target.c_str(), flags) != 0) return Error::fromErrno("umount " + target);
  return {};
}

Status makeRootPrivate() { return mount("", "/", "", MS_REC | MS_PRIVATE); }

Result<UniqueFd> cloneTree(const std::string& path, bool recursive) {
  unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0);
  long fd = ::syscall(SYS_open_tree, AT_FDCWD, path.c_str(), flags);
  if (fd < 0) return Error::fromErrno("open_tree " + path);
  return UniqueFd(static_cast<int>(fd));
}

Status setMountAttrs(int treeFd, const MountAttrs& attrs, bool recursive) {
  struct mount_attr attr;
  std::memset(&attr, 0, sizeof attr);
  if (attrs.readOnly) attr.attr_set |= MOUNT_ATTR_RDONLY;
  if (attrs.noSuid) attr.attr_set |= MOUNT_ATTR_NOSUID;
  if (attrs.noDev) attr.attr_set |= MOUNT_ATTR_NODEV;
  if (attrs.noExec) attr.attr_set |= MOUNT_ATTR_NOEXEC;
  if (attrs.idmapUsernsFd >= 0) {
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(attrs.idmapUsernsFd);
  }
  unsigned flags = AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0);
  if (::syscall(SYS_mount_setattr, treeFd, "", flags, &attr, sizeof attr) != 0) {
    return Error::fromErrno(attrs.idmapUsernsFd >= 0 ? "mount_setattr idmap" : "mount_setattr");
  }
  return {};
}

Status attachTree(int treeFd, const std::string& target) {
  if (::syscall(SYS_move_mount, treeFd, "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) !=
      0) {
    return Error::fromErrno("move_mount to " + target);
  }
  return {};
}

Status pivotInto(const std::string& newRoot) {
  if (::chdir(newRoot.c_str()) != 0) return Error::fromErrno("chdir " + newRoot);
  // pivot_root(".", ".") stacks the old root on top of the new one; detaching
  // it leaves only the new root, with no directory needed for the old one.
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return Error::fromErrno("pivot_root");
  if (::umount2(".", MNT_DETACH) != 0) return Error::fromErrno("detach old root");
  if (::chdir("/") != 0) return Error::fromErrno("chdir /");
  return {};
}

}  // namespace moat::os
