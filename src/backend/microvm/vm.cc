#include "backend/microvm/vm.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/landlock.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <utility>

#include "backend/microvm/initramfs.h"
#include "backend/microvm/qmp.h"
#include "common/hex.h"
#include "init/guest.h"
#include "init/protocol.h"
#include "isolation/caps/capabilities.h"
#include "isolation/fs/helper_root.h"
#include "isolation/seccomp/policy.h"
#include "os/block.h"
#include "os/file.h"
#include "os/netlink.h"
#include "os/process.h"
#include "os/security.h"
#include "os/socket.h"
#include "os/tool.h"

namespace moat::backend::microvm {

Result<std::string> findProgram(const char* envName, const char* name, const char* package) {
  if (const char* named = std::getenv(envName); named && *named) return std::string(named);
  std::string path = os::executableIn(name, {"/usr/bin", "/usr/sbin", "/bin", "/sbin"});
  if (!path.empty()) return path;
  return Error::make(Code::kMissingDependency,
                     std::string(name) + " not found: microVMs need it (apt-get install " + package + ")");
}

Result<isolation::fs::Template> imageableTemplate(const std::string& templateName, const std::string& stateDir,
                                                  struct stat& top) {
  MOAT_ASSIGN(auto tmpl, isolation::fs::resolveTemplate(templateName, stateDir));
  if (!tmpl.hostReadOnlyDirs.empty()) {
    return Error::make(Code::kUnsupported,
                       "isolation microvm needs a root file system: an imported template or a directory (the host's "
                       "own tree is not made into an image; docs/MICROVM.md)");
  }
  // mkfs.erofs reads the tree as root by its paths: one that someone other
  // than root may write could be rewritten under it.
  if (::fstat(tmpl.lower.get(), &top) != 0) return Error::fromErrno("stat " + tmpl.lowerDir);
  if (top.st_uid != 0 || (top.st_mode & 022) != 0) {
    return Error::make(Code::kInvalidArgument, "template " + tmpl.lowerDir +
                                                   ": a microVM's template directory must be root's and writable "
                                                   "by root alone (its image is made as root from its paths)");
  }
  return tmpl;
}

Status buildRootImage(int treeFd, const std::string& image) {
  MOAT_ASSIGN(std::string mkfs, findProgram("MOAT_MKFS_EROFS", "mkfs.erofs", "erofs-utils"));
  // mkfs.erofs walks the tree by its paths, as root: a link swapped in
  // while it reads (by whoever may write somewhere in the tree, a /tmp
  // say) must reach nothing of the host's. Landlock lets it read the tree,
  // its own program (wherever MOAT_MKFS_EROFS puts it) and libraries, and
  // write the image's directory only.
  const std::string out = image.substr(0, image.rfind('/'));
  MOAT_ASSIGN(UniqueFd outDir, os::open(out.empty() ? "/" : out, O_PATH | O_DIRECTORY | O_CLOEXEC));
  constexpr uint64_t kRead = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
  std::vector<os::LandlockRule> rules = {
      {treeFd, kRead},
      {outDir.get(), kRead | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_MAKE_REG |
                         LANDLOCK_ACCESS_FS_REMOVE_FILE | (1ULL << 14) /* TRUNCATE */}};
  std::vector<UniqueFd> held;
  for (const std::string& path : {mkfs, std::string("/usr"), std::string("/lib"), std::string("/lib64"),
                                  std::string("/etc/ld.so.cache"), std::string("/dev/urandom")}) {
    auto fd = os::open(path, O_PATH | O_CLOEXEC);
    if (!fd.ok()) continue;  // not on this host
    rules.push_back({fd->get(), kRead | LANDLOCK_ACCESS_FS_EXECUTE});
    held.push_back(std::move(fd.value()));
  }
  MOAT_ASSIGN(UniqueFd ruleset, os::landlockFileRuleset(rules));
  os::ToolRun run;
  run.landlockRuleset = ruleset.get();
  // The tree as this process holds it, handed over as mkfs.erofs's fd 3:
  // /proc/self/fd/3 jumps to it whatever its path names now, and "/."
  // makes the source the directory itself.
  run.passFd = treeFd;
  const std::string tree = "/proc/self/fd/3/.";
  run.argv = {mkfs, "-T0", image, tree};
  run.deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  MOAT_TRY(os::runTool(run));
  // Readable by every QEMU's own ids, whatever the umask (its directory
  // keeps others out).
  MOAT_ASSIGN(UniqueFd made, os::open(image, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (::fchmod(made.get(), 0644) != 0) return Error::fromErrno("chmod " + image);
  return {};
}

Status writeLayerDisk(const std::string& path, uint64_t bytes, uid_t uid, gid_t gid) {
  MOAT_ASSIGN(std::string mkfs, findProgram("MOAT_MKFS_EXT4", "mkfs.ext4", "e2fsprogs"));
  MOAT_ASSIGN(UniqueFd disk, os::open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  // Written in place: a guest rewriting its blocks does not pile up
  // copies its volume's bound would count (set while it is empty).
  MOAT_TRY(os::setNoCopyOnWrite(disk.get()));
  if (::ftruncate(disk.get(), static_cast<off_t>(bytes)) != 0) return Error::fromErrno("size " + path);
  // A file of moatd's own, new: handed over as mkfs.ext4's fd 3. Its
  // tables are written lazily (by the guest's kernel, as it needs them).
  os::ToolRun run;
  run.passFd = disk.get();
  run.argv = {
      mkfs, "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", "/proc/self/fd/3"};
  run.deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  MOAT_TRY(os::runTool(run));
  if ((uid != 0 || gid != 0) && ::fchown(disk.get(), uid, gid) != 0) return Error::fromErrno("chown " + path);
  return {};
}

isolation::cgroup::Limits qemuLimits(double cpus, uint64_t memoryMb, bool kvm) {
  constexpr uint64_t kQemuOverheadMb = 128;  // measured: docs/MICROVM.md
  constexpr uint64_t kQemuTasks = 256;
  isolation::cgroup::Limits limits;
  limits.cpus = cpus;
  limits.memoryBytes = (memoryMb + kQemuOverheadMb + (kvm ? 0 : kTcgCacheMb)) << 20;
  limits.pids = kQemuTasks;
  return limits;
}

Status writeGuestInitramfs(const GuestKernel& kernel, const std::string& initBinary, const std::string& path) {
  MOAT_ASSIGN(std::string archive, guestInitramfs(kernel, initBinary));
  MOAT_TRY(os::writeFile(path, archive, 0644));
  MOAT_ASSIGN(UniqueFd made, os::open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (::fchmod(made.get(), 0644) != 0) return Error::fromErrno("chmod " + path);
  return {};
}

Result<std::string> guestInitramfs(const GuestKernel& kernel, const std::string& initBinary) {
  std::vector<CpioEntry> entries;
  for (const char* dir : {"dev", "proc", "sys", "moat", "moat/modules.d"})
    entries.push_back({dir, S_IFDIR | 0755, "", 0, 0});
  entries.push_back({"dev/console", S_IFCHR | 0600, "", 5, 1});
  MOAT_ASSIGN(std::string init, os::readFile(initBinary, 64 << 20));
  entries.push_back({"init", S_IFREG | 0755, std::move(init), 0, 0});
  std::string list;
  if (auto dep = os::readFile(kernel.modulesDir + "/modules.dep", 16 << 20); dep.ok()) {
    MOAT_ASSIGN(auto order, moduleLoadOrder(dep.value(), guestModules()));
    int n = 0;
    for (const auto& path : order) {
      MOAT_ASSIGN(std::string data, os::readFile(kernel.modulesDir + "/" + path, 64 << 20));
      if (path.size() > 3 && path.compare(path.size() - 3, 3, ".ko") != 0) {
        return Error::make(Code::kUnsupported,
                           "guest module " + path + " is compressed: moat-init loads plain .ko files");
      }
      std::string name = "moat/modules.d/" + std::to_string(n++) + ".ko";
      entries.push_back({name, S_IFREG | 0644, std::move(data), 0, 0});
      list += "/" + name + "\n";
    }
  }
  entries.push_back({std::string(init::kGuestModuleList).substr(1), S_IFREG | 0644, list, 0, 0});
  return newcArchive(entries);
}

uint64_t hostTscKhz() {
  auto info = os::readFile("/proc/cpuinfo", 1 << 20);
  if (info.ok()) {
    std::istringstream lines(info.value());
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("cpu MHz", 0) != 0) continue;
      double mhz = std::atof(line.substr(line.find(':') + 1).c_str());
      if (mhz > 0) return static_cast<uint64_t>(mhz * 1000);
    }
  }
  return 2000000;
}

namespace {

// A lasting VM's socket `name` in its directory, listening (made) or
// connected to, reached through the directory's descriptor: the state
// directory's path may be longer than a unix socket's 108 bytes.
Result<UniqueFd> socketIn(const std::string& dir, const char* name, bool listen) {
  MOAT_ASSIGN(UniqueFd at, os::open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  const std::string path = "/proc/self/fd/" + std::to_string(at.get()) + "/" + name;
  if (listen) return os::listenUnixStream(path, 1);
  return os::connectUnixStream(path);
}

}  // namespace

std::vector<std::string> qemuArgv(const std::string& qemu, const VmSpec& spec) {
  // moat-init powers the guest off when it ends; should it crash, the
  // kernel's panic resets at once by a triple fault (reboot=t), which ends
  // QEMU (-no-reboot) whatever the machine offers to reset with.
  std::string cmdline = "console=ttyS0 quiet panic=-1 reboot=t rdinit=/init";
  const bool disk = !spec.disk.empty() || spec.scratchDisk;
  if (disk) cmdline += " MOAT_GUEST_DISK=1";
  if (spec.park) {
    // What makes one environment's guest differ comes with Resume.
    cmdline += " MOAT_GUEST_PARK=1";
  } else {
    cmdline += " MOAT_GUEST_STORAGE=" + std::to_string(spec.storageBytes);
    if (spec.pids > 0) cmdline += " MOAT_GUEST_PIDS=" + std::to_string(spec.pids);
    if (!spec.hostname.empty()) cmdline += " MOAT_GUEST_HOSTNAME=" + spec.hostname;
  }
  // What moat-init keeps once its root is made: a namespace environment's
  // init's, SYS_BOOT to power the guest off and SYS_TIME to set the guest's
  // clock after a restore (FileOp kClock); its commands drop SYS_PTRACE,
  // SYS_BOOT and SYS_TIME (init/launch.cc).
  uint64_t caps = (1ull << CAP_SYS_BOOT) | (1ull << CAP_SYS_TIME);
  for (int cap : isolation::caps::initCapabilities()) caps |= 1ull << cap;
  cmdline += " MOAT_GUEST_CAPS=" + std::to_string(caps);
  if (!spec.kvm) cmdline += " tsc_early_khz=" + std::to_string(hostTscKhz());
  cmdline += " -- --guest";
  auto fd = [](int n) { return "/proc/self/fd/" + std::to_string(n); };
  std::vector<std::string> argv = {
      qemu, "-M", spec.kvm ? "microvm" : "microvm,pit=on", "-accel",
      spec.kvm ? "kvm" : "tcg,tb-size=" + std::to_string(kTcgCacheMb), "-cpu", spec.kvm ? "host" : "qemu64", "-smp",
      std::to_string(spec.cpus), "-m", std::to_string(spec.memoryMb), "-sandbox",
      "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny", "-nodefaults", "-no-user-config",
      "-nographic", "-no-reboot", "-chardev", "null,id=console,logfile=" + fd(2) + ",logappend=on", "-serial",
      "chardev:console", "-kernel", spec.kernel.image, "-initrd", fd(kQemuInitramfsFd), "-append", cmdline, "-drive",
      "id=root,file=" + fd(kQemuRootFd) + ",format=raw,if=none,readonly=on,file.locking=off", "-device",
      std::string("virtio-blk-device,drive=root,serial=") + init::kGuestRootSerial, "-device", "virtio-serial-device",
      "-chardev",
      "socket,id=control,fd=" + std::to_string(kQemuControlFd) + (spec.lasting ? ",server=on,wait=off" : ""), "-device",
      std::string("virtserialport,chardev=control,name=") + init::kGuestPortName,
      // The guest's NIC, on QEMU's user-mode network: what the guest sends
      // out, QEMU sends from its own network namespace, which has moatd's
      // egress link when the environment has a network policy (the
      // backend's networkNamespace) and nothing otherwise. No IPv6.
      "-netdev",
      "user,id=net,ipv6=off,net=" + os::ipv4ToString(htonl(init::kGuestNetwork)) + "/" +
          std::to_string(init::kGuestPrefixLen) + ",host=" + os::ipv4ToString(htonl(init::kGuestGateway)) +
          ",dhcpstart=" + os::ipv4ToString(htonl(init::kGuestAddress)),
      "-device", "virtio-net-device,netdev=net"};
  if (spec.monitor) {
    for (std::string a :
         {std::string("-chardev"),
          "socket,id=monitor,fd=" + std::to_string(kQemuMonitorFd) + (spec.lasting ? ",server=on,wait=off" : ""),
          std::string("-mon"), std::string("chardev=monitor,mode=control")}) {
      argv.push_back(a);
    }
  }
  if (disk) {
    // The writable layer: the guest's own file (written through QEMU's
    // host page cache; a snapshot stops the guest, which drains it first),
    // or a scratch disk that reads zeros and keeps nothing.
    argv.push_back("-drive");
    argv.push_back("id=disk,if=none," +
                   (spec.scratchDisk ? "driver=null-co,read-zeroes=on,size=" + std::to_string(kScratchDiskBytes)
                                     : "file=" + fd(kQemuDiskFd) + ",format=raw,file.locking=off") +
                   // An error writing it (its volume's bound reached) is
                   // the guest's to see, not a reason to stop the guest.
                   ",werror=report,rerror=report");
    argv.push_back("-device");
    argv.push_back(std::string("virtio-blk-device,drive=disk,serial=") + init::kGuestDiskSerial);
  }
  if (spec.incomingState >= 0) {
    argv.push_back("-incoming");
    argv.push_back("fd:" + std::to_string(kQemuIncomingFd));
  }
  return argv;
}

// What QEMU may reach of the host's files once it runs (Landlock; docs/
// MICROVM.md): its program, libraries, firmware and modules (/usr, read
// and run), the guest kernel, the descriptors it was given (found again by
// /proc/self/fd/N: their files), /dev/kvm when it is used, and a few files
// it reads to learn the host (read only). Nothing else: an escaped QEMU
// reads no /tmp, /home, /run or other environments' files and writes
// nothing but its console log.
Result<std::vector<QemuPath>> qemuPaths(const VmSpec& spec, const std::string& qemu, bool ownRoot) {
  constexpr uint64_t kRead = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
  constexpr uint64_t kRun = kRead | LANDLOCK_ACCESS_FS_EXECUTE;
  std::vector<QemuPath> paths;
  auto allow = [&](const std::string& path, uint64_t access, bool needed) -> Status {
    auto fd = os::open(path, O_PATH | O_CLOEXEC);
    if (!fd.ok()) {
      if (needed) return fd.error();
      return {};
    }
    paths.push_back({path, std::move(fd.value()), access});
    return {};
  };
  MOAT_TRY(allow("/usr", kRun, true));
  // Wherever MOAT_QEMU puts it: its program, and the tree it finds its
  // firmware and modules in (<bindir>/../share/qemu, ../lib/.../qemu).
  MOAT_TRY(allow(qemu, kRun, true));
  const std::string bin = qemu.substr(0, qemu.rfind('/'));
  if (const auto up = bin.rfind('/'); up != std::string::npos && up > 0)
    MOAT_TRY(allow(bin.substr(0, up), kRun, false));
  // Links into /usr on a merged-/usr host (a MOAT_QEMU that is a script
  // finds its /bin/sh).
  for (const char* path : {"/bin", "/lib", "/lib64"}) MOAT_TRY(allow(path, kRun, false));
  for (const char* path :
       {"/etc/ld.so.cache", "/etc/localtime", "/dev/urandom", "/sys/devices/system", "/sys/bus/nd"}) {
    MOAT_TRY(allow(path, kRead, false));
  }
  // libselinux, linked into QEMU, reads it (a root of QEMU's own has a
  // proc without it: libselinux then takes the host for one without).
  if (!ownRoot) MOAT_TRY(allow("/proc/filesystems", kRead, false));
  MOAT_TRY(allow(spec.kernel.image, kRead, true));
  if (spec.kvm) {
    MOAT_TRY(allow("/dev/kvm", kQemuKvmAccess, true));
  }
  return paths;
}

Result<UniqueFd> qemuRuleset(const std::vector<QemuPath>& paths, const std::vector<int>& given, int console, int disk) {
  std::vector<os::LandlockRule> rules;
  for (const auto& path : paths) rules.push_back({path.fd.get(), path.access});
  for (int fd : given) rules.push_back({fd, LANDLOCK_ACCESS_FS_READ_FILE});
  rules.push_back({console, LANDLOCK_ACCESS_FS_WRITE_FILE});
  if (disk >= 0) rules.push_back({disk, LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE});
  return os::landlockFileRuleset(rules);
}

Result<Vm> Vm::start(const VmSpec& given) {
  // QEMU runs in a root of its own where moat can make one (as root: mount
  // and pid namespaces), which holds the host's paths it needs where they
  // really are: its program and kernel are named so.
  const bool ownRoot = ::geteuid() == 0;
  VmSpec spec = given;
  MOAT_ASSIGN(std::string qemu, findProgram("MOAT_QEMU", "qemu-system-x86_64", "qemu-system-x86"));
  if (ownRoot) {
    MOAT_ASSIGN(qemu, os::realPath(qemu));
    MOAT_ASSIGN(spec.kernel.image, os::realPath(spec.kernel.image));
  }
  std::string initramfs = spec.initramfs;
  if (initramfs.empty()) {
    initramfs = spec.workDir + "/initramfs";
    MOAT_TRY(writeGuestInitramfs(spec.kernel, spec.initBinary, initramfs));
  }
  Vm vm;
  const std::string consoleLog = spec.consoleLog.empty() ? spec.workDir + "/console.log" : spec.consoleLog;
  // Made here and read through this descriptor; QEMU gets it as its stderr.
  MOAT_ASSIGN(vm.console_, os::open(consoleLog, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  // QEMU reopens its descriptors by /proc/self/fd/N, which checks the
  // file's mode against its ids: the console is its own to write, the
  // images are readable by anyone (their directories are not).
  if ((spec.uid != 0 || spec.gid != 0) && ::fchown(vm.console_.get(), spec.uid, spec.gid) != 0) {
    return Error::fromErrno("chown " + consoleLog);
  }
  MOAT_ASSIGN(UniqueFd root, os::open(spec.rootImage, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  MOAT_ASSIGN(UniqueFd initrd, os::open(initramfs, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  // The writable layer's disk is QEMU's to write (its own, made for it).
  UniqueFd disk;
  off_t diskBytes = 0;
  if (!spec.disk.empty()) {
    MOAT_ASSIGN(disk, os::open(spec.disk, O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (::fstat(disk.get(), &st) != 0) return Error::fromErrno("stat " + spec.disk);
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kScratchDiskBytes) {
      return Error::make(Code::kInvalidArgument, spec.disk + ": not a disk a guest can take");
    }
    diskBytes = st.st_size;
  }
  MOAT_ASSIGN(auto paths, qemuPaths(spec, qemu, ownRoot));
  MOAT_ASSIGN(UniqueFd ruleset,
              qemuRuleset(paths, {root.get(), initrd.get()}, vm.console_.get(), disk ? disk.get() : -1));
  // The same paths (and nothing else of the host's) in its root; its
  // directory is where the child attaches that root before it pivots.
  std::optional<isolation::fs::HelperRoot> helperRoot;
  if (ownRoot) {
    std::vector<isolation::fs::HelperRoot::Entry> entries;
    for (const auto& path : paths) {
      entries.push_back({path.path, path.fd.get(), (path.access & LANDLOCK_ACCESS_FS_WRITE_FILE) != 0});
    }
    MOAT_ASSIGN(helperRoot, isolation::fs::HelperRoot::make(entries, spec.workDir));
  }
  const os::RootPlan rootPlan = helperRoot ? helperRoot->plan() : os::RootPlan{};
  // QEMU's end of a connection: a connected socket, or for a lasting QEMU
  // a listening one it accepts on (this moatd's connection waits in its
  // backlog until QEMU runs).
  auto connection = [&spec](const char* name, UniqueFd& ours) -> Result<UniqueFd> {
    if (!spec.lasting) {
      MOAT_ASSIGN(auto pair, os::streamSocketPair());
      ours = std::move(pair.first);
      return std::move(pair.second);
    }
    (void)::unlink(
        (spec.workDir + "/" + name).c_str());  // a start before in the same directory (a restore that failed)
    MOAT_ASSIGN(UniqueFd listening, socketIn(spec.workDir, name, true));
    MOAT_ASSIGN(ours, socketIn(spec.workDir, name, false));
    return listening;
  };
  if (spec.lasting) vm.workDir_ = spec.workDir;
  MOAT_ASSIGN(UniqueFd qemuEnd, connection(kControlSocket, vm.control_));
  UniqueFd qemuMonitor;
  if (spec.monitor) {
    vm.monitor_ = std::make_unique<Monitor>();
    MOAT_ASSIGN(qemuMonitor, connection(kMonitorSocket, vm.monitor_->fd));
  }
  auto argv = qemuArgv(qemu, spec);
  const int console = vm.console_.get();
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  MOAT_ASSIGN(UniqueFd devNull, os::open("/dev/null", O_RDWR | O_CLOEXEC));
  // A guest being saved (parked, not restored) writes its state too
  // (through a descriptor given to its monitor): as much as its RAM, and
  // its console is moat-init's alone until then.
  const bool saving = spec.park && spec.monitor && spec.incomingState < 0;
  // A guest's disk is as large as it is made (QEMU never writes past its
  // end): then the console may grow as far, and the qgroup of the volume
  // holding both bounds them together (docs/MICROVM.md, "Storage").
  // A lasting guest may be checkpointed (its state, as large as its RAM,
  // written through a descriptor its monitor is given): as much again.
  rlim_t fileLimit =
      saving || (spec.lasting && spec.monitor) ? static_cast<rlim_t>((spec.memoryMb + 64) << 20) : spec.consoleBytes;
  fileLimit = std::max(fileLimit, static_cast<rlim_t>(diskBytes));
  const struct rlimit consoleLimit = {fileLimit, fileLimit};
  // Each source is first moved above the targets, so that no dup2 to a
  // target overwrites a source still to be placed.
  constexpr int kGiven = 10;
  const int sources[kGiven] = {devNull.get(),
                               devNull.get(),
                               console,
                               qemuEnd.get(),
                               root.get(),
                               initrd.get(),
                               qemuMonitor ? qemuMonitor.get() : devNull.get(),
                               spec.incomingState >= 0 ? spec.incomingState : devNull.get(),
                               spec.holdFd >= 0 ? spec.holdFd : devNull.get(),
                               disk ? disk.get() : devNull.get()};
  const bool lasting = spec.lasting;
  // moat's profile for QEMU (policy/seccomp/qemu.policy), before QEMU's
  // own sandbox: in force from its first instruction.
  MOAT_ASSIGN(auto seccomp, isolation::seccomp::qemuProgram());
  const sock_fprog seccompProgram = {static_cast<unsigned short>(seccomp.filter.size()), seccomp.filter.data()};
  // This process, watched by the child until its parent-death signal is
  // set (a parent gone before then sends none; in its pid namespace the
  // child cannot ask for its parent's pid). A moat that dies in the
  // microseconds between the child's reparenting and its pidfd's report
  // still escapes both; the signal follows the launching thread, the
  // pidfd the process, as getppid() did before.
  UniqueFd parentWatch;
  if (!lasting) {
    MOAT_ASSIGN(parentWatch, os::pidfdOpen(::getpid()));
  }
  const int parentFd = parentWatch.get();
  // QEMU is the first process of pid and mount namespaces of its own
  // (root makes them; an unprivileged moat run for a test cannot): no host
  // process can be signalled, traced or opened by its pid from it, and its
  // root holds only the paths it may reach, with a proc of its own pids.
  MOAT_ASSIGN(os::Child child, os::clone3({ownRoot ? static_cast<uint64_t>(CLONE_NEWPID | CLONE_NEWNS) : 0, -1}));
  if (child.pid == 0) {
    // Only async-signal-safe calls from here to the exec.
    os::resetSignals();
    // The console log is the one file QEMU writes, and what the guest
    // prints is the guest's to choose: it stops growing at spec.consoleBytes
    // (writes past it fail with EFBIG, SIGXFSZ ignored: QEMU goes on; its
    // serial port is a null device that logs to it, so what cannot be
    // logged is dropped at once, not retried byte by byte).
    ::signal(SIGXFSZ, SIG_IGN);
    if (::setrlimit(RLIMIT_FSIZE, &consoleLimit) != 0) ::_exit(125);
    // Into its cgroup while still root (the limits bound QEMU, the guest's
    // RAM and TCG's cache included), by the host's paths: before its root.
    for (const auto& join : spec.cgroupJoin) {
      int fd = ::open(join.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0 || ::write(fd, "0", 1) != 1) ::_exit(124);
      ::close(fd);
    }
    if (ownRoot) {
      const char* step = "";
      if (int err = os::enterRootInChild(rootPlan, &step); err != 0) {
        os::reportInChild(console, "moat: QEMU's own root: ", step, err);
        ::_exit(123);
      }
    }
    const int parentMoved = parentFd >= 0 ? ::fcntl(parentFd, F_DUPFD_CLOEXEC, 16) : -1;
    if (parentFd >= 0 && parentMoved < 0) ::_exit(126);
    int moved[kGiven];
    for (int i = 0; i < kGiven; ++i) {
      moved[i] = ::fcntl(sources[i], F_DUPFD, 16);
      if (moved[i] < 0) ::_exit(126);
    }
    for (int target = 0; target < kGiven; ++target) {
      if (::dup2(moved[target], target) < 0) ::_exit(126);
    }
    if (os::markCloseOnExecFrom(kGiven) != 0) ::_exit(125);
    // Its own session (a terminal's Ctrl-C is moat run's to forward to the
    // command, not QEMU's), and, while still root, network and IPC
    // namespaces of its own: a QEMU taken over reaches no host network,
    // only what moatd links into its namespace (the egress link of an
    // environment with a network policy; the guest's traffic leaves QEMU
    // from there).
    if (::setsid() < 0) ::_exit(125);
    if (::unshare(CLONE_NEWNET | CLONE_NEWIPC) != 0) ::_exit(125);
    if ((spec.uid != 0 || spec.gid != 0) && os::switchIdsInChild(spec.uid, spec.gid) != 0) ::_exit(125);
    if (::chdir("/") != 0) ::_exit(125);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(125);
    if (os::landlockRestrictInChild(ruleset.get()) != 0) ::_exit(125);
    if (os::installSeccompInChild(seccompProgram) != 0) ::_exit(125);
    // After the ids: a change of them clears it. A lasting QEMU lives on
    // for the next moatd.
    if (!lasting) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      pollfd gone{parentMoved, POLLIN, 0};
      if (::poll(&gone, 1, 0) != 0) ::_exit(127);
    }
    char* noEnvironment[] = {nullptr};
    ::execve(args[0], args.data(), noEnvironment);
    ::_exit(127);
  }
  vm.pid_ = child.pid;
  vm.pidfd_ = std::move(child.pidfd);
  return vm;
}

Result<Vm> Vm::adopt(const std::string& workDir, const std::string& consoleLog, pid_t pid) {
  Vm vm;
  MOAT_ASSIGN(vm.pidfd_, os::pidfdOpen(pid));
  vm.pid_ = pid;
  vm.adopted_ = true;
  vm.workDir_ = workDir;
  MOAT_ASSIGN(vm.console_,
              os::open(consoleLog.empty() ? workDir + "/console.log" : consoleLog, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (::access((workDir + "/" + kMonitorSocket).c_str(), F_OK) == 0) {
    vm.monitor_ = std::make_unique<Monitor>();
    MOAT_ASSIGN(vm.monitor_->fd, socketIn(workDir, kMonitorSocket, false));
  }
  return vm;
}

namespace {

// kReattach with a fresh nonce, then what comes before its kReattached
// skipped: the guest's Hello is what `fd` reads next.
Status sayWhoCame(int fd, std::chrono::milliseconds wait) {
  MOAT_ASSIGN(std::string nonce, randomBytes(16));
  MOAT_TRY(init::writeFrame(fd, init::MsgType::kReattach, nonce));
  // What the guest had written for the host that went comes first (it
  // sends nothing new until it has read kReattach): far below the bound.
  return readThrough(fd, init::encodeFrame(init::MsgType::kReattached, nonce), wait, kReattachSkipBytes);
}

}  // namespace

Result<UniqueFd> Vm::reattach(std::chrono::milliseconds wait) const {
  if (workDir_.empty()) return Error::make(Code::kUnsupported, "a QEMU that is not lasting cannot be re-attached");
  MOAT_ASSIGN(UniqueFd fd, socketIn(workDir_, kControlSocket, false));
  MOAT_TRY(sayWhoCame(fd.get(), wait));
  return fd;
}

Status Vm::resync(std::chrono::milliseconds wait) const {
  if (!control_) return Error::make(Code::kInvalidArgument, "the guest's connection was handed over");
  return sayWhoCame(control_.get(), wait);
}

Status readThrough(int fd, const std::string& mark, std::chrono::milliseconds wait, size_t maxSkip) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::string tail;  // the end of what was consumed, where the mark may begin
  size_t skipped = 0;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Error::make(Code::kTimeout, "no answer within " + std::to_string(wait.count()) + " ms");
    }
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;  // the deadline decides
    char buf[64 << 10];
    ssize_t got = ::recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return Error::make(Code::kEof, "the connection closed before the answer");
    // What is peeked is consumed through the mark, or all but its last
    // mark.size() - 1 bytes (where the mark may begin).
    const std::string peeked(buf, static_cast<size_t>(got));
    const std::string seen = tail + peeked;
    const size_t at = seen.find(mark);
    const size_t keep = mark.size() - 1;
    const size_t take =
        at != std::string::npos ? at + mark.size() - tail.size() : (peeked.size() > keep ? peeked.size() - keep : 0);
    if (take > 0 && ::recv(fd, buf, take, MSG_DONTWAIT) != static_cast<ssize_t>(take)) {
      return Error::fromErrno("read up to the answer");
    }
    if (at != std::string::npos) return {};
    const std::string consumed = tail + peeked.substr(0, take);
    tail = consumed.size() > keep ? consumed.substr(consumed.size() - keep) : consumed;
    skipped += take;
    if (take == 0) ::usleep(1000);  // fewer bytes than the mark: more are on their way
    if (skipped > maxSkip)
      return Error::make(Code::kProtocol, "more than " + std::to_string(maxSkip) + " bytes before the answer");
  }
}

Status Vm::awaitGuest(std::chrono::milliseconds wait) const {
  auto failed = [this](const std::string& why) {
    std::string tail = os::tailOf(consoleTail(), 1024);
    return Error::make(Code::kToolFailed, why + (tail.empty() ? "" : "; its console ended with:\n" + tail));
  };
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    pollfd fds[2] = {{control_.get(), POLLIN, 0}, {pidfd_.get(), POLLIN, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    int n = ::poll(fds, 2, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return failed("the guest did not answer within " + std::to_string(wait.count() / 1000) + " s");
    if (n < 0 || (fds[1].revents & POLLIN)) return failed("the guest ended before it answered");
    char byte;
    ssize_t got = ::recv(control_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got == 1) return {};
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    // The connection closed as the guest went.
    return failed("the guest ended before it answered");
  }
}

std::string Vm::whyEnded(std::chrono::milliseconds wait) const {
  auto status = os::exitStatusOf(pidfd_.get(), static_cast<int>(wait.count()));
  if (!status && adopted_) {
    // Not this process's child: whether it ended is all it can tell.
    pollfd p{pidfd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) == 1) {
      const std::string console = consoleTail();
      if (console.find("Kernel panic - ") == std::string::npos) {
        return "QEMU ended (started by an earlier moatd: how, this one cannot tell)" +
               (console.empty() ? std::string() : "; the guest's console ended with:\n" + os::tailOf(console, 300));
      }
    }
  }
  // The kernel's last words: "Kernel panic - not syncing: ..." (printed
  // whatever the console's log level).
  const std::string console = consoleTail();
  std::string panic;
  for (size_t at = console.find("Kernel panic - "); at != std::string::npos;
       at = console.find("Kernel panic - ", at + 1)) {
    panic = console.substr(at, console.find('\n', at) - at);
  }
  if (!panic.empty()) {
    while (!panic.empty() && (panic.back() == '\r' || panic.back() == ' ')) panic.pop_back();
    return "the guest's console reports a kernel panic (" + os::tailOf(panic, 300) + ")";
  }
  if (!status) return "the guest's connection ended while QEMU ran on (it was stopped)";
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) {
    return "the guest powered off" +
           std::string(console.empty() ? "" : "; its console ended with:\n" + os::tailOf(console, 300));
  }
  return "QEMU ended: " + os::describeWaitStatus(*status) +
         (console.empty() ? "" : "; the guest's console ended with:\n" + os::tailOf(console, 300));
}

Result<Qmp*> Vm::session(Monitor& monitor, std::chrono::steady_clock::time_point deadline) const {
  if (monitor.qmp) {
    monitor.qmp->setDeadline(deadline);
    return &*monitor.qmp;
  }
  if (!monitor.fd) {
    // A session that failed was dropped with its connection: a lasting
    // QEMU's monitor takes a new one (and greets it afresh).
    if (workDir_.empty()) return Error::make(Code::kUnavailable, "QEMU's monitor connection is gone");
    MOAT_ASSIGN(monitor.fd, socketIn(workDir_, kMonitorSocket, false));
  }
  // A QEMU that stops reading cannot hold a sender for good.
  MOAT_TRY(os::setSendTimeout(monitor.fd.get(), std::chrono::seconds(5)));
  Qmp qmp(monitor.fd.get(), deadline);
  Status opened = qmp.open();
  if (!opened.ok()) {
    monitor.fd.reset();
    return opened.error();
  }
  monitor.qmp.emplace(std::move(qmp));
  return &*monitor.qmp;
}

Status Vm::forwardPort(uint16_t port, std::chrono::milliseconds wait) {
  if (!monitor_) return Error::make(Code::kUnsupported, "a guest started without a monitor forwards no port");
  const auto deadline = std::chrono::steady_clock::now() + wait;
  auto known = [&]() -> std::optional<Status> {
    std::lock_guard lock(monitor_->forwardedMutex);
    if (monitor_->forwarded.count(port)) return Status{};
    // Each forward is a listening socket of QEMU's: a bound few.
    if (monitor_->forwarded.size() >= kMaxForwardedPorts) {
      return Error::make(Code::kCapacity, "at most " + std::to_string(kMaxForwardedPorts) +
                                              " ports of a microVM environment can be reached");
    }
    return std::nullopt;
  };
  // A port forwarded already never waits for the monitor.
  if (auto k = known()) return *k;
  std::unique_lock lock(monitor_->mutex, std::defer_lock);
  if (!lock.try_lock_until(deadline)) {
    return Error::make(Code::kUnavailable, "QEMU's monitor is busy (another port is being forwarded)");
  }
  if (auto k = known()) return *k;
  // On QEMU's 127.0.0.2, not 127.0.0.1: the guest's 10.0.2.2 is QEMU's
  // 127.0.0.1, and must not lead back to the guest's own servers.
  const std::string host = "tcp:" + os::ipv4ToString(htonl(kForwardAddress)) + ":" + std::to_string(port);
  const std::string rule = host + "-" + os::ipv4ToString(htonl(init::kGuestAddress)) + ":" + std::to_string(port);
  auto forward = [&]() -> Result<nlohmann::json> {
    MOAT_ASSIGN(Qmp * qmp, session(*monitor_, deadline));
    // An earlier moatd (or a forward whose answer came late) may have made
    // it already: made afresh.
    MOAT_TRY(qmp->call("human-monitor-command", {{"command-line", "hostfwd_remove net " + host}}));
    return qmp->call("human-monitor-command", {{"command-line", "hostfwd_add net " + rule}});
  };
  auto said = forward();
  if (!said.ok()) {
    // Out of step with QEMU (an answer that came late, a broken
    // connection): the next forward starts a new session.
    monitor_->qmp.reset();
    monitor_->fd.reset();
    return Error::make(Code::kUnavailable,
                       "QEMU's monitor did not forward port " + std::to_string(port) + ": " + said.error().message());
  }
  // An HMP command: QEMU says what went wrong in its answer's text (QEMU's
  // words: printable, and short).
  if (said->is_string() && !said->get<std::string>().empty()) {
    std::string why;
    for (char c : said->get<std::string>().substr(0, 200)) why += (c >= 0x20 && c < 0x7f) ? c : ' ';
    while (!why.empty() && why.back() == ' ') why.pop_back();
    return Error::make(Code::kUnavailable, "QEMU did not forward port " + std::to_string(port) + ": " + why);
  }
  std::lock_guard forwarded(monitor_->forwardedMutex);
  monitor_->forwarded.insert(port);
  return {};
}

Status Vm::whilePaused(const std::function<Status()>& work, std::chrono::milliseconds wait) {
  if (!monitor_) return Error::make(Code::kUnsupported, "a guest started without a monitor cannot be paused");
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::unique_lock lock(monitor_->mutex, std::defer_lock);
  if (!lock.try_lock_until(deadline)) return Error::make(Code::kUnavailable, "QEMU's monitor is busy");
  // The stop has a deadline of its own (the wait for the lock may have
  // used the caller's).
  bool asked = false;
  auto stopped = [&]() -> Status {
    MOAT_ASSIGN(Qmp * qmp, session(*monitor_, std::chrono::steady_clock::now() + kGuestSendWait));
    asked = true;
    MOAT_TRY(qmp->call("stop"));
    return {};
  }();
  // Going on matters more than any deadline: a guest left stopped is lost
  // to its owner. A stop whose answer was lost may still have stopped it;
  // one never asked for left the guest as it was.
  if (!stopped.ok()) {
    monitor_->qmp.reset();
    monitor_->fd.reset();
    if (!asked) {
      return Error::make(Code::kUnavailable, "QEMU's monitor did not answer: " + stopped.error().message());
    }
    if (Status resumed = resumeLocked(); !resumed.ok()) {
      kill();
      return Error::make(Code::kUnavailable, "QEMU's monitor did not stop the guest (" + stopped.error().message() +
                                                 ") nor let it go on (" + resumed.error().message() +
                                                 "): the guest was ended");
    }
    return Error::make(Code::kUnavailable, "QEMU's monitor did not stop the guest: " + stopped.error().message());
  }
  Status done = work();
  if (Status resumed = resumeLocked(); !resumed.ok()) {
    kill();
    return Error::make(Code::kUnavailable,
                       "QEMU's monitor did not let the guest go on (" + resumed.error().message() + "): it was ended");
  }
  return done;
}

Status Vm::resumeLocked() {
  // Twice, each on a session of its own and with a deadline of its own.
  Status last;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto resumed = [&]() -> Status {
      MOAT_ASSIGN(Qmp * qmp, session(*monitor_, std::chrono::steady_clock::now() + kGuestSendWait));
      MOAT_TRY(qmp->call("cont"));
      return {};
    }();
    if (resumed.ok()) return {};
    monitor_->qmp.reset();
    monitor_->fd.reset();
    last = resumed;
  }
  return last;
}

Status Vm::runWhenLoaded(std::chrono::milliseconds wait) {
  if (!monitor_) return Error::make(Code::kInvalidArgument, "a guest started without a monitor cannot be started");
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::unique_lock lock(monitor_->mutex);
  MOAT_ASSIGN(Qmp * qmp, session(*monitor_, deadline));
  // QEMU keeps a guest saved stopped stopped once it is loaded: `cont`
  // then, not before (during the load it would change nothing).
  for (;;) {
    MOAT_ASSIGN(auto status, qmp->call("query-status"));
    const std::string state = status.is_object() && status.contains("status") && status["status"].is_string()
                                  ? status["status"].get<std::string>()
                                  : "";
    if (state == "running") return {};
    if (state != "inmigrate") break;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Error::make(Code::kTimeout, "QEMU did not load the saved guest in time");
    }
    ::usleep(10000);
  }
  MOAT_TRY(qmp->call("cont"));
  return {};
}

Status Vm::resume(std::chrono::milliseconds wait) {
  if (!monitor_) return {};
  std::unique_lock lock(monitor_->mutex, std::defer_lock);
  if (!lock.try_lock_for(wait)) return Error::make(Code::kUnavailable, "QEMU's monitor is busy");
  return resumeLocked();
}

Status Vm::save(int stateFd, std::chrono::milliseconds wait) {
  MOAT_TRY(migrateTo(stateFd, wait, false));
  kill();
  return {};
}

Status Vm::saveStopped(int stateFd, std::chrono::milliseconds wait) { return migrateTo(stateFd, wait, true); }

Status Vm::migrateTo(int stateFd, std::chrono::milliseconds wait, bool stopFirst) {
  if (!monitor_) return Error::make(Code::kInvalidArgument, "a guest started without a monitor cannot be saved");
  std::unique_lock lock(monitor_->mutex);
  MOAT_ASSIGN(Qmp * opened, Vm::session(*monitor_, std::chrono::steady_clock::now() + wait));
  Qmp& qmp = *opened;
  // Stopped, its state is written once as it stands (no pages written
  // again as the guest dirties them meanwhile).
  if (stopFirst) MOAT_TRY(qmp.call("stop"));
  Status saved = [&]() -> Status {
    // As fast as the disk takes it (QEMU's default rate is a network's).
    MOAT_TRY(qmp.call("migrate-set-parameters", {{"max-bandwidth", int64_t{1} << 40}}));
    MOAT_TRY(qmp.call("migrate-set-capabilities",
                      {{"capabilities", nlohmann::json::array({{{"capability", "events"}, {"state", true}}})}}));
    MOAT_TRY(qmp.call("getfd", {{"fdname", "state"}}, stateFd));
    MOAT_TRY(qmp.call("migrate", {{"uri", "fd:state"}}));
    for (;;) {
      MOAT_ASSIGN(auto progress, qmp.awaitEvent("MIGRATION"));
      const std::string status =
          progress.contains("status") && progress["status"].is_string() ? progress["status"].get<std::string>() : "";
      if (status == "completed") return {};
      if (status == "failed" || status == "cancelled") {
        MOAT_ASSIGN(auto why, qmp.call("query-migrate"));
        const bool described = why.is_object() && why.contains("error-desc") && why["error-desc"].is_string();
        return Error::make(Code::kToolFailed, "QEMU could not save the guest: " +
                                                  (described ? why["error-desc"].get<std::string>() : status));
      }
    }
  }();
  if (!saved.ok() && stopFirst) {
    // Whatever went wrong (QEMU's error, the deadline), the guest goes on
    // as it was: the save is called off and the guest let go on.
    monitor_->qmp.reset();
    monitor_->fd.reset();
    (void)[&]()->Status {
      MOAT_ASSIGN(Qmp * again, session(*monitor_, std::chrono::steady_clock::now() + kGuestSendWait));
      (void)again->call("migrate_cancel");
      return {};
    }
    ();
    if (Status resumed = resumeLocked(); !resumed.ok()) {
      kill();
      return Error::make(Code::kUnavailable, saved.error().message() + "; and QEMU did not let the guest go on (" +
                                                 resumed.error().message() + "): it was ended");
    }
  }
  return saved;
}

void Vm::kill() const {
  if (pid_ <= 0) return;
  if (pidfd_) {
    (void)os::pidfdSendSignal(pidfd_.get(), SIGKILL);
  } else {
    ::kill(pid_, SIGKILL);  // a child not reaped: its pid is still its own
  }
}

Vm::~Vm() {
  if (pid_ <= 0) return;
  kill();
  if (adopted_) {
    // An earlier moatd's (whoever its parent is reaps it; its pid may be
    // another's by then): gone once its pidfd reads.
    pollfd p{pidfd_.get(), POLLIN, 0};
    while (pidfd_ && ::poll(&p, 1, 10000) < 0 && errno == EINTR) {
    }
    return;
  }
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

std::string Vm::consoleTail() const {
  if (!console_) return "";
  struct stat st;
  if (::fstat(console_.get(), &st) != 0) return "";
  const off_t from = st.st_size > 4096 ? st.st_size - 4096 : 0;
  std::string text(static_cast<size_t>(st.st_size - from), '\0');
  ssize_t n = ::pread(console_.get(), text.data(), text.size(), from);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  // The guest's words: printable text only (no terminal escapes).
  for (char& c : text) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) c = '?';
  }
  return text;
}

}  // namespace moat::backend::microvm
