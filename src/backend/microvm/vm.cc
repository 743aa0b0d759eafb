#include "backend/microvm/vm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "backend/microvm/initramfs.h"
#include "init/guest.h"
#include "os/file.h"
#include "os/process.h"
#include "os/socket.h"
#include "os/tool.h"

namespace moat::backend::microvm {
namespace {

constexpr auto kStartWait = std::chrono::seconds(10);  // QEMU's socket exists within ~100 ms
constexpr rlim_t kConsoleBytes = 1 << 20;

Result<std::string> findProgram(const char* envName, const char* name, const char* package) {
  if (const char* named = std::getenv(envName); named && *named) return std::string(named);
  for (const char* dir : {"/usr/bin", "/usr/sbin", "/bin", "/sbin"}) {
    std::string path = std::string(dir) + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return Error::make(Code::kMissingDependency,
                     std::string(name) + " not found: microVMs need it (apt-get install " + package + ")");
}

}  // namespace

Status buildRootImage(int treeFd, const std::string& image) {
  MOAT_ASSIGN(std::string mkfs, findProgram("MOAT_MKFS_EROFS", "mkfs.erofs", "erofs-utils"));
  os::ToolRun run;
  // The tree as this process holds it: /proc/PID/fd/N jumps to it whatever
  // its path names now, and "/." makes the source the directory itself.
  const std::string tree = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(treeFd) + "/.";
  run.argv = {mkfs, "-T0", image, tree};
  run.deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  return os::runTool(run);
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

std::vector<std::string> qemuArgv(const std::string& qemu, const VmSpec& spec, const std::string& initramfs,
                                  const std::string& socket, const std::string& consoleLog) {
  // moat-init powers the guest off when it ends; should it crash, the
  // kernel's panic resets at once by a triple fault (reboot=t), which ends
  // QEMU (-no-reboot) whatever the machine offers to reset with.
  std::string cmdline =
      "console=ttyS0 quiet panic=-1 reboot=t rdinit=/init MOAT_GUEST_STORAGE=" + std::to_string(spec.storageBytes);
  if (!spec.kvm) cmdline += " tsc_early_khz=" + std::to_string(hostTscKhz());
  cmdline += " -- --guest";
  return {qemu,
          "-M",
          spec.kvm ? "microvm" : "microvm,pit=on",
          "-accel",
          spec.kvm ? "kvm" : "tcg",
          "-cpu",
          spec.kvm ? "host" : "qemu64",
          "-smp",
          std::to_string(spec.cpus),
          "-m",
          std::to_string(spec.memoryMb),
          "-sandbox",
          "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
          "-nodefaults",
          "-no-user-config",
          "-nographic",
          "-no-reboot",
          "-serial",
          "file:" + consoleLog,
          "-kernel",
          spec.kernel.image,
          "-initrd",
          initramfs,
          "-append",
          cmdline,
          "-drive",
          "id=root,file=" + spec.rootImage + ",format=raw,if=none,readonly=on",
          "-device",
          "virtio-blk-device,drive=root",
          "-device",
          "virtio-serial-device",
          "-chardev",
          "socket,id=control,path=" + socket + ",server=on,wait=off",
          "-device",
          std::string("virtserialport,chardev=control,name=") + init::kGuestPortName};
}

Result<Vm> Vm::start(const VmSpec& spec) {
  MOAT_ASSIGN(std::string qemu, findProgram("MOAT_QEMU", "qemu-system-x86_64", "qemu-system-x86"));
  MOAT_ASSIGN(std::string archive, guestInitramfs(spec.kernel, spec.initBinary));
  const std::string initramfs = spec.workDir + "/initramfs", socket = spec.workDir + "/control.sock";
  Vm vm;
  vm.consoleLog_ = spec.workDir + "/console.log";
  MOAT_TRY(os::writeFile(initramfs, archive, 0600));
  if (spec.uid != 0 || spec.gid != 0) {
    // QEMU's own: its directory (the socket and the console log are made
    // there) and what it reads.
    for (const std::string& path : {spec.workDir, initramfs, spec.rootImage}) {
      if (::chown(path.c_str(), spec.uid, spec.gid) != 0) return Error::fromErrno("chown " + path);
    }
  }
  auto argv = qemuArgv(qemu, spec, initramfs, socket, vm.consoleLog_);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  MOAT_ASSIGN(UniqueFd devNull, os::open("/dev/null", O_RDWR | O_CLOEXEC));
  const pid_t parent = ::getpid();
  const struct rlimit consoleLimit = {kConsoleBytes, kConsoleBytes};
  pid_t pid = ::fork();
  if (pid < 0) return Error::fromErrno("fork for " + qemu);
  if (pid == 0) {
    // Only async-signal-safe calls from here to the exec.
    os::resetSignals();
    // The console log is the one file QEMU writes, and what the guest
    // prints is the guest's to choose: it stops growing at kConsoleBytes
    // (writes past it fail with EFBIG, SIGXFSZ ignored: QEMU goes on).
    ::signal(SIGXFSZ, SIG_IGN);
    if (::setrlimit(RLIMIT_FSIZE, &consoleLimit) != 0) ::_exit(125);
    for (int target = 0; target < 3; ++target) {
      if (::dup2(devNull.get(), target) < 0) ::_exit(126);
    }
    (void)os::markCloseOnExecFrom(3);
    if ((spec.uid != 0 || spec.gid != 0) && os::switchIdsInChild(spec.uid, spec.gid) != 0) ::_exit(125);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(125);
    // After the ids: a change of them clears it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    char* noEnvironment[] = {nullptr};
    ::execve(args[0], args.data(), noEnvironment);
    ::_exit(127);
  }
  vm.pid_ = pid;
  MOAT_ASSIGN(vm.pidfd_, os::pidfdOpen(pid));
  const auto deadline = std::chrono::steady_clock::now() + kStartWait;
  for (;;) {
    auto fd = os::connectUnixStream(socket);
    if (fd.ok()) {
      vm.control_ = std::move(fd.value());
      return vm;
    }
    if (os::pidfdExited(vm.pidfd_.get())) {
      return Error::make(Code::kToolFailed, qemu + " exited before its control socket was up");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Error::make(Code::kToolFailed, qemu + " made no control socket within 10 s");
    }
    ::usleep(2000);
  }
}

Vm::~Vm() {
  if (pid_ <= 0) return;
  if (pidfd_) (void)os::pidfdSendSignal(pidfd_.get(), SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

std::string Vm::consoleTail() const {
  auto text = os::readFileTail(consoleLog_, 4096);
  return text.ok() ? text.value() : "";
}

}  // namespace moat::backend::microvm
