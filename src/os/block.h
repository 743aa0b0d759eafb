#pragma once

#include <cstdint>
#include <string>

#include "common/result.h"
#include "common/unique_fd.h"

// Loop devices and btrfs: the storage pool below environment filesystems.
namespace moat::os {

struct LoopDevice {
  std::string path;
  UniqueFd fd;  // keep open until the device is mounted: autoclear fires on last close
};
// Attaches `imagePath` to a free loop device with autoclear (the device goes
// away when its last user, normally the mount, does).
Result<LoopDevice> attachLoop(const std::string& imagePath);

enum class QuotaMode { kSimple, kFull };
// Enables btrfs quota on the file system at mountPoint; returns the mode in use.
Result<QuotaMode> enableBtrfsQuota(const std::string& mountPoint, bool preferSimple);
Status createSubvolume(const std::string& parentDir, const std::string& name);
Status destroySubvolume(const std::string& parentDir, const std::string& name);
// A snapshot of the subvolume at sourcePath as parentDir/name (both on one
// btrfs): instant, sharing every extent until one side writes.
Status snapshotSubvolume(const std::string& sourcePath, const std::string& parentDir, const std::string& name,
                         bool readOnly);
// Caps the bytes a subvolume may hold (its qgroup's referenced and exclusive limit).
Status limitSubvolume(const std::string& subvolumePath, uint64_t bytes);

// A subvolume's qgroup counters in btrfs's sysfs
// (/sys/fs/btrfs/<fsid>/qgroups/0_<subvolume id>/), opened read-only: the
// bytes it refers to and its limit (0: none). Files, not the directory: who
// holds them reaches nothing else of sysfs.
struct QgroupCounters {
  UniqueFd referenced;
  UniqueFd maxReferenced;
};
Result<QgroupCounters> openQgroupCounters(const std::string& subvolumePath);

// Marks the empty regular file `fd` to be written in place (btrfs
// FS_NOCOW_FL: no copy on write, as for VM disk images); a no-op error
// (EOPNOTSUPP, ENOTTY) on file systems without it is not one.
Status setNoCopyOnWrite(int fd);

constexpr long kBtrfsMagic = 0x9123683E;

}  // namespace moat::os
