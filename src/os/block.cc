#include "os/block.h"

#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>

#include "common/unique_fd.h"
#include "os/file.h"

namespace moat::os {

Result<LoopDevice> attachLoop(const std::string& imagePath) {
  MOAT_ASSIGN(UniqueFd image, open(imagePath, O_RDWR));
  MOAT_ASSIGN(UniqueFd control, open("/dev/loop-control", O_RDWR));
  for (int attempt = 0; attempt < 16; ++attempt) {
    int index = ::ioctl(control.get(), LOOP_CTL_GET_FREE);
    if (index < 0) return Error::fromErrno("LOOP_CTL_GET_FREE");
    std::string device = "/dev/loop" + std::to_string(index);
    if (!exists(device) && ::mknod(device.c_str(), S_IFBLK | 0600, makedev(7, static_cast<unsigned>(index))) != 0 &&
        errno != EEXIST) {
      return Error::fromErrno("mknod " + device);
    }
    MOAT_ASSIGN(UniqueFd loop, open(device, O_RDWR));
    struct loop_config config;
    std::memset(&config, 0, sizeof config);
    config.fd = static_cast<uint32_t>(image.get());
    config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    if (::ioctl(loop.get(), LOOP_CONFIGURE, &config) == 0) return LoopDevice{device, std::move(loop)};
    if (errno != EBUSY) return Error::fromErrno("LOOP_CONFIGURE " + device);
    // Another process took this device between GET_FREE and CONFIGURE.
  }
  return Error::make(Code::kBusy, "no free loop device after 16 attempts");
}

Result<QuotaMode> enableBtrfsQuota(const std::string& mountPoint, bool preferSimple) {
  MOAT_ASSIGN(UniqueFd dir, open(mountPoint, O_RDONLY | O_DIRECTORY));
  constexpr uint64_t kEnableSimple = 4;  // BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA (6.7+)
  struct btrfs_ioctl_quota_ctl_args args;
  if (preferSimple) {
    std::memset(&args, 0, sizeof args);
    args.cmd = kEnableSimple;
    if (::ioctl(dir.get(), BTRFS_IOC_QUOTA_CTL, &args) == 0) return QuotaMode::kSimple;
  }
  std::memset(&args, 0, sizeof args);
  args.cmd = BTRFS_QUOTA_CTL_ENABLE;
  if (::ioctl(dir.get(), BTRFS_IOC_QUOTA_CTL, &args) != 0) {
    return Error::fromErrno("enable btrfs quota on " + mountPoint);
  }
  return QuotaMode::kFull;
}

static Status subvolumeIoctl(const std::string& parentDir, const std::string& name, unsigned long request,
                             const char* what) {
  if (name.empty() || name.size() > BTRFS_PATH_NAME_MAX || name.find('/') != std::string::npos) {
    return Error::make(Code::kInvalidArgument, std::string(what) + ": bad name " + name);
  }
  MOAT_ASSIGN(UniqueFd dir, open(parentDir, O_RDONLY | O_DIRECTORY));
  struct btrfs_ioctl_vol_args args;
  std::memset(&args, 0, sizeof args);
  std::memcpy(args.name, name.data(), name.size());
  if (::ioctl(dir.get(), request, &args) != 0) {
    return Error::fromErrno(std::string(what) + " " + parentDir + "/" + name);
  }
  return {};
}

Status createSubvolume(const std::string& parentDir, const std::string& name) {
  return subvolumeIoctl(parentDir, name, BTRFS_IOC_SUBVOL_CREATE, "create subvolume");
}

Status destroySubvolume(const std::string& parentDir, const std::string& name) {
  return subvolumeIoctl(parentDir, name, BTRFS_IOC_SNAP_DESTROY, "destroy subvolume");
}

Status snapshotSubvolume(const std::string& sourcePath, const std::string& parentDir, const std::string& name,
                         bool readOnly) {
  if (name.empty() || name.size() > BTRFS_SUBVOL_NAME_MAX || name.find('/') != std::string::npos || name == "." ||
      name == "..") {
    return Error::make(Code::kInvalidArgument, "snapshot subvolume: bad name " + name);
  }
  MOAT_ASSIGN(UniqueFd source, open(sourcePath, O_RDONLY | O_DIRECTORY));
  MOAT_ASSIGN(UniqueFd dir, open(parentDir, O_RDONLY | O_DIRECTORY));
  struct btrfs_ioctl_vol_args_v2 args;
  std::memset(&args, 0, sizeof args);
  args.fd = source.get();
  if (readOnly) args.flags = BTRFS_SUBVOL_RDONLY;
  std::memcpy(args.name, name.data(), name.size());
  if (::ioctl(dir.get(), BTRFS_IOC_SNAP_CREATE_V2, &args) != 0) {
    return Error::fromErrno("snapshot " + sourcePath + " as " + parentDir + "/" + name);
  }
  return {};
}

Status limitSubvolume(const std::string& subvolumePath, uint64_t bytes) {
  MOAT_ASSIGN(UniqueFd dir, open(subvolumePath, O_RDONLY | O_DIRECTORY));
  struct btrfs_ioctl_qgroup_limit_args args;
  std::memset(&args, 0, sizeof args);
  args.qgroupid = 0;  // 0: the qgroup of the subvolume the fd is in
  args.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER | BTRFS_QGROUP_LIMIT_MAX_EXCL;
  args.lim.max_rfer = bytes;
  args.lim.max_excl = bytes;
  if (::ioctl(dir.get(), BTRFS_IOC_QGROUP_LIMIT, &args) != 0) {
    return Error::fromErrno("limit subvolume " + subvolumePath);
  }
  return {};
}

Result<QgroupCounters> openQgroupCounters(const std::string& subvolumePath) {
  MOAT_ASSIGN(UniqueFd dir, open(subvolumePath, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
  // A subvolume's root is inode 256 (BTRFS_FIRST_FREE_OBJECTID); any other
  // directory would name the qgroup of the subvolume it is in.
  struct stat st;
  if (::fstat(dir.get(), &st) != 0) return Error::fromErrno("stat " + subvolumePath);
  if (st.st_ino != BTRFS_FIRST_FREE_OBJECTID) {
    return Error::make(Code::kInvalidArgument, subvolumePath + " is no btrfs subvolume");
  }
  struct btrfs_ioctl_fs_info_args info;
  std::memset(&info, 0, sizeof info);
  if (::ioctl(dir.get(), BTRFS_IOC_FS_INFO, &info) != 0) return Error::fromErrno("btrfs fs info " + subvolumePath);
  struct btrfs_ioctl_ino_lookup_args lookup;
  std::memset(&lookup, 0, sizeof lookup);
  lookup.objectid = BTRFS_FIRST_FREE_OBJECTID;  // treeid 0: the subvolume the fd is in
  if (::ioctl(dir.get(), BTRFS_IOC_INO_LOOKUP, &lookup) != 0) {
    return Error::fromErrno("btrfs subvolume id " + subvolumePath);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string uuid;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    uuid += kHex[info.fsid[i] >> 4];
    uuid += kHex[info.fsid[i] & 15];
  }
  std::string qgroup = "/sys/fs/btrfs/" + uuid + "/qgroups/0_" + std::to_string(lookup.treeid);
  QgroupCounters counters;
  MOAT_ASSIGN(counters.referenced, open(qgroup + "/referenced", O_RDONLY));
  MOAT_ASSIGN(counters.maxReferenced, open(qgroup + "/max_referenced", O_RDONLY));
  return counters;
}

Status setNoCopyOnWrite(int fd) {
  int flags = 0;
  if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) {
    return errno == ENOTTY || errno == EOPNOTSUPP ? Status{} : Error::fromErrno("read file flags");
  }
  flags |= FS_NOCOW_FL;
  if (::ioctl(fd, FS_IOC_SETFLAGS, &flags) != 0) {
    return errno == ENOTTY || errno == EOPNOTSUPP ? Status{} : Error::fromErrno("set no copy on write");
  }
  return {};
}

}  // namespace moat::os
