#include "isolation/fs/rootfs.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/path.h"
#include "common/trace.h"
#include "common/unique_fd.h"
#include "isolation/fs/built_dir.h"
#include "os/file.h"
#include "os/mount.h"
#include "os/tree.h"

namespace moat::isolation::fs {
namespace {

// /proc entries that leak host kernel state or allow host-wide actions.
constexpr const char* kProcHidden[] = {"/proc/kcore",         "/proc/keys",     "/proc/timer_list",
                                       "/proc/sysrq-trigger", "/proc/kallsyms", "/proc/kmsg"};
constexpr const char* kProcReadOnly[] = {"/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/pressure"};

// Gives a detached tree its attributes, with ids mapped through usernsFd
// (-1: none) when the file system supports it.
Status setAttrs(int tree, bool readOnly, int usernsFd, bool devices = false) {
  os::MountAttrs attrs;
  attrs.readOnly = readOnly;
  attrs.noDev = !devices;
  attrs.noExec = devices;
  attrs.idmapUsernsFd = usernsFd;
  if (os::setMountAttrs(tree, attrs, false).ok()) return {};
  if (usernsFd < 0) return os::setMountAttrs(tree, attrs, false);
  // Some file systems cannot be idmapped: their files then show as nobody
  // inside, but are still usable read-only.
  attrs.idmapUsernsFd = -1;
  return os::setMountAttrs(tree, attrs, false);
}

Error refusedMountPoint(const std::string& path, const Error& e) {
  std::string why = e.sysErrno == ELOOP     ? "is or passes through a symlink, which moat does not follow"
                    : e.sysErrno == ENOTDIR ? "passes through something that is not a directory"
                    : e.sysErrno == EXDEV   ? "is missing and would have to be made inside another mount (a volume, "
                                              "/usr): make it there first"
                                            : "cannot be made: " + e.message();
  return Error{Code::kEnvironmentFailed, e.sysErrno, "mount point " + path + " in the environment " + why};
}

// The mount point `path` (absolute, inside the environment) under rootFd,
// made (owned by uid:gid) where it is missing. No symlink is followed on the
// way: a link there, planted by the environment or by a template, fails the
// create instead of steering a mount, or a mkdir by host root, elsewhere.
// What is missing is made only on the environment's own file system, never
// inside an earlier bind (a host directory).
Result<UniqueFd> mountPoint(int rootFd, const std::string& path, bool directory, uid_t uid, gid_t gid) {
  size_t first = path.find_first_not_of('/');
  std::string rel = first == std::string::npos ? "." : path.substr(first);
  auto whole = os::openAt(rootFd, rel, O_PATH, os::kResolveStrict);
  if (whole.ok()) return whole;
  if (whole.error().sysErrno != ENOENT) return refusedMountPoint(path, whole.error());
  MOAT_ASSIGN(UniqueFd at, os::openAt(rootFd, ".", O_PATH | O_DIRECTORY, os::kResolveStrict));
  for (size_t i = 0; i < rel.size();) {
    size_t j = std::min(rel.find('/', i), rel.size());
    std::string name = rel.substr(i, j - i);
    i = j + 1;
    if (name.empty()) continue;
    auto next = os::openAt(at.get(), name, O_PATH, os::kResolveStrict | RESOLVE_NO_XDEV);
    if (!next.ok() && next.error().sysErrno == ENOENT) {
      Status made = directory || i < rel.size() ? os::makeDirectoryAt(at.get(), name, 0755)
                                                : os::createFileAt(at.get(), name, 0644);
      if (!made.ok()) return refusedMountPoint(path, made.error());
      next = os::openAt(at.get(), name, O_PATH, os::kResolveStrict);
      if (next.ok()) MOAT_TRY(os::chownFd(next->get(), uid, gid));
    }
    if (!next.ok()) return refusedMountPoint(path, next.error());
    at = std::move(next.value());
  }
  return at;
}

// Mounts a new file system onto the mount point `path` (made if missing).
Status mountNew(int rootFd, const std::string& path, const std::string& fstype,
                const std::vector<std::pair<std::string, std::string>>& options, const os::MountAttrs& attrs, uid_t uid,
                gid_t gid) {
  MOAT_ASSIGN(UniqueFd target, mountPoint(rootFd, path, true, uid, gid));
  MOAT_ASSIGN(UniqueFd tree, os::newMount(fstype, options, attrs));
  return os::attachTree(tree.get(), target.get(), path);
}

Status buildDevSkeleton(const std::string& dir) {
  struct Node {
    const char* name;
    unsigned major, minor;
  };
  constexpr Node kNodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
                             {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
  MOAT_TRY(os::makeDir(dir, 0755));
  for (const auto& n : kNodes) {
    std::string path = dir + "/" + n.name;
    if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(n.major, n.minor)) != 0) {
      return Error::fromErrno("mknod " + path);
    }
    ::chmod(path.c_str(), 0666);  // despite the umask
  }
  MOAT_TRY(os::makeDir(dir + "/pts", 0755));
  MOAT_TRY(os::makeDir(dir + "/shm", 01777));
  MOAT_TRY(os::symlink("pts/ptmx", dir + "/ptmx"));
  MOAT_TRY(os::symlink("/proc/self/fd", dir + "/fd"));
  MOAT_TRY(os::symlink("/proc/self/fd/0", dir + "/stdin"));
  MOAT_TRY(os::symlink("/proc/self/fd/1", dir + "/stdout"));
  MOAT_TRY(os::symlink("/proc/self/fd/2", dir + "/stderr"));
  return {};
}

Status mountDev(int rootFd, UniqueFd devTree, const RootPlan& plan) {
  uid_t uid = plan.hostRootUid;
  gid_t gid = plan.hostRootGid;
  MOAT_ASSIGN(UniqueFd dev, mountPoint(rootFd, "/dev", true, uid, gid));
  MOAT_TRY(os::attachTree(devTree.get(), dev.get(), "/dev"));
  // /dev/pts and /dev/shm are directories of moat's skeleton, just mounted
  // at /dev: nothing of the environment's lies on the way there, and
  // mount(2) by path costs a third of fsopen/fsconfig/fsmount.
  MOAT_TRY(os::mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                     "newinstance,ptmxmode=0666,mode=0620,gid=" + std::to_string(gid + 5)));
  return os::mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
                   "mode=1777,uid=" + std::to_string(uid) + ",gid=" + std::to_string(gid));
}

Status maskProc() {
  for (const char* path : kProcHidden) {
    if (!os::exists(path)) continue;
    MOAT_TRY(os::bindMount("/dev/null", path));
  }
  for (const char* path : kProcReadOnly) {
    if (!os::exists(path)) continue;
    MOAT_TRY(os::bindMount(path, path, true));
    MOAT_TRY(os::remountBind(path, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC));
  }
  return {};
}

// Environment files the child writes may find the environment's own
// layout in the way (its /etc a link to another file system, a directory
// named hostname): those are left as the environment made them.
bool layoutInTheWay(const Error& e) {
  switch (e.sysErrno) {
    case ENOENT:
    case ENOTDIR:
    case EXDEV:
    case ELOOP:
    case EISDIR:
    case ENOTEMPTY:
    case EBUSY:
    case EACCES:
    case EPERM:
    case EROFS:
    case EAGAIN:
      return true;
    default:
      return false;
  }
}

}  // namespace

Status validateBindTarget(const std::string& target) {
  if (target.empty() || target[0] != '/') {
    return Error::make(Code::kInvalidArgument, "volume target must be an absolute path: " + target);
  }
  if (moat::normalizePath(target) != target && moat::normalizePath(target) + "/" != target) {
    return Error::make(Code::kInvalidArgument, "volume target must be a plain path (no '.', '..' or '//'): " + target);
  }
  std::string t = moat::normalizePath(target);
  for (const char* reserved : {"/", "/proc", "/dev", "/sys"}) {
    std::string r = reserved;
    if (t == r || (r != "/" && t.compare(0, r.size() + 1, r + "/") == 0)) {
      return Error::make(Code::kInvalidArgument, "volume target " + target + " is reserved");
    }
  }
  return {};
}

Result<std::string> ensureDevSkeleton(const std::string& poolRoot) {
  return ensureBuiltDirectory(poolRoot + "/skeletons", "dev-v1", buildDevSkeleton);
}

std::vector<std::pair<std::string, std::string>> environmentFiles(const std::string& hostname) {
  return {{"hostname", hostname + "\n"}, {"hosts", "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 " + hostname + "\n"}};
}

namespace {

// A volume made just now: its upper layer is empty and no process has seen
// it, so the files every environment gets are written here, on the host
// (an overlay's copy-up made the child's writes cost ~0.3 ms more). Every
// name is new (mkdirat and O_EXCL fail on anything there) and every owner
// is set through a descriptor.
Status writeFreshEnvironmentFiles(int upper, int lowerFd, const std::string& hostname, uid_t uid, gid_t gid) {
  MOAT_ASSIGN(bool made, os::makeDirAt(upper, "etc", 0755));
  if (!made) return Error::make(Code::kConflict, "a new volume already holds etc");
  MOAT_ASSIGN(UniqueFd etc, os::openAt(upper, "etc", O_PATH | O_DIRECTORY, os::kResolveStrict));
  MOAT_TRY(os::chownFd(etc.get(), uid, gid));
  for (const auto& [name, content] : environmentFiles(hostname)) {
    MOAT_TRY(os::createFileAt(etc.get(), name, 0644, content));
    MOAT_ASSIGN(UniqueFd file, os::openAt(etc.get(), name, O_PATH, os::kResolveStrict));
    MOAT_TRY(os::chownFd(file.get(), uid, gid));
  }
  // /workspace and /tmp where the template has none (a link of the
  // template's counts as one: it is the template's choice).
  for (auto [name, mode] : {std::pair{"workspace", 0755}, std::pair{"tmp", 01777}}) {
    struct stat st;
    if (::fstatat(lowerFd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) continue;
    MOAT_TRY(os::makeDirectoryAt(upper, name, 0700));
    MOAT_TRY(os::chmodDirectory(upper, name, static_cast<mode_t>(mode)));
    MOAT_ASSIGN(UniqueFd dir, os::openAt(upper, name, O_PATH | O_DIRECTORY, os::kResolveStrict));
    MOAT_TRY(os::chownFd(dir.get(), uid, gid));
  }
  return {};
}

}  // namespace

Result<RootPlan> prepareRoot(const std::string& volumeDir, int lowerFd, const std::string& hostname, uid_t hostRootUid,
                             gid_t hostRootGid) {
  RootPlan plan;
  plan.lowerFd = lowerFd;
  plan.lowerMountPoint = volumeDir + "/lower";
  plan.upperDir = volumeDir + "/upper";
  plan.workDir = volumeDir + "/work";
  plan.rootMountPoint = volumeDir + "/root";
  plan.volumeDir = volumeDir;
  plan.hostRootUid = hostRootUid;
  plan.hostRootGid = hostRootGid;
  // The volume's top holds only what moat made; below upper/ is the
  // environment's, and nothing here resolves a path there.
  MOAT_ASSIGN(UniqueFd volume, os::open(volumeDir, O_PATH | O_DIRECTORY | O_NOFOLLOW));
  for (const char* dir : {"lower", "work", "root"}) {
    MOAT_TRY(os::makeDirectoryAt(volume.get(), dir, 0700));
  }
  // The upper layer's top is / inside: owned by the environment's root. A
  // copy of a snapshot (fork, restore) has one, written by an environment:
  // its files are then written by the child, as the environment's root.
  MOAT_ASSIGN(bool fresh, os::makeDirAt(volume.get(), "upper", 0755));
  MOAT_ASSIGN(UniqueFd upper, os::openAt(volume.get(), "upper", O_PATH | O_DIRECTORY, os::kResolveStrict));
  MOAT_TRY(os::chownFd(upper.get(), hostRootUid, hostRootGid));
  if (fresh) {
    MOAT_TRY(writeFreshEnvironmentFiles(upper.get(), lowerFd, hostname, hostRootUid, hostRootGid));
    plan.environmentFilesWritten = true;
  }
  return plan;
}

Status addBind(RootPlan& plan, const std::string& source, const std::string& target, bool readOnly, bool idmapped) {
  MOAT_ASSIGN(UniqueFd fd, os::openHostPath(source, "bind source"));
  MOAT_ASSIGN(struct stat st, os::statFd(fd.get()));
  plan.binds.push_back({fd.get(), target, readOnly, S_ISDIR(st.st_mode), idmapped});
  plan.bindSources.push_back(std::move(fd));
  return {};
}

Status detachTrees(RootPlan& plan, int usernsFd) {
  MOAT_ASSIGN(plan.lowerTree, os::cloneTree(plan.lowerFd, false));
  MOAT_TRY(setAttrs(plan.lowerTree.get(), true, usernsFd));
  plan.bindTrees.clear();
  for (const auto& bind : plan.binds) {
    MOAT_ASSIGN(UniqueFd tree, os::cloneTree(bind.sourceFd, false));
    MOAT_TRY(setAttrs(tree.get(), bind.readOnly, bind.idmapped ? usernsFd : -1));
    plan.bindTrees.push_back(std::move(tree));
  }
  return {};
}

Status buildRoot(const RootPlan& plan, int usernsFd) {
  MOAT_TRY(os::makeRootPrivate());
  MOAT_TRY(os::attachTree(plan.lowerTree.get(), plan.lowerMountPoint));
  traceStage("root: lower");
  // volatile: no syncs for a layer that is thrown away with the environment.
  // The layers are named relative to the volume directory, so the options
  // that /proc/self/mountinfo shows inside do not reveal host paths.
  MOAT_TRY(os::changeDirectory(plan.volumeDir));
  MOAT_TRY(os::mount("overlay", plan.rootMountPoint, "overlay", MS_NOSUID | MS_NODEV,
                     "lowerdir=lower,upperdir=upper,workdir=work,volatile"));
  traceStage("root: overlay");
  // The binds were copied off the host by the parent (detachTrees), /dev is
  // now; after the pivot no path leads out of the environment's tree.
  MOAT_ASSIGN(UniqueFd devTree, os::cloneTree(plan.devDir, false));
  MOAT_TRY(setAttrs(devTree.get(), true, usernsFd, true));
  MOAT_TRY(os::pivotInto(plan.rootMountPoint));
  traceStage("root: pivot");
  MOAT_ASSIGN(UniqueFd root, os::openAt(AT_FDCWD, "/", O_PATH | O_DIRECTORY, 0));
  for (size_t i = 0; i < plan.binds.size(); ++i) {
    const auto& bind = plan.binds[i];
    MOAT_ASSIGN(UniqueFd target,
                mountPoint(root.get(), bind.target, bind.directory, plan.hostRootUid, plan.hostRootGid));
    MOAT_TRY(os::attachTree(plan.bindTrees[i].get(), target.get(), bind.target));
  }
  traceStage("root: binds");
  os::MountAttrs proc;
  proc.noExec = true;
  MOAT_TRY(mountNew(root.get(), "/proc", "proc", {{"source", "proc"}}, proc, plan.hostRootUid, plan.hostRootGid));
  for (const auto& file : plan.procFiles) {
    auto target = os::openAt(root.get(), file.target.substr(1), O_PATH, os::kResolveStrict);
    if (!target.ok() && target.error().sysErrno == ENOENT) continue;  // a kernel without it (swaps)
    if (!target.ok()) return target.error();
    MOAT_TRY(os::attachTree(file.tree.get(), target->get(), file.target));
  }
  traceStage("root: proc");
  MOAT_TRY(mountDev(root.get(), std::move(devTree), plan));
  traceStage("root: dev");
  return maskProc();
}

Status writeEnvironmentFiles(const std::string& hostname) {
  MOAT_ASSIGN(UniqueFd root, os::openAt(AT_FDCWD, "/", O_PATH | O_DIRECTORY, 0));
  // Every environment has a writable /workspace (the default working
  // directory) and /tmp, whatever the template holds.
  for (auto [name, mode] : {std::pair{"workspace", 0755}, std::pair{"tmp", 01777}}) {
    MOAT_ASSIGN(bool made, os::makeDirAt(root.get(), name, 0700));
    if (made) MOAT_TRY(os::chmodDirectory(root.get(), name, static_cast<mode_t>(mode)));
  }
  MOAT_TRY(os::makeDirAt(root.get(), "etc", 0755));
  // /etc itself, on the environment's own file system: a link there (to a
  // directory elsewhere inside, or a chain of them) is the environment's
  // choice, and its files are then left as it made them.
  auto etc = os::openAt(root.get(), "etc", O_PATH | O_DIRECTORY, os::kResolveStrict | RESOLVE_NO_XDEV);
  if (!etc.ok()) return layoutInTheWay(etc.error()) ? Status{} : Status(etc.error());
  for (const auto& [name, content] : environmentFiles(hostname)) {
    Status s = os::replaceFileAt(etc->get(), name, content, 0644);
    if (!s.ok() && !layoutInTheWay(s.error()))
      return Error{s.error().code, s.error().sysErrno, "/etc/" + name + ": " + s.error().context};
  }
  return {};
}

}  // namespace moat::isolation::fs
