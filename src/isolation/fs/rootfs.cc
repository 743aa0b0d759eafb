#include "isolation/fs/rootfs.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/trace.h"
#include "common/unique_fd.h"
#include "isolation/fs/built_dir.h"
#include "os/file.h"
#include "os/mount.h"

namespace moat::isolation::fs {
namespace {

// /proc entries that leak host kernel state or allow host-wide actions.
constexpr const char* kProcHidden[] = {"/proc/kcore", "/proc/keys", "/proc/timer_list",
                                       "/proc/sysrq-trigger", "/proc/kallsyms", "/proc/kmsg"};
constexpr const char* kProcReadOnly[] = {"/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq",
                                         "/proc/pressure"};

// Attaches a detached copy of `source` at `target`, with ids mapped through
// usernsFd when the file system supports it.
Status attachIdmapped(const std::string& source, const std::string& target, bool readOnly,
                      int usernsFd, bool devices = false) {
  MOAT_ASSIGN(UniqueFd tree, os::cloneTree(source, false));
  os::MountAttrs attrs;
  attrs.readOnly = readOnly;
  attrs.noDev = !devices;
  attrs.noExec = devices;
  attrs.idmapUsernsFd = usernsFd;
  Status s = os::setMountAttrs(tree.get(), attrs, false);
  if (!s.ok()) {
    // Some file systems cannot be idmapped: their files then show as
    // nobody inside, but are still usable read-only.
    attrs.idmapUsernsFd = -1;
    MOAT_TRY(os::setMountAttrs(tree.get(), attrs, false));
  }
  return os::attachTree(tree.get(), target);
}

Status ensureMountPoint(const std::string& path, bool directory, uid_t uid, gid_t gid) {
  if (os::exists(path)) return {};
  std::string parent = path.substr(0, path.rfind('/'));
  if (!parent.empty() && !os::exists(parent)) MOAT_TRY(ensureMountPoint(parent, true, uid, gid));
  if (directory) {
    MOAT_TRY(os::makeDir(path, 0755));
  } else {
    MOAT_TRY(os::writeFile(path, "", 0644));
  }
  return os::chown(path, uid, gid);
}

Status buildDevSkeleton(const std::string& dir) {
  struct Node {
    const char* name;
    unsigned major, minor;
  };
  constexpr Node kNodes[] = {{"null", 1, 3},    {"zero", 1, 5},    {"full", 1, 7},
                             {"random", 1, 8},  {"urandom", 1, 9}, {"tty", 5, 0}};
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

Status mountDev(const std::string& root, const RootPlan& plan, int usernsFd) {
  std::string dev = root + "/dev";
  MOAT_TRY(attachIdmapped(plan.devDir, dev, true, usernsFd, true));
  MOAT_TRY(os::mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                     "newinstance,ptmxmode=0666,mode=0620,gid=" +
                         std::to_string(plan.hostRootGid + 5)));
  return os::mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV,
                   "mode=1777,uid=" + std::to_string(plan.hostRootUid) +
                       ",gid=" + std::to_string(plan.hostRootGid));
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

}  // namespace

Status validateBindTarget(const std::string& target) {
  if (target.empty() || target[0] != '/') {
    return Error::make("invalid_argument", "volume target must be an absolute path: " + target);
  }
  if (os::normalizePath(target) != target && os::normalizePath(target) + "/" != target) {
    return Error::make("invalid_argument", "volume target must be a plain path (no '.', '..' or '//'): " + target);
  }
  std::string t = os::normalizePath(target);
  for (const char* reserved : {"/", "/proc", "/dev", "/sys"}) {
    std::string r = reserved;
    if (t == r || (r != "/" && t.compare(0, r.size() + 1, r + "/") == 0)) {
      return Error::make("invalid_argument", "volume target " + target + " is reserved");
    }
  }
  return {};
}

Result<std::string> ensureDevSkeleton(const std::string& stateDir) {
  struct statvfs vfs;
  if (::statvfs(stateDir.c_str(), &vfs) == 0 && (vfs.f_flag & ST_NODEV)) {
    return Error::make("unsupported", "the state directory " + stateDir +
                                          " is on a nodev file system; device nodes for /dev "
                                          "cannot work there (choose another --state)");
  }
  return ensureBuiltDirectory(stateDir + "/templates", "dev-v1", buildDevSkeleton);
}

Result<RootPlan> prepareRoot(const std::string& volumeDir, const std::string& lowerDir,
                             const std::string& hostname, uid_t hostRootUid, gid_t hostRootGid) {
  RootPlan plan;
  plan.lowerDir = lowerDir;
  plan.lowerMountPoint = volumeDir + "/lower";
  plan.upperDir = volumeDir + "/upper";
  plan.workDir = volumeDir + "/work";
  plan.rootMountPoint = volumeDir + "/root";
  plan.volumeDir = volumeDir;
  plan.hostRootUid = hostRootUid;
  plan.hostRootGid = hostRootGid;
  for (const auto& dir : {plan.lowerMountPoint, plan.workDir, plan.rootMountPoint}) {
    MOAT_TRY(os::makeDir(dir, 0700));
  }
  // The upper layer's top directories decide ownership of / and /etc inside.
  MOAT_TRY(os::makeDir(plan.upperDir, 0755));
  MOAT_TRY(os::makeDir(plan.upperDir + "/etc", 0755));
  MOAT_TRY(os::writeFile(plan.upperDir + "/etc/hostname", hostname + "\n"));
  MOAT_TRY(os::writeFile(plan.upperDir + "/etc/hosts",
                         "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 " + hostname + "\n"));
  for (const char* path : {"", "/etc", "/etc/hostname", "/etc/hosts"}) {
    MOAT_TRY(os::chown(plan.upperDir + path, hostRootUid, hostRootGid));
  }
  // Every environment has a writable /workspace (the default working
  // directory) and /tmp, whatever the template holds.
  for (auto [name, mode] : {std::pair{"/workspace", 0755}, std::pair{"/tmp", 01777}}) {
    if (os::isDirectory(lowerDir + name)) continue;
    MOAT_TRY(os::makeDir(plan.upperDir + name, 0755));
    ::chmod((plan.upperDir + name).c_str(), static_cast<mode_t>(mode));
    MOAT_TRY(os::chown(plan.upperDir + name, hostRootUid, hostRootGid));
  }
  return plan;
}

Status buildRoot(const RootPlan& plan, int usernsFd) {
  MOAT_TRY(os::makeRootPrivate());
  MOAT_TRY(attachIdmapped(plan.lowerDir, plan.lowerMountPoint, true, usernsFd));
  traceStage("root: lower");
  // volatile: no syncs for a layer that is thrown away with the environment.
  // The layers are named relative to the volume directory, so the options
  // that /proc/self/mountinfo shows inside do not reveal host paths.
  MOAT_TRY(os::changeDirectory(plan.volumeDir));
  MOAT_TRY(os::mount("overlay", plan.rootMountPoint, "overlay", MS_NOSUID | MS_NODEV,
                     "lowerdir=lower,upperdir=upper,workdir=work,volatile"));
  const std::string& root = plan.rootMountPoint;
  traceStage("root: overlay");
  for (const auto& bind : plan.binds) {
    std::string target = root + bind.target;
    MOAT_TRY(ensureMountPoint(target, os::isDirectory(bind.source), plan.hostRootUid,
                              plan.hostRootGid));
    MOAT_TRY(attachIdmapped(bind.source, target, bind.readOnly, usernsFd));
  }
  traceStage("root: binds");
  MOAT_TRY(ensureMountPoint(root + "/proc", true, plan.hostRootUid, plan.hostRootGid));
  MOAT_TRY(os::mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC));
  MOAT_TRY(ensureMountPoint(root + "/dev", true, plan.hostRootUid, plan.hostRootGid));
  traceStage("root: proc");
  MOAT_TRY(mountDev(root, plan, usernsFd));
  traceStage("root: dev");
  MOAT_TRY(os::pivotInto(root));
  traceStage("root: pivot");
  return maskProc();
}

}  // namespace moat::isolation::fs
