#include "os/mount.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/mount.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace moat::os {

Status mount(const std::string& source, const std::string& target, const std::string& fstype, unsigned long flags,
             const std::string& data) {
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

Result<UniqueFd> cloneTree(int fd, bool recursive) {
  unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0);
  long tree = ::syscall(SYS_open_tree, fd, "", flags);
  if (tree < 0) return Error::fromErrno("open_tree");
  return UniqueFd(static_cast<int>(tree));
}

namespace {

uint64_t attrBits(const MountAttrs& attrs) {
  uint64_t bits = 0;
  if (attrs.readOnly) bits |= MOUNT_ATTR_RDONLY;
  if (attrs.noSuid) bits |= MOUNT_ATTR_NOSUID;
  if (attrs.noDev) bits |= MOUNT_ATTR_NODEV;
  if (attrs.noExec) bits |= MOUNT_ATTR_NOEXEC;
  return bits;
}

}  // namespace

Status setMountAttrs(int treeFd, const MountAttrs& attrs, bool recursive) {
  struct mount_attr attr;
  std::memset(&attr, 0, sizeof attr);
  attr.attr_set = attrBits(attrs);
  if (!attrs.noDev) attr.attr_clr |= MOUNT_ATTR_NODEV;
  if (attrs.makePrivate) attr.propagation = MS_PRIVATE;
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
  if (::syscall(SYS_move_mount, treeFd, "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    return Error::fromErrno("move_mount to " + target);
  }
  return {};
}

Status attachTree(int treeFd, int targetFd, const std::string& shown) {
  if (::syscall(SYS_move_mount, treeFd, "", targetFd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0) {
    return Error::fromErrno("move_mount to " + shown);
  }
  return {};
}

Result<UniqueFd> newMount(const std::string& fstype, const std::vector<std::pair<std::string, std::string>>& options,
                          const MountAttrs& attrs) {
  long context = ::syscall(SYS_fsopen, fstype.c_str(), FSOPEN_CLOEXEC);
  if (context < 0) return Error::fromErrno("fsopen " + fstype);
  UniqueFd fs(static_cast<int>(context));
  for (const auto& [key, value] : options) {
    long rc = value.empty() ? ::syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_FLAG, key.c_str(), nullptr, 0)
                            : ::syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_STRING, key.c_str(), value.c_str(), 0);
    if (rc != 0) return Error::fromErrno("fsconfig " + fstype + " " + key + (value.empty() ? "" : "=" + value));
  }
  if (::syscall(SYS_fsconfig, fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    return Error::fromErrno("create " + fstype);
  }
  long mnt = ::syscall(SYS_fsmount, fs.get(), FSMOUNT_CLOEXEC, attrBits(attrs));
  if (mnt < 0) return Error::fromErrno("fsmount " + fstype);
  return UniqueFd(static_cast<int>(mnt));
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

int enterRootInChild(const RootPlan& plan, const char** step) {
  constexpr unsigned kFdToFd = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH;
  auto failed = [step](const char* what) {
    *step = what;
    return errno;
  };
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return failed("make / private");
  if (::syscall(SYS_move_mount, plan.root, "", AT_FDCWD, plan.attachAt, MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    return failed("attach the root");
  }
  for (size_t i = 0; i < plan.attachCount; ++i) {
    if (::syscall(SYS_move_mount, plan.attach[i].tree, "", plan.attach[i].target, "", kFdToFd) != 0) {
      return failed("attach a host path");
    }
  }
  if (plan.procAt >= 0) {
    // Made here, by the first process of the child's pid namespace: that
    // namespace's proc.
    UniqueFd context(static_cast<int>(::syscall(SYS_fsopen, "proc", FSOPEN_CLOEXEC)));
    if (!context) return failed("fsopen proc");
    if (::syscall(SYS_fsconfig, context.get(), FSCONFIG_SET_STRING, "subset", "pid", 0) != 0 ||
        ::syscall(SYS_fsconfig, context.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
      return failed("configure proc (subset=pid)");
    }
    UniqueFd proc(
        static_cast<int>(::syscall(SYS_fsmount, context.get(), FSMOUNT_CLOEXEC,
                                   MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)));
    if (!proc) return failed("fsmount proc");
    if (::syscall(SYS_move_mount, proc.get(), "", plan.procAt, "", kFdToFd) != 0) return failed("attach proc");
  }
  // pivot_root(".", ".") as pivotInto does, from the root's descriptor.
  if (::fchdir(plan.root) != 0) return failed("enter the root");
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return failed("pivot_root");
  if (::umount2(".", MNT_DETACH) != 0) return failed("detach the old root");
  if (::chdir("/") != 0) return failed("chdir /");
  return 0;
}

Status switchRootFromInitramfs(const std::string& newRoot) {
  if (::chdir(newRoot.c_str()) != 0) return Error::fromErrno("chdir " + newRoot);
  if (::mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) return Error::fromErrno("move " + newRoot + " onto /");
  if (::chroot(".") != 0) return Error::fromErrno("chroot " + newRoot);
  if (::chdir("/") != 0) return Error::fromErrno("chdir /");
  return {};
}

Status dropBlockDeviceCache(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::fromErrno("open " + path);
  if (::ioctl(fd.get(), BLKFLSBUF, 0) != 0) return Error::fromErrno("drop the cache of " + path);
  return {};
}

}  // namespace moat::os
