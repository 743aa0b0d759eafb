#include "isolation/fs/storage_pool.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "common/unique_fd.h"
#include "os/block.h"
#include "os/file.h"
#include "os/mount.h"
#include "os/statfs_notify.h"

extern char** environ;

namespace moat::isolation::fs {
namespace {

constexpr uint64_t kGiB = 1ULL << 30;

Status runTool(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  ::posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Error::fromErrno("spawn " + argv[0], rc);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Error::fromErrno("wait " + argv[0]);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Error::make(Code::kToolFailed, argv[0] + " failed (status " + std::to_string(status) + ")");
  }
  return {};
}

uint64_t defaultImageBytes(const std::string& stateDir) {
  if (const char* gb = std::getenv("MOAT_STORAGE_GB")) {
    uint64_t v = std::strtoull(gb, nullptr, 10);
    if (v > 0) return v * kGiB;
  }
  struct statvfs vfs;
  uint64_t half = 8 * kGiB;
  if (::statvfs(stateDir.c_str(), &vfs) == 0) half = vfs.f_bavail * vfs.f_frsize / 2;
  return std::max<uint64_t>(kGiB, std::min<uint64_t>(64 * kGiB, half) / kGiB * kGiB);
}

bool isBtrfs(const std::string& path) {
  auto type = os::fileSystemType(path);
  return type.ok() && static_cast<uint32_t>(type.value()) == static_cast<uint32_t>(os::kBtrfsMagic);
}

constexpr uint32_t kTmpfsMagic = 0x01021994;

bool isTmpfs(const std::string& path) {
  auto type = os::fileSystemType(path);
  return type.ok() && static_cast<uint32_t>(type.value()) == kTmpfsMagic;
}

// <pool>/skeletons: a small tmpfs of its own for what every environment
// binds from moat (the /dev skeleton). A bind from the pool itself would
// hand each environment a descriptor on the pool's btrfs (its ioctls list
// every environment's subvolume); one from the state directory names that
// directory in /proc/self/mountinfo. Device nodes must open there: no nodev.
Status mountSkeletons(const std::string& root) {
  std::string dir = root + "/skeletons";
  MOAT_TRY(os::makeDir(dir, 0700));
  return os::mount("moat-skeletons", dir, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0700,size=1m,nr_inodes=1024");
}

Status mountPool(const std::string& image, const std::string& root, uint64_t imageBytes) {
  if (!os::exists(image)) {
    MOAT_ASSIGN(std::string mkfs, findMkfsBtrfs());
    std::string tmp = image + ".new";
    {
      MOAT_ASSIGN(UniqueFd fd, os::open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600));
      if (::ftruncate(fd.get(), static_cast<off_t>(imageBytes)) != 0) {
        return Error::fromErrno("size storage image " + tmp);
      }
    }
    MOAT_TRY(runTool({mkfs, "-q", "-f", tmp}));
    if (::rename(tmp.c_str(), image.c_str()) != 0) return Error::fromErrno("rename " + tmp);
  }
  MOAT_ASSIGN(os::LoopDevice loop, os::attachLoop(image));
  MOAT_TRY(os::makeDir(root, 0700));
  MOAT_TRY(os::mount(loop.path, root, "btrfs", MS_NOSUID | MS_NODEV | MS_NOATIME));
  // The loop fd closes here; autoclear detaches the device at unmount.
  MOAT_ASSIGN(auto mode, os::enableBtrfsQuota(root, true));
  (void)mode;
  MOAT_TRY(os::makeDir(root + "/envs", 0700));
  return mountSkeletons(root);
}

}  // namespace

bool StoragePool::made(const std::string& stateDir) { return os::exists(stateDir + "/storage.img"); }

Result<std::vector<std::string>> StoragePool::snapshotsIn(const std::string& stateDir) {
  // No pool yet: nothing is kept, and no reason to make one before the
  // first environment needs it. One that exists is opened (mounted again
  // after a reboot) to be listed.
  if (!made(stateDir)) return std::vector<std::string>{};
  MOAT_ASSIGN(StoragePool pool, open(stateDir));
  return pool.snapshots();
}

Status StoragePool::destroySnapshotIn(const std::string& stateDir, const std::string& snapshot) {
  if (!made(stateDir)) return {};
  MOAT_ASSIGN(StoragePool pool, open(stateDir));
  return pool.destroySnapshot(snapshot);
}

Result<uint64_t> StoragePool::volumeBytesIn(const std::string& stateDir, const std::string& name) {
  const std::string root = stateDir + "/storage";
  if (!isBtrfs(root)) return Error::make(Code::kNotFound, "no storage pool is mounted in " + stateDir);
  MOAT_ASSIGN(os::QgroupCounters counters, os::openQgroupCounters(root + "/envs/" + name));
  return os::readSysfsNumber(counters.referenced.get());
}

Result<StoragePool> StoragePool::open(const std::string& stateDir, uint64_t imageBytes) {
  StoragePool pool;
  pool.root_ = stateDir + "/storage";
  if (!isBtrfs(pool.root_) || !isTmpfs(pool.root_ + "/skeletons")) {
    MOAT_ASSIGN(UniqueFd lock, os::open(stateDir + "/storage.lock", O_RDWR | O_CREAT, 0600));
    if (::flock(lock.get(), LOCK_EX) != 0) return Error::fromErrno("lock storage pool");
    if (!isBtrfs(pool.root_)) {  // another moat may have mounted it meanwhile
      Status s =
          mountPool(stateDir + "/storage.img", pool.root_, imageBytes ? imageBytes : defaultImageBytes(stateDir));
      if (!s.ok()) {
        return Error{s.error().code, s.error().sysErrno, "storage pool in " + stateDir + ": " + s.error().context};
      }
    } else if (!isTmpfs(pool.root_ + "/skeletons")) {  // a pool mounted by an older moat
      MOAT_TRY(mountSkeletons(pool.root_));
    }
  }
  struct statvfs vfs;
  if (::statvfs(pool.root_.c_str(), &vfs) == 0) pool.capacity_ = vfs.f_blocks * vfs.f_frsize;
  return pool;
}

Result<std::string> StoragePool::limitNewVolume(const std::string& name, uint64_t limitBytes) {
  std::string path = volumePath(name);
  Status s = os::limitSubvolume(path, limitBytes);
  if (!s.ok()) {
    (void)os::destroySubvolume(root_ + "/envs", name);
    return s.error();
  }
  return path;
}

Result<std::string> StoragePool::createVolume(const std::string& name, uint64_t limitBytes) {
  MOAT_TRY(os::createSubvolume(root_ + "/envs", name));
  return limitNewVolume(name, limitBytes);
}

Status StoragePool::destroyVolume(const std::string& name) {
  if (!os::exists(volumePath(name))) return {};
  return os::destroySubvolume(root_ + "/envs", name);
}

Status StoragePool::snapshotVolume(const std::string& volume, const std::string& snapshot) {
  MOAT_TRY(os::makeDir(root_ + "/snapshots", 0700));
  if (!os::exists(volumePath(volume))) return Error::make(Code::kNotFound, "no volume " + volume);
  return os::snapshotSubvolume(volumePath(volume), root_ + "/snapshots", snapshot, true);
}

Result<std::string> StoragePool::createVolumeFromSnapshot(const std::string& snapshot, const std::string& name,
                                                          uint64_t limitBytes) {
  if (!os::exists(snapshotPath(snapshot))) return Error::make(Code::kNotFound, "no snapshot " + snapshot);
  MOAT_TRY(os::snapshotSubvolume(snapshotPath(snapshot), root_ + "/envs", name, false));
  return limitNewVolume(name, limitBytes);
}

Status StoragePool::destroySnapshot(const std::string& snapshot) {
  if (!os::exists(snapshotPath(snapshot))) return {};
  return os::destroySubvolume(root_ + "/snapshots", snapshot);
}

Result<std::vector<std::string>> StoragePool::snapshots() const {
  if (!os::exists(root_ + "/snapshots")) return std::vector<std::string>{};
  return os::listDir(root_ + "/snapshots");
}

Result<std::string> findMkfsBtrfs() {
  std::string path = os::executableIn("mkfs.btrfs", {"/usr/sbin", "/sbin", "/usr/bin", "/bin"});
  if (path.empty()) {
    return Error::make(Code::kMissingDependency,
                       "mkfs.btrfs not found: install btrfs-progs (make build does it for you)");
  }
  return path;
}

}  // namespace moat::isolation::fs
