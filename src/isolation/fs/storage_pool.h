#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace moat::isolation::fs {

// Every environment's writable layer lives in one btrfs file system inside
// the state directory: a sparse image file on a loop device, mounted at
// <state>/storage on first use and left mounted for the next environment.
// <pool>/skeletons is a small tmpfs mounted inside it, for the /dev
// skeleton every environment binds. Each environment is a btrfs subvolume with a qgroup limit, so `--storage`
// holds exactly (writes beyond it fail with EDQUOT) and no environment can
// fill the host disk beyond the image's size. Creating and destroying a
// subvolume costs microseconds; snapshots (fork) come for free later.
// mkfs.btrfs, which makes the pool (the first of /usr/sbin, /sbin, /usr/bin,
// /bin with one), or an error saying what to install.
Result<std::string> findMkfsBtrfs();

class StoragePool {
 public:
  // Opens the pool, creating and mounting it when needed. imageBytes sizes a
  // new image (0: min(64 GiB, half the free space), or MOAT_STORAGE_GB).
  static Result<StoragePool> open(const std::string& stateDir, uint64_t imageBytes = 0);
  // Whether the pool of `stateDir` was ever made (its image is there): one
  // that was not holds no volume or snapshot, and need not be made to say so.
  static bool made(const std::string& stateDir);
  // The snapshots kept in `stateDir`'s pool, and one removed (idempotent),
  // without making a pool that is not there (every backend keeps its
  // snapshots in the one pool).
  static Result<std::vector<std::string>> snapshotsIn(const std::string& stateDir);
  static Status destroySnapshotIn(const std::string& stateDir, const std::string& snapshot);
  // The bytes volume `name` of `stateDir`'s pool holds now (its qgroup's
  // referenced count), without mounting a pool that is not.
  static Result<uint64_t> volumeBytesIn(const std::string& stateDir, const std::string& name);

  const std::string& root() const { return root_; }
  std::string volumePath(const std::string& name) const { return root_ + "/envs/" + name; }
  Result<std::string> createVolume(const std::string& name, uint64_t limitBytes);
  Status destroyVolume(const std::string& name);

  // Snapshots: read-only copies of a volume, kept in <pool>/snapshots until
  // deleted (they share every extent with their source until either side
  // writes). A volume made from a snapshot is a writable copy of it.
  std::string snapshotPath(const std::string& name) const { return root_ + "/snapshots/" + name; }
  Status snapshotVolume(const std::string& volume, const std::string& snapshot);
  Result<std::string> createVolumeFromSnapshot(const std::string& snapshot, const std::string& name,
                                               uint64_t limitBytes);
  Status destroySnapshot(const std::string& snapshot);
  Result<std::vector<std::string>> snapshots() const;
  uint64_t capacityBytes() const { return capacity_; }

 private:
  // Gives the volume just made its byte limit, or removes it again.
  Result<std::string> limitNewVolume(const std::string& name, uint64_t limitBytes);
  std::string root_;
  uint64_t capacity_ = 0;
};

}  // namespace moat::isolation::fs
