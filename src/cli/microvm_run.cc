#include "cli/microvm_run.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>

#include "backend/namespaces/environment.h"
#include "init/protocol.h"
#include "isolation/fs/template.h"
#include "os/file.h"

namespace moat::cli {
namespace {

// Where each guest's files are: traversable, not listable; each guest's
// directory is its QEMU's alone.
constexpr const char* kVmsDir = "/run/moat-vms";
constexpr uint64_t kMinMemoryMb = 128;

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
  MOAT_ASSIGN(auto kernel, backend::microvm::findGuestKernel());
  MOAT_ASSIGN(std::string init, backend::namespaces::findInitBinary());
  std::unique_ptr<MicroVmRun> run(new MicroVmRun);
  MOAT_ASSIGN(auto ids, isolation::namespaces::leaseIdMap());
  run->ids_.emplace(std::move(ids));
  MOAT_TRY(os::makeDir(kVmsDir, 0711));
  if (::chmod(kVmsDir, 0711) != 0) return Error::fromErrno(std::string("chmod ") + kVmsDir);
  std::string dir = std::string(kVmsDir) + "/run-" + spec.id;
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
  MOAT_TRY(init::writeFrames(run->vm_->control(), firstFrames));
  return run;
}

MicroVmRun::~MicroVmRun() {
  vm_.reset();
  if (!dir_.empty()) (void)os::removeTree(dir_);
}

}  // namespace moat::cli
