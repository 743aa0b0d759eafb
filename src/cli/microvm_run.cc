#include "cli/microvm_run.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "backend/microvm/accel.h"
#include "backend/namespaces/environment.h"
#include "init/protocol.h"
#include "isolation/fs/template.h"
#include "os/file.h"
#include "os/socket.h"
#include "os/tool.h"

namespace moat::cli {
namespace {

// Where each guest's files are (root's alone: QEMU is handed descriptors).
constexpr const char* kVmsDir = "/run/moat-vms";

// What runs killed with SIGKILL left (their QEMUs died with them): a
// run-ID directory whose lock nobody holds.
void sweepLeftovers(const std::string& vms) {
  DIR* d = ::opendir(vms.c_str());
  if (!d) return;
  std::vector<std::string> dirs;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("run-", 0) == 0 && name.find('.') == std::string::npos) dirs.push_back(name);
  }
  ::closedir(d);
  for (const auto& name : dirs) {
    auto lock = os::FileLock::tryAcquire(vms + "/" + name + ".lock");
    if (!lock.ok()) continue;  // a run that lives
    (void)os::removeTree(vms + "/" + name);
    if (auto layout = isolation::cgroup::preparedHostLayout(false); layout.ok()) {
      isolation::cgroup::removeEmptyNamed(layout.value(), "moat-vm-" + name);  // moat-vm-run-ID
    }
  }
}

}  // namespace

Result<std::unique_ptr<MicroVmRun>> MicroVmRun::start(const RunOptions& options, const std::string& firstFrames) {
  const auto& spec = options.spec;
  if (!spec.volumes.empty()) {
    return Error::make(Code::kUnsupported, "-v: host paths cannot be shown inside a microVM yet (docs/MICROVM.md)");
  }
  struct stat top;
  MOAT_ASSIGN(auto tmpl, backend::microvm::imageableTemplate(spec.templateName, spec.stateDir, top));
  if (spec.memoryMb < backend::kMicroVmMinMemoryMb) {
    return Error::make(Code::kInvalidArgument, "--memory: a microVM needs at least " +
                                                   std::to_string(backend::kMicroVmMinMemoryMb) +
                                                   " MB (its kernel's own)");
  }
  MOAT_ASSIGN(auto kernel, backend::microvm::findGuestKernel());
  MOAT_ASSIGN(std::string init, backend::namespaces::findInitBinary());
  std::unique_ptr<MicroVmRun> run(new MicroVmRun);
  MOAT_ASSIGN(auto ids, isolation::namespaces::leaseIdMap());
  run->ids_.emplace(std::move(ids));
  const char* vmsEnv = std::getenv("MOAT_VMS_DIR");  // tests: a directory of their own
  const std::string vms = vmsEnv && *vmsEnv == '/' ? vmsEnv : kVmsDir;
  MOAT_TRY(os::makeDir(vms, 0700));
  sweepLeftovers(vms);
  std::string dir = vms + "/run-" + spec.id;
  MOAT_ASSIGN(run->held_, os::FileLock::tryAcquire(dir + ".lock"));
  if (::mkdir(dir.c_str(), 0700) != 0) return Error::fromErrno("mkdir " + dir);
  run->dir_ = dir;
  // KVM where a probe boot under it works (accel.h), unless the caller says.
  const char* accelEnv = std::getenv("MOAT_MICROVM_ACCEL");
  const std::string accel = accelEnv && *accelEnv ? accelEnv : "auto";
  if (!backend::microvm::accelNamed(accel)) {
    return Error::make(Code::kInvalidArgument, "MOAT_MICROVM_ACCEL: auto, kvm or tcg, not '" + accel + "'");
  }
  const bool kvm = backend::microvm::chooseAccel(accel, kernel).kvm;
  // QEMU's cgroup: the spec's CPU time, the guest's RAM and QEMU's own.
  MOAT_ASSIGN(auto layout, isolation::cgroup::preparedHostLayout(false));
  MOAT_ASSIGN(run->cgroup_,
              isolation::cgroup::createUnderPreparedParents(
                  layout, "moat-vm-run-" + spec.id, backend::microvm::qemuLimits(spec.cpus, spec.memoryMb, kvm)));
  backend::microvm::VmSpec vm;
  vm.kernel = kernel;
  vm.initBinary = init;
  vm.rootImage = dir + "/root.img";
  vm.workDir = dir;
  vm.cpus = std::min(std::max(1u, std::thread::hardware_concurrency()),
                     static_cast<unsigned>(std::max(1.0, std::ceil(spec.cpus))));
  vm.memoryMb = spec.memoryMb;
  vm.storageBytes = backend::storageLimitBytes(spec.storageGb);
  vm.pids = spec.pids;
  vm.kvm = kvm;
  vm.cgroupJoin = run->cgroup_->procsFiles();
  vm.uid = run->ids_->map.hostBase;
  vm.gid = run->ids_->map.hostBase;
  MOAT_TRY(backend::microvm::buildRootImage(tmpl.lower.get(), vm.rootImage));
  MOAT_ASSIGN(auto started, backend::microvm::Vm::start(vm));
  run->vm_.emplace(std::move(started));
  // The guest's Hello, within a bound this side keeps; then the command.
  MOAT_TRY(run->vm_->awaitGuest(backend::microvm::kGuestBootWait));
  init::FrameReader reader;
  auto hello = init::readFrame(run->vm_->control(), reader);
  if (!hello.ok()) return Error::make(Code::kToolFailed, "the guest ended before it answered");
  auto h = init::Hello::decode(hello->payload);
  if (hello->type != init::MsgType::kHello || !h.ok() || h->version != init::kProtocolVersion) {
    return Error::make(Code::kToolFailed, "the guest's moat-init speaks another protocol");
  }
  // The guest's moat-init is the guest's to stop: a write to it waits at
  // most kGuestSendWait, then moat run ends with the environment's failure.
  MOAT_TRY(os::setSendTimeout(run->vm_->control(), backend::microvm::kGuestSendWait));
  MOAT_TRY(init::writeFrames(run->vm_->control(), firstFrames));
  return run;
}

MicroVmRun::~MicroVmRun() {
  vm_.reset();  // reaped before its cgroup goes (a member, after this body)
  if (!dir_.empty()) (void)os::removeTree(dir_);
}

}  // namespace moat::cli
