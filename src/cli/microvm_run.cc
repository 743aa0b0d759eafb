#include "cli/microvm_run.h"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "backend/namespaces/environment.h"
#include "init/protocol.h"
#include "isolation/fs/template.h"
#include "os/file.h"
#include "os/tool.h"

namespace moat::cli {
namespace {

// Where each guest's files are: traversable, not listable; each guest's
// directory is its QEMU's alone.
constexpr const char* kVmsDir = "/run/moat-vms";
constexpr uint64_t kMinMemoryMb = 128;
// A boot takes seconds on TCG; a guest that has not answered by then will not.
constexpr std::chrono::seconds kHelloWait{120};

}  // namespace

Result<std::unique_ptr<MicroVmRun>> MicroVmRun::start(const RunOptions& options, const std::string& firstFrames) {
  const auto& spec = options.spec;
  if (!spec.volumes.empty()) {
    return Error::make(Code::kUnsupported, "-v: host paths cannot be shown inside a microVM yet (docs/MICROVM.md)");
  }
  MOAT_ASSIGN(auto tmpl, isolation::fs::resolveTemplate(spec.templateName, spec.stateDir));
  if (!tmpl.hostReadOnlyDirs.empty()) {
    return Error::make(Code::kUnsupported,
                       "--isolation microvm needs a root file system: --template DIR or an imported template "
                       "(the host's own tree is not made into an image; docs/MICROVM.md)");
  }
  if (spec.memoryMb < kMinMemoryMb) {
    return Error::make(Code::kInvalidArgument,
                       "--memory: a microVM needs at least " + std::to_string(kMinMemoryMb) + " MB (its kernel's own)");
  }
  // mkfs.erofs reads the tree as root by its paths: one that someone other
  // than root may write could be rewritten under it (docs/MICROVM.md).
  struct stat top;
  if (::fstat(tmpl.lower.get(), &top) != 0) return Error::fromErrno("stat " + tmpl.lowerDir);
  if (top.st_uid != 0 || (top.st_mode & 022) != 0) {
    return Error::make(Code::kInvalidArgument,
                       "--template " + tmpl.lowerDir +
                           ": a microVM's template directory must be root's and writable by root alone "
                           "(its image is made as root from its paths)");
  }
  MOAT_ASSIGN(auto kernel, backend::microvm::findGuestKernel());
  MOAT_ASSIGN(std::string init, backend::namespaces::findInitBinary());
  std::unique_ptr<MicroVmRun> run(new MicroVmRun);
  MOAT_ASSIGN(auto ids, isolation::namespaces::leaseIdMap());
  run->ids_.emplace(std::move(ids));
  const char* vmsEnv = std::getenv("MOAT_VMS_DIR");  // tests: a directory of their own
  const std::string vms = vmsEnv && *vmsEnv == '/' ? vmsEnv : kVmsDir;
  MOAT_TRY(os::makeDir(vms, 0711));
  if (::chmod(vms.c_str(), 0711) != 0) return Error::fromErrno("chmod " + vms);
  std::string dir = vms + "/run-" + spec.id;
  if (::mkdir(dir.c_str(), 0700) != 0) return Error::fromErrno("mkdir " + dir);
  run->dir_ = dir;
  backend::microvm::VmSpec vm;
  vm.kernel = kernel;
  vm.initBinary = init;
  vm.rootImage = dir + "/root.img";
  vm.workDir = dir;
  vm.cpus = static_cast<unsigned>(std::ceil(spec.cpus));
  vm.memoryMb = spec.memoryMb;
  vm.storageBytes = static_cast<uint64_t>(spec.storageGb * (1ull << 30));
  const char* accel = std::getenv("MOAT_MICROVM_ACCEL");
  vm.kvm = accel && std::string(accel) == "kvm";
  vm.uid = run->ids_->map.hostBase;
  vm.gid = run->ids_->map.hostBase;
  MOAT_TRY(backend::microvm::buildRootImage(tmpl.lower.get(), vm.rootImage));
  MOAT_ASSIGN(auto started, backend::microvm::Vm::start(vm));
  run->vm_.emplace(std::move(started));
  // The guest's Hello, within a bound this side keeps (a guest whose
  // kernel hangs says nothing), or QEMU's end; then the command.
  // Why it failed, and the end of its console, which says why in its words.
  auto guestFailed = [&run](const std::string& why) {
    std::string tail = os::tailOf(run->vm_->consoleTail(), 1024);
    return Error::make(Code::kToolFailed, why + (tail.empty() ? "" : "; its console ended with:\n" + tail));
  };
  init::FrameReader reader;
  const auto deadline = std::chrono::steady_clock::now() + kHelloWait;
  for (;;) {
    pollfd fds[2] = {{run->vm_->control(), POLLIN, 0}, {run->vm_->pidfd(), POLLIN, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    int n = ::poll(fds, 2, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return guestFailed("the guest did not answer within " + std::to_string(kHelloWait.count()) + " s");
    if (n < 0 || (fds[1].revents & POLLIN)) return guestFailed("the guest ended before it answered");
    auto hello = init::readFrame(run->vm_->control(), reader);
    // The connection closed as the guest went.
    if (!hello.ok()) return guestFailed("the guest ended before it answered");
    auto h = init::Hello::decode(hello->payload);
    if (hello->type != init::MsgType::kHello || !h.ok() || h->version != init::kProtocolVersion) {
      return Error::make(Code::kToolFailed, "the guest's moat-init speaks another protocol");
    }
    break;
  }
  MOAT_TRY(init::writeFrames(run->vm_->control(), firstFrames));
  return run;
}

MicroVmRun::~MicroVmRun() {
  vm_.reset();
  if (!dir_.empty()) (void)os::removeTree(dir_);
}

}  // namespace moat::cli
