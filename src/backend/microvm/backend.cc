#include "backend/microvm/backend.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <tuple>

#include "backend/namespaces/environment.h"
#include "common/hex.h"
#include "common/log.h"
#include "init/protocol.h"
#include "isolation/fs/storage_pool.h"
#include "isolation/fs/template.h"
#include "os/file.h"
#include "os/file_lock.h"
#include "os/netlink.h"
#include "os/process.h"
#include "os/security.h"
#include "os/socket.h"

namespace moat::backend::microvm {
namespace {

// A file name for the template: its name, or its directory's path with
// the slashes replaced, and the identity of its top directory (a template
// deleted and made again under the same name is another image).
std::string imageName(const std::string& templateName, const struct stat& top) {
  // A directory's path may be long: its first characters and a hash of
  // all (the files live as long as this moatd: the hash need not be stable).
  std::string name;
  for (char c : templateName.substr(0, 64)) name += (c == '/' ? '_' : c);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016zx", std::hash<std::string>{}(templateName));
  return name + "-" + hash + "-" + std::to_string(top.st_dev) + "-" + std::to_string(top.st_ino) + "-" +
         std::to_string(top.st_mtim.tv_sec) + "." + std::to_string(top.st_mtim.tv_nsec) + ".erofs";
}

// "moat-vm-" and a hash of the state directory: this moatd's QEMU cgroups
// are told apart from other moatds' (and moat run's, "moat-vm-run-").
std::string cgroupPrefixOf(const std::string& stateDir) {
  char hash[9];
  std::snprintf(hash, sizeof hash, "%08x", static_cast<unsigned>(std::hash<std::string>{}(stateDir)&0xffffffffu));
  return std::string("moat-vm-") + hash + "-";
}

// In each guest's volume (docs/MICROVM.md, "Storage").
constexpr const char* kLayerDisk = "/disk.img";
constexpr const char* kConsoleLog = "/console.log";
// In each guest's directory: the root image it booted (a link), and its
// checkpoint (docs/PAUSE.md, "To disk"): QEMU's migration stream, named
// for the accelerator it was saved under, complete once it has that name.
constexpr const char* kOwnRootImage = "/root.erofs";
constexpr const char* kCheckpointPartial = "/memory.state.partial";
std::string checkpointName(bool kvm) { return kvm ? "/memory.kvm.state" : "/memory.tcg.state"; }
// A volume holds the disk (at most its size) and the console (which may
// grow as far, RLIMIT_FSIZE being the disk's size): its qgroup bounds both
// together at the disk's size and this much.
constexpr uint64_t kVolumeSlackBytes = 16ull << 20;
// How long a snapshot may wait for QEMU's monitor (a port being
// forwarded holds it).
constexpr auto kSnapshotWait = std::chrono::seconds(30);

// A guest saved running (a checkpoint, a memory snapshot), restored by
// `vm`: let run once QEMU has loaded it, and its conversation with the host
// that saved it found again (its Hello is next). Fails as `what` says, with
// why the guest ended if it did (QEMU is the caller's to end).
Status loadSaved(Vm& vm, std::chrono::milliseconds wait, const std::string& what) {
  Status resynced = vm.runWhenLoaded(wait);
  if (resynced.ok()) resynced = vm.resync(wait);
  if (resynced.ok()) return {};
  const std::string why = vm.whyEnded(std::chrono::milliseconds(500));
  return Error::make(resynced.error().code == Code::kTimeout ? Code::kTimeout : Code::kUnavailable,
                     what + ": " + resynced.error().message() + (why.empty() ? "" : " (" + why + ")"));
}

}  // namespace

Status roomForState(const std::string& what, uint64_t freeBytes, uint64_t heldBytes) {
  if (freeBytes >= heldBytes + kStateHeadroomBytes) return {};
  return Error::make(Code::kCapacity, "not enough free space for " + what + ": its guest may take up to " +
                                          std::to_string(heldBytes >> 20) + " MiB, and moatd's state directory has " +
                                          std::to_string(freeBytes >> 20) + " MiB free (" +
                                          std::to_string(kStateHeadroomBytes >> 20) + " MiB are kept spare)");
}

namespace {

// Saving a guest whose QEMU holds `heldBytes` (a checkpoint, a memory
// snapshot): room for it in `dir`, when its free space can be read, and
// time (20 ms a MiB, at least kGuestSaveWait).
Status roomToSave(const std::string& dir, const std::string& what, uint64_t heldBytes) {
  auto free = os::freeBytesOf(dir);
  return free.ok() ? roomForState(what, free.value(), heldBytes) : Status{};
}
std::chrono::milliseconds saveWait(uint64_t heldBytes) {
  return std::max<std::chrono::milliseconds>(kGuestSaveWait, std::chrono::milliseconds(20 * (heldBytes >> 20)));
}

}  // namespace

HostSupport probeHost(const std::string& accel) {
  HostSupport host;
  auto kernel = findGuestKernel();
  if (!kernel.ok()) {
    host.missing = kernel.error().message();
    return host;
  }
  host.kernel = kernel.value();
  auto init = namespaces::findInitBinary();
  if (!init.ok()) {
    host.missing = init.error().message();
    return host;
  }
  host.initBinary = init.value();
  // Found as Vm::start, buildRootImage and writeLayerDisk find them.
  for (auto [envName, name, package] : {std::tuple{"MOAT_QEMU", "qemu-system-x86_64", "qemu-system-x86"},
                                        std::tuple{"MOAT_MKFS_EROFS", "mkfs.erofs", "erofs-utils"},
                                        std::tuple{"MOAT_MKFS_EXT4", "mkfs.ext4", "e2fsprogs"}}) {
    if (auto found = findProgram(envName, name, package); !found.ok()) {
      host.missing = found.error().message();
      return host;
    }
  }
  if (os::landlockAbi() <= 0) {
    host.missing = "the kernel has no Landlock, which each template's image is made under";
    return host;
  }
  if (accel == "kvm" && ::access("/dev/kvm", R_OK | W_OK) != 0) {
    host.missing = "KVM was asked for and /dev/kvm cannot be opened";
    return host;
  }
  const AccelChoice choice = chooseAccel(accel, host.kernel);
  host.kvm = choice.kvm;
  host.accelWhy = choice.why;
  host.available = true;
  return host;
}

MicroVmBackend::MicroVmBackend(std::string stateDir, HostSupport host, std::chrono::seconds bootWait,
                               size_t savedGuests)
    : stateDir_(stateDir),
      dir_(stateDir + "/microvm"),
      host_(std::move(host)),
      bootWait_(bootWait),
      cgroupPrefix_(cgroupPrefixOf(stateDir)),
      saved_(dir_ + "/saved", savedGuests, bootWait, cgroupPrefix_, launcher_) {
  // What a previous moatd of this state directory left: its images may be
  // of templates gone since and its saved guests of another moat-init (both
  // are made again on first use); its guests that QEMU still runs are
  // adopted (the manager re-attaches them), the rest removed.
  removeMadeFiles();
  auto layout = isolation::cgroup::preparedHostLayout(false);
  adoptGuests(layout);
  if (layout.ok()) isolation::cgroup::removeEmptyNamed(layout.value(), cgroupPrefix_);
}

void MicroVmBackend::removeMadeFiles() {
  (void)os::removeTree(dir_ + "/images");
  (void)os::removeTree(dir_ + "/saved");
  (void)::unlink((dir_ + "/initramfs").c_str());
  // The memory of a snapshot that is gone (deleted by a moatd without
  // microVMs): the manager rolls back those whose snapshot is there.
  auto kept = isolation::fs::StoragePool::snapshotsIn(stateDir_);
  auto memories = os::listDir(dir_ + "/memory");
  if (!kept.ok() || !memories.ok()) return;
  for (const auto& name : memories.value()) {
    if (std::find(kept->begin(), kept->end(), name) == kept->end()) (void)deleteSnapshot(name);
  }
}

void MicroVmBackend::adoptGuests(const Result<isolation::cgroup::Layout>& layout) {
  const std::string vms = dir_ + "/vms";
  auto names = os::listDir(vms);
  if (!names.ok()) return;  // none yet
  // Which QEMU is whose cannot be told, or their disks (in the storage
  // pool) cannot be reached: nothing is adopted and nothing removed, and
  // list() says so, so that the manager stops rather than fail environments
  // that may run fine (a later moatd may tell).
  if (!layout.ok()) {
    notAdopted_ = "the microVMs of the last moatd cannot be adopted: " + layout.error().message();
    return;
  }
  if (isolation::fs::StoragePool::made(stateDir_)) {
    if (auto pool = isolation::fs::StoragePool::open(stateDir_); !pool.ok()) {
      notAdopted_ = "the microVMs of the last moatd cannot be adopted: " + pool.error().message();
      return;
    }
  }
  std::vector<std::shared_ptr<Guest>> adopted;
  for (const auto& id : names.value()) {
    const std::string dir = vms + "/" + id;
    std::unique_ptr<isolation::cgroup::Cgroup> cgroup;
    auto guest = [&]() -> Result<std::shared_ptr<Guest>> {
      const bool saved = os::exists(dir + checkpointName(false)) || os::exists(dir + checkpointName(true));
      auto opened = isolation::cgroup::Cgroup::open(layout.value(), cgroupPrefix_ + id);
      const bool qemuRuns = opened.ok() && !opened->processes().empty();
      if (saved && qemuRuns) {
        // A QEMU runs it (a moatd died between a checkpoint's save and its
        // end of QEMU, or during a restore): it is adopted as it runs, and
        // the checkpoint is not its state any more.
        (void)::unlink((dir + checkpointName(false)).c_str());
        (void)::unlink((dir + checkpointName(true)).c_str());
      } else if (saved) {
        // On disk (a checkpoint): no QEMU runs it; its cgroup (gone after
        // a host reboot) and id range are taken again by its restore.
        // Its empty cgroup is left for this moatd's start to remove.
        if (opened.ok()) opened->leaveInPlace();
        if (!volumeOf(id).ok()) return Error::make(Code::kNotFound, "its volume is gone");
        auto made = newGuest();
        made->dir = dir;
        made->volume = true;
        made->checkpointed = true;
        return made;
      }
      if (!opened.ok()) return opened.error();
      cgroup = std::make_unique<isolation::cgroup::Cgroup>(std::move(opened.value()));
      // Its QEMU joined it alone (a cgroup moatd made): the one process
      // there, or it is gone.
      auto pids = cgroup->processes();
      if (pids.size() != 1) return Error::make(Code::kNotFound, "its QEMU is gone");
      // Its console is in its volume (one made before volumes were: in dir).
      std::string console;
      if (auto volume = volumeOf(id); volume.ok() && os::exists(volume.value() + kConsoleLog)) {
        console = volume.value() + kConsoleLog;
      }
      MOAT_ASSIGN(Vm vm, Vm::adopt(dir, console, pids[0]));
      // Still there once its pidfd is open: the pidfd is that QEMU's, not
      // a process that took its pid since.
      auto now = cgroup->processes();
      if (now.size() != 1 || now[0] != pids[0]) {
        vm.leaveRunning();
        return Error::make(Code::kNotFound, "its QEMU is gone");
      }
      auto made = newGuest();
      made->dir = dir;
      made->volume = !console.empty();
      made->ids = leaseHeldBy(pids[0]);
      made->cgroup = std::move(cgroup);
      made->vm = std::make_shared<Vm>(std::move(vm));
      return made;
    }();
    if (guest.ok()) {
      adopted.push_back(guest.value());
      std::lock_guard lock(mutex_);
      guests_[id] = std::move(guest.value());
      continue;
    }
    moat::log::warnf("microVM %s of the last moatd is not adopted (ended, removed): %s\n", id.c_str(),
                     guest.error().message().c_str());
    if (cgroup) cgroup->killAll();  // a QEMU nobody can reach any more ends
    cgroup.reset();
    if (removeVolume(id)) (void)os::removeTree(dir);  // else tried again at the next start
  }
  // Their connections, made again side by side (each may take a while on
  // a busy host), ready for the manager's attach().
  std::vector<std::thread> attaching;
  for (auto& guest : adopted) {
    if (!guest->vm) continue;  // on disk (a checkpoint)
    attaching.emplace_back([guest] {
      // A moatd that ended while it had the guest stopped (a snapshot's
      // moment) left it so: it goes on.
      if (Status resumed = guest->vm->resume(kGuestReattachWait); !resumed.ok()) {
        moat::log::warnf("an adopted microVM's QEMU did not answer `cont`: %s\n", resumed.error().message().c_str());
      }
      auto control = guest->vm->reattach(kGuestReattachWait);
      if (control.ok()) guest->reattached = std::move(control.value());
    });
  }
  for (auto& t : attaching) t.join();
}

std::shared_ptr<MicroVmBackend::Guest> MicroVmBackend::newGuest() {
  auto released = std::make_shared<Released>();
  std::shared_ptr<Guest> guest(new Guest, [released](Guest* gone) {
    delete gone;
    {
      std::lock_guard lock(released->mutex);
      released->done = true;
    }
    released->cv.notify_all();
  });
  guest->released = released;
  return guest;
}

std::optional<isolation::namespaces::IdMapLease> MicroVmBackend::leaseHeldBy(pid_t qemu) {
  // QEMU holds its range's lease (its fd 8). Should it have let go (code
  // that took QEMU over can), this moatd takes the lease again, so that no
  // other environment gets the uid QEMU runs as.
  auto status = os::readFile("/proc/" + std::to_string(qemu) + "/status", 1 << 16);
  if (!status.ok()) return std::nullopt;
  const auto at = status->find("\nUid:\t");
  if (at == std::string::npos) return std::nullopt;
  const auto uid = static_cast<uint32_t>(std::strtoul(status->c_str() + at + 6, nullptr, 10));
  const auto slot = isolation::namespaces::idMapSlotOf(uid);
  if (!slot) return std::nullopt;
  auto lock = os::FileLock::tryAcquire(std::string(isolation::namespaces::kIdMapLockDir) + "/" + std::to_string(*slot));
  if (!lock.ok()) return std::nullopt;  // held: by QEMU
  return isolation::namespaces::IdMapLease{{uid, 65536}, std::move(lock.value())};
}

void MicroVmBackend::endAll() {
  std::lock_guard lock(mutex_);
  for (auto& [id, guest] : guests_) {
    if (guest->vm) guest->vm->kill();
  }
}

MicroVmBackend::~MicroVmBackend() {
  // Its guests run on for the next moatd, as the spawner's environments
  // do: a stop that ends them destroys each (the manager does, unless it
  // was detached), and the next moatd destroys those nobody recorded.
  std::map<std::string, std::shared_ptr<Guest>> guests;
  {
    std::lock_guard lock(mutex_);
    guests.swap(guests_);
  }
  for (auto& [id, guest] : guests) {
    if (guest->vm) guest->vm->leaveRunning();
    if (guest->cgroup) guest->cgroup->leaveInPlace();
    if (guest->ids) guest->ids->lock.leaveToOtherHolders();  // QEMU holds the range
  }
  guests.clear();
  removeMadeFiles();
}

Result<std::string> MicroVmBackend::initramfs() {
  std::lock_guard lock(filesMutex_);
  if (initramfs_.empty()) {
    MOAT_TRY(os::makeDirs(dir_, 0700, 0700));
    const std::string path = dir_ + "/initramfs";
    MOAT_TRY(writeGuestInitramfs(host_.kernel, host_.initBinary, path));
    initramfs_ = path;
  }
  return initramfs_;
}

Result<std::string> MicroVmBackend::imageFor(const std::string& templateName) {
  struct stat top;
  MOAT_ASSIGN(auto tmpl, imageableTemplate(templateName, dir_.substr(0, dir_.rfind('/')), top));
  const std::string images = dir_ + "/images";
  const std::string name = imageName(templateName, top);
  MOAT_TRY(os::makeDirs(images, 0700, 0700));
  // One build per image at a time; other templates' creates go on.
  auto building = imageLocks_.exclusive(name);
  const std::string image = images + "/" + name;
  if (::access(image.c_str(), F_OK) == 0) return image;
  // mkfs.erofs may write only a directory of its own (Landlock): never
  // another template's image, which other guests boot.
  std::string scratch = images + "/.build-XXXXXX";
  if (!::mkdtemp(scratch.data())) return Error::fromErrno("mkdtemp " + scratch);
  const std::string partial = scratch + "/image";
  Status built = buildRootImage(tmpl.lower.get(), partial);
  if (built.ok() && ::rename(partial.c_str(), image.c_str()) != 0) built = Error::fromErrno("rename " + partial);
  (void)os::removeTree(scratch);
  if (!built.ok()) return built.error();
  return image;
}

Result<Backend::Created> MicroVmBackend::create(const Spec& spec) {
  if (!host_.available) {
    return Error::make(Code::kUnsupported, "isolation microvm is not available on this host: " + host_.missing);
  }
  if (spec.memoryMb < kMicroVmMinMemoryMb) {
    return Error::make(Code::kInvalidArgument, "spec.ram_mb: a microVM needs at least " +
                                                   std::to_string(kMicroVmMinMemoryMb) + " MB (its kernel's own)");
  }
  if (storageLimitBytes(spec.storageGb) > kScratchDiskBytes) {
    return Error::make(Code::kInvalidArgument, "spec.storage_gb: a microVM's disk holds at most " +
                                                   std::to_string(kScratchDiskBytes >> 30) + " GB");
  }
  // As a namespace environment's: no disk larger than the pool it is in
  // (a guest filling it would fill every environment's). Before anything
  // is made for it.
  MOAT_ASSIGN(isolation::fs::StoragePool pool, isolation::fs::StoragePool::open(stateDir_));
  if (storageLimitBytes(spec.storageGb) > pool.capacityBytes()) {
    return Error::make(Code::kInvalidArgument, "spec.storage_gb: " + nlohmann::json(spec.storageGb).dump() +
                                                   " GB is more than this host's storage pool holds (" +
                                                   std::to_string(pool.capacityBytes() >> 20) + " MiB)");
  }
  // Going on from a memory snapshot: its guest's own root image and state.
  std::string image;
  const std::string memoryState = spec.withMemory ? memoryDir(spec.fromSnapshot) + checkpointName(host_.kvm) : "";
  if (spec.withMemory) {
    if (!os::exists(memoryState)) {
      return Error::make(Code::kUnsupported, "snapshot " + spec.fromSnapshot +
                                                 " holds no memory of a guest saved under " +
                                                 (host_.kvm ? "kvm" : "tcg") + " (this moatd's microVMs run on it)");
    }
    image = memoryDir(spec.fromSnapshot) + kOwnRootImage;
  } else {
    MOAT_ASSIGN(image, imageFor(spec.templateName));
  }
  MOAT_ASSIGN(std::string initrd, initramfs());
  auto guest = newGuest();
  MOAT_ASSIGN(auto ids, isolation::namespaces::leaseIdMap());
  guest->ids.emplace(std::move(ids));
  // QEMU's cgroup: its CPU time is the spec's, its memory the guest's RAM
  // and what QEMU needs beside it (TCG's cache, its own), its tasks a few
  // threads per vCPU. Made before the guest is published: usage() reads it.
  const auto limits = qemuLimits(spec.cpus, spec.memoryMb, host_.kvm);
  MOAT_ASSIGN(auto layout, isolation::cgroup::preparedHostLayout(false));
  MOAT_ASSIGN(guest->cgroup, isolation::cgroup::createUnderPreparedParents(layout, cgroupPrefix_ + spec.id, limits));
  guest->dir = dir_ + "/vms/" + spec.id;
  MOAT_TRY(os::makeDirs(dir_ + "/vms", 0700, 0700));
  if (::mkdir(guest->dir.c_str(), 0700) != 0) return Error::fromErrno("mkdir " + guest->dir);
  {
    std::lock_guard lock(mutex_);
    if (guests_.count(spec.id)) {
      return Error::make(Code::kConflict, "microVM environment " + spec.id + " exists");
    }
    guests_[spec.id] = guest;  // a destroy from here on finds it
  }
  // Its writable layer: a disk in a volume of the storage pool, new or a
  // copy of a snapshot's (a fork, a restore), which QEMU's ids own. Marked
  // first: a destroy from here on removes it, and one that came while it
  // was made leaves it to this create to remove.
  const uint64_t storageBytes = storageLimitBytes(spec.storageGb);
  {
    std::lock_guard lock(mutex_);
    guest->volume = true;
  }
  auto volume = makeVolume(pool, spec, storageBytes, *guest);
  if (find(spec.id) != guest) {
    (void)removeVolume(spec.id);
    return Error::make(Code::kConflict, "microVM environment " + spec.id + " was destroyed while being created");
  }
  if (!volume.ok()) {
    guest.reset();  // destroy waits for every other holder
    (void)destroy(spec.id);
    return volume.error();
  }
  // The image it boots, kept beside it for as long as it lives: a restore
  // of its checkpoint needs the very file its kernel read (images are made
  // again, not kept, across moatd restarts).
  if (::link(image.c_str(), (guest->dir + kOwnRootImage).c_str()) != 0) {
    // (Without it, this guest cannot be checkpointed, and says so.)
    moat::log::warnf("microVM %s keeps no link of its root image (%s): it cannot be checkpointed\n", spec.id.c_str(),
                     std::strerror(errno));
  }
  VmSpec vm = vmSpecFor(spec, *guest, volume.value(), image, initrd);
  Status up;
  if (spec.withMemory) {
    // Its source's guest as it was at the snapshot, processes and all.
    auto state = os::open(memoryState, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (state.ok()) vm.incomingState = state->get();
    up = state.ok() ? runRestored(*guest, vm, spec) : Status{state.error()};
  } else {
    up = runSavedOrBooted(*guest, vm, spec);
  }
  if (!up.ok()) {
    guest.reset();  // destroy waits for every other holder
    (void)destroy(spec.id);
    return up.error();
  }
  return Created{spec.id, guest->vm->takeControl()};
}

Status MicroVmBackend::runSavedOrBooted(Guest& guest, VmSpec& vm, const Spec& spec) {
  // Restored from the saved guest of this template and machine, else
  // booted (docs/MICROVM.md, "Saved guests").
  auto saved = saved_.take(vm, spec.id);
  if (saved.ok()) {
    vm.park = true;
    vm.incomingState = saved->state.get();
  } else if (saved.error().code != Code::kUnavailable && saved.error().code != Code::kUnsupported) {
    moat::log::infof("no saved guest for template %s (its creates boot): %s\n", spec.templateName.c_str(),
                     saved.error().message().c_str());
  }
  Status up = run(guest, vm, spec);
  if (!up.ok() && vm.park && find(spec.id) && up.error().code != Code::kConflict) {
    // A saved guest that does not restore (a damaged file, say) is removed,
    // and this create boots.
    moat::log::warnf("saved guest %s did not restore (removed; booting): %s\n", saved->name.c_str(),
                     up.error().message().c_str());
    saved_.forget(saved->name);
    std::shared_ptr<Vm> failed;  // reaped outside the lock (a destroy may want it)
    {
      std::lock_guard lock(mutex_);
      if (guest.vm) {
        guest.vm->kill();
        failed = std::move(guest.vm);
      }
    }
    failed.reset();
    (void)::unlink(vm.consoleLog.c_str());
    vm.park = false;
    vm.incomingState = -1;
    up = run(guest, vm, spec);
  }
  return up;
}

VmSpec MicroVmBackend::vmSpecFor(const Spec& spec, const Guest& guest, const std::string& volume,
                                 const std::string& image, const std::string& initramfs) const {
  VmSpec vm;
  vm.cgroupJoin = guest.cgroup->procsFiles();
  vm.kernel = host_.kernel;
  vm.initBinary = host_.initBinary;
  vm.initramfs = initramfs;
  vm.rootImage = image;
  vm.workDir = guest.dir;
  // As many vCPUs as the spec's CPU time rounded up, at most the host's
  // (each is a thread; the cgroup bounds their time).
  const unsigned hostCpus = std::max(1u, std::thread::hardware_concurrency());
  vm.cpus = std::min(hostCpus, static_cast<unsigned>(std::max(1.0, std::ceil(spec.cpus))));
  vm.memoryMb = spec.memoryMb;
  vm.storageBytes = storageLimitBytes(spec.storageGb);
  vm.disk = volume + kLayerDisk;
  vm.consoleLog = volume + kConsoleLog;
  vm.pids = spec.pids;
  vm.kvm = host_.kvm;
  vm.uid = guest.ids->map.hostBase;
  vm.gid = guest.ids->map.hostBase;
  vm.hostname = spec.id;
  vm.monitor = true;  // ports are forwarded through it
  // It outlives this moatd (a restart re-attaches) and holds its id range.
  vm.lasting = true;
  vm.holdFd = guest.ids->lock.fd();
  return vm;
}

Result<std::string> MicroVmBackend::makeVolume(isolation::fs::StoragePool& pool, const Spec& spec,
                                               uint64_t storageBytes, Guest& guest) {
  // The disk is written in place (no copy on write, writeLayerDisk), but
  // the first write to each block it shares with a snapshot copies it, and
  // btrfs counts an extent whole while any of it is used: at most twice
  // the disk, its console's 16 MiB beside.
  const uint64_t limit = 2 * storageBytes + kVolumeSlackBytes;
  const uid_t uid = guest.ids->map.hostBase;
  std::string volume;
  if (spec.fromSnapshot.empty()) {
    MOAT_ASSIGN(volume, pool.createVolume(spec.id, limit));
    MOAT_TRY(writeLayerDisk(volume + kLayerDisk, storageBytes, uid, uid));
    return volume;
  }
  MOAT_ASSIGN(volume, pool.createVolumeFromSnapshot(spec.fromSnapshot, spec.id, limit));
  // The snapshot's console is the guest's it was taken of.
  (void)::unlink((volume + kConsoleLog).c_str());
  // Its disk, now this guest's QEMU's (a volume of moatd's: no guest ever
  // reaches a path of it).
  auto disk = os::open(volume + kLayerDisk, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (!disk.ok() && disk.error().sysErrno == ENOENT) {
    return Error::make(Code::kInvalidArgument,
                       "snapshot " + spec.fromSnapshot + " holds no microVM's disk (it is of a namespace environment)");
  }
  if (!disk.ok()) return disk.error();
  if (::fchown(disk->get(), uid, uid) != 0) return Error::fromErrno("chown " + volume + kLayerDisk);
  return volume;
}

Result<std::string> MicroVmBackend::volumeOf(const std::string& id) const {
  // No storage pool: no volume (and none is made to look).
  if (!isolation::fs::StoragePool::made(stateDir_)) return Error::make(Code::kNotFound, "no storage pool");
  MOAT_ASSIGN(isolation::fs::StoragePool pool, isolation::fs::StoragePool::open(stateDir_));
  std::string volume = pool.volumePath(id);
  if (!os::exists(volume)) return Error::make(Code::kNotFound, "no volume " + id);
  return volume;
}

bool MicroVmBackend::removeVolume(const std::string& id) {
  Status s = [&]() -> Status {
    if (!isolation::fs::StoragePool::made(stateDir_)) return {};
    MOAT_ASSIGN(isolation::fs::StoragePool pool, isolation::fs::StoragePool::open(stateDir_));
    return pool.destroyVolume(id);  // a volume not there is fine
  }();
  if (!s.ok()) {
    moat::log::warnf("microVM %s's volume stays (removed at the next start): %s\n", id.c_str(),
                     s.error().message().c_str());
    return false;
  }
  return true;
}

Result<std::shared_ptr<Vm>> MicroVmBackend::startFor(Guest& guest, const VmSpec& vm, const std::string& id) {
  MOAT_ASSIGN(Vm started, launcher_.run([&vm] { return Vm::start(vm); }));
  std::lock_guard lock(mutex_);
  if (guests_.count(id) == 0) {
    // Destroyed while QEMU started.
    started.kill();
    return Error::make(Code::kConflict, "microVM environment " + id + " was destroyed while being created");
  }
  guest.vm = std::make_shared<Vm>(std::move(started));
  return guest.vm;
}

Status MicroVmBackend::run(Guest& guest, const VmSpec& vm, const Spec& spec) {
  MOAT_ASSIGN(std::shared_ptr<Vm> running, startFor(guest, vm, spec.id));
  if (vm.incomingState >= 0) {
    // Who it is and its limits; the guest answers Hello once it has made
    // its root with them. A fresh identity: its own name, entropy, clock.
    init::GuestResume resume;
    resume.hostname = spec.id;
    resume.storageBytes = vm.storageBytes;
    resume.pids = vm.pids;
    MOAT_ASSIGN(resume.seed, randomBytes(32));
    resume.realtimeNs = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
    MOAT_TRY(init::writeFrame(running->control(), init::MsgType::kResume, resume.encode()));
  }
  MOAT_TRY(running->awaitGuest(bootWait_));
  // moat-init in a guest is the guest's to stop: moatd's writes to it wait
  // at most kGuestSendWait (then the connection ends), never for good.
  return os::setSendTimeout(running->control(), kGuestSendWait);
}

Status MicroVmBackend::runRestored(Guest& guest, const VmSpec& vm, const Spec& spec) {
  MOAT_ASSIGN(std::shared_ptr<Vm> running, startFor(guest, vm, spec.id));
  MOAT_TRY(loadSaved(*running, bootWait_, "microVM environment " + spec.id + " did not go on from its snapshot"));
  return os::setSendTimeout(running->control(), kGuestSendWait);
}

std::string MicroVmBackend::memoryDir(const std::string& name) const { return dir_ + "/memory/" + name; }

std::shared_ptr<MicroVmBackend::Guest> MicroVmBackend::take(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = guests_.find(id);
  if (it == guests_.end()) return nullptr;
  auto guest = std::move(it->second);
  guests_.erase(it);
  if (guest->vm) guest->vm->kill();  // a create waiting for its boot sees it end
  if (guest->cgroup) guest->cgroup->killAll();
  return guest;
}

std::shared_ptr<MicroVmBackend::Guest> MicroVmBackend::find(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = guests_.find(id);
  return it == guests_.end() ? nullptr : it->second;
}

Status MicroVmBackend::destroy(const std::string& id) {
  auto guest = take(id);
  if (!guest) return {};
  const std::string dir = guest->dir;
  bool volume = false;
  {
    std::lock_guard lock(mutex_);
    volume = guest->volume;
  }
  // Those who hold it for a moment (a port's connection, a usage reading,
  // a create whose boot take() ended) let go once its QEMU is gone: its
  // cgroup and lease go with the last holder, and a restore's create of
  // the same id must not find them. Reaped here when this is the last.
  const auto released = guest->released;
  guest.reset();
  {
    std::unique_lock lock(released->mutex);
    if (!released->cv.wait_for(lock, std::chrono::seconds(10), [&] { return released->done; })) {
      moat::log::warnf("microVM %s is still held 10 s after its QEMU was ended (its files are removed)\n", id.c_str());
    }
  }
  // Its directory is what the next moatd's start finds it by: kept while
  // its volume could not be removed.
  if (volume && !removeVolume(id)) return {};  // the next start removes it (said on moatd's log)
  return os::removeTree(dir);
}

std::shared_ptr<Vm> MicroVmBackend::vmOf(const std::shared_ptr<Guest>& guest) {
  std::lock_guard lock(mutex_);
  return guest ? guest->vm : nullptr;
}

std::string MicroVmBackend::whyEnded(const std::string& id) {
  auto vm = vmOf(find(id));
  if (!vm) return "";
  // The connection closes as QEMU ends (or as the guest's kernel stops):
  // its exit, and the console's last words, follow in moments.
  return vm->whyEnded(std::chrono::milliseconds(500));
}

Result<UniqueFd> MicroVmBackend::attach(const std::string& id) {
  auto guest = find(id);  // held: its Vm is not reaped while this runs
  if (guest && checkpointed(id)) {
    return Error::make(Code::kConflict, "microVM environment " + id + " is checkpointed to disk: resume it first");
  }
  auto vm = vmOf(guest);
  if (!vm) return Error::make(Code::kNotFound, "no microVM environment " + id);
  UniqueFd control;
  {
    std::lock_guard lock(mutex_);
    control = std::move(guest->reattached);  // made at adoption
  }
  if (!control) {
    MOAT_ASSIGN(control, vm->reattach(kGuestReattachWait));
  }
  MOAT_TRY(os::setSendTimeout(control.get(), kGuestSendWait));
  return control;
}

Result<std::vector<std::string>> MicroVmBackend::list() {
  if (!notAdopted_.empty()) return Error::make(Code::kUnavailable, notAdopted_);
  std::lock_guard lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& [id, guest] : guests_) ids.push_back(id);
  return ids;
}

bool MicroVmBackend::runs(const std::string& id) {
  std::lock_guard lock(mutex_);
  return guests_.count(id) > 0;
}

Result<Usage> MicroVmBackend::usage(const std::string& id) {
  auto guest = find(id);
  std::shared_ptr<isolation::cgroup::Cgroup> cgroup;
  bool onDisk = false;
  {
    std::lock_guard lock(mutex_);
    if (guest) cgroup = guest->cgroup;
    onDisk = guest && guest->checkpointed;
  }
  if (onDisk) {
    Usage usage;  // nothing runs: its disk alone
    countStorage(stateDir_, id, usage);
    return usage;
  }
  if (!cgroup) return Error::make(Code::kNotFound, "no microVM environment " + id);
  // QEMU's cgroup's: the guest's memory as QEMU touched it, TCG's cache,
  // QEMU's own. Its tasks are QEMU's threads, not the guest's processes:
  // pids stays 0 here (the manager asks the guest's moat-init).
  auto counted = cgroup->usage();
  Usage usage;
  usage.cpuKnown = counted.cpuUsec.has_value();
  usage.cpuUsec = counted.cpuUsec.value_or(0);
  usage.memoryBytes = counted.memoryBytes;
  usage.oomKills = counted.oomKills;
  countStorage(stateDir_, id, usage);
  return usage;
}

Result<UniqueFd> MicroVmBackend::networkNamespace(const std::string& id) {
  // QEMU's: the guest's connections leave QEMU's user-mode network from
  // there, so the egress link goes in it (docs/MICROVM.md, "Network").
  auto guest = find(id);
  if (!guest) return Error::make(Code::kNotFound, "no microVM environment " + id);
  UniqueFd netns;
  {
    std::lock_guard lock(mutex_);
    if (!guest->vm) return Error::make(Code::kUnavailable, "microVM environment " + id + " is not running");
    MOAT_ASSIGN(netns, os::networkNamespaceOf(guest->vm->pidfd()));
  }
  // QEMU makes its namespace between its fork and its exec: never link
  // moatd's own.
  MOAT_ASSIGN(std::string qemus, os::namespaceIdentity(netns.get()));
  MOAT_ASSIGN(UniqueFd own, os::openNetworkNamespace("/proc/self/ns/net"));
  MOAT_ASSIGN(std::string owns, os::namespaceIdentity(own.get()));
  if (qemus == owns) {
    return Error::make(Code::kUnavailable, "microVM environment " + id + "'s QEMU has no network namespace yet");
  }
  return netns;
}

Result<UniqueFd> MicroVmBackend::connectPort(const std::string& id, uint16_t port, std::chrono::milliseconds timeout) {
  // The server is the guest's: QEMU forwards its own 127.0.0.1:port (in
  // its namespace, reached by moatd alone) to the guest's port
  // (docs/MICROVM.md, "Ports").
  MOAT_ASSIGN(UniqueFd netns, networkNamespace(id));
  auto guest = find(id);   // held: its Vm is not reaped while this runs
  std::shared_ptr<Vm> vm;  // reaped by its last holder
  {
    std::lock_guard lock(mutex_);
    if (guest) vm = guest->vm;
  }
  if (!vm) return Error::make(Code::kConflict, "microVM environment " + id + " is not running");
  {
    MOAT_ASSIGN(auto netlink, os::Netlink::open(netns.get()));
    MOAT_TRY(netlink.setLinkUp("lo"));
  }
  MOAT_TRY(vm->forwardPort(port, std::max(timeout, std::chrono::milliseconds(5000))));
  return os::connectLoopbackIn(netns.get(), port, timeout, kForwardAddress);
}

Result<uint32_t> MicroVmBackend::snapshot(const std::string& id, const std::string& name) {
  auto guest = find(id);   // held: its Vm is not reaped while this runs
  std::shared_ptr<Vm> vm;  // reaped by its last holder
  bool volume = false;
  {
    std::lock_guard lock(mutex_);
    if (guest) vm = guest->vm;
    volume = guest && guest->volume;
  }
  if (!vm) return Error::make(Code::kConflict, "microVM environment " + id + " is not running");
  if (!volume) {
    return Error::make(Code::kUnsupported, "microVM environment " + id +
                                               " keeps its files in its memory (made by an earlier moatd): it "
                                               "cannot be snapshotted");
  }
  MOAT_ASSIGN(isolation::fs::StoragePool pool, isolation::fs::StoragePool::open(stateDir_));
  // Its volume copied while the guest is stopped: the disk then holds all
  // the guest wrote to it (what it wrote to files and has not written to
  // its disk, the manager has it sync first). A copy on btrfs shares every
  // extent: the pause is short whatever the disk holds.
  MOAT_TRY(vm->whilePaused([&] { return pool.snapshotVolume(id, name); }, kSnapshotWait));
  return 0u;  // its files' owners are the guest's own ids, inside its disk
}

Result<uint32_t> MicroVmBackend::snapshotWithMemory(const std::string& id, const std::string& name) {
  auto guest = find(id);   // held: its Vm is not reaped while this runs
  std::shared_ptr<Vm> vm;  // reaped by its last holder
  std::shared_ptr<isolation::cgroup::Cgroup> qemuCgroup;
  {
    std::lock_guard lock(mutex_);
    if (guest && guest->checkpointed) {
      return Error::make(Code::kConflict, "microVM environment " + id + " is checkpointed to disk: resume it first");
    }
    if (guest && !guest->volume) {
      return Error::make(Code::kUnsupported, "microVM environment " + id +
                                                 " keeps its files in its memory (made by an earlier moatd): it "
                                                 "cannot be forked with its memory");
    }
    if (guest) {
      vm = guest->vm;
      qemuCgroup = guest->cgroup;
    }
  }
  if (!vm) return Error::make(Code::kConflict, "microVM environment " + id + " is not running");
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    return Error::make(Code::kInvalidArgument, "snapshot name '" + name + "'");
  }
  MOAT_ASSIGN(isolation::fs::StoragePool pool, isolation::fs::StoragePool::open(stateDir_));
  const uint64_t heldBytes = qemuCgroup ? qemuCgroup->usage().memoryBytes : 0;
  MOAT_TRY(os::makeDirs(dir_ + "/memory", 0700, 0700));
  MOAT_TRY(roomToSave(dir_ + "/memory", "a fork with the memory of microVM environment " + id, heldBytes));
  // Beside the copy of its volume (deleteSnapshot removes both, and
  // whatever of them a failure here left): the root image its kernel read
  // and its state, root's alone.
  const std::string dir = memoryDir(name);
  if (::mkdir(dir.c_str(), 0700) != 0) return Error::fromErrno("mkdir " + dir);
  if (::link((guest->dir + kOwnRootImage).c_str(), (dir + kOwnRootImage).c_str()) != 0) {
    if (errno == ENOENT) {
      return Error::make(Code::kUnsupported, "microVM environment " + id +
                                                 " was made by an earlier moatd, which kept no copy of its root "
                                                 "image: it cannot be forked with its memory");
    }
    return Error::fromErrno("link " + dir + kOwnRootImage);
  }
  const std::string statePath = dir + checkpointName(host_.kvm);
  MOAT_ASSIGN(UniqueFd state, os::open(statePath, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  // As a checkpoint's save (its deadline too); the guest is then held
  // stopped while its volume is copied, so that the disk and the memory
  // are of one moment, and let go on whatever came of it.
  MOAT_TRY(vm->saveStopped(state.get(), saveWait(heldBytes)));  // a failure let the guest go on
  Status copied = pool.snapshotVolume(id, name);
  if (Status resumed = vm->resume(kGuestSendWait); !resumed.ok()) {
    vm->kill();  // not left stopped: its connection's end ends it
    return Error::make(Code::kUnavailable,
                       "microVM environment " + id +
                           " did not go on after its memory was saved (it was ended): " + resumed.error().message());
  }
  MOAT_TRY(copied);
  return 0u;  // its files' owners are the guest's own ids, inside its disk
}

// Snapshots live in the storage pool the namespace backend's do; those
// taken with memory keep it here too.
Status MicroVmBackend::deleteSnapshot(const std::string& name) {
  if (!name.empty() && name.find('/') == std::string::npos && name[0] != '.') {
    const std::string dir = memoryDir(name);
    for (const std::string& file : {std::string(kOwnRootImage), checkpointName(false), checkpointName(true)}) {
      if (::unlink((dir + file).c_str()) != 0 && errno != ENOENT) return Error::fromErrno("remove " + dir + file);
    }
    if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) return Error::fromErrno("remove " + dir);
  }
  return isolation::fs::StoragePool::destroySnapshotIn(stateDir_, name);
}

Result<std::vector<std::string>> MicroVmBackend::snapshots() {
  return isolation::fs::StoragePool::snapshotsIn(stateDir_);
}

// Its guest lists them (the manager asks its moat-init: file op 14); the
// host never reads a guest's disk.
Result<Changes> MicroVmBackend::changes(const ChangesRequest& request) {
  return Error::make(Code::kUnsupported, "microVM environment " + request.id +
                                             "'s changes are listed by its guest, not read from the host");
}

bool MicroVmBackend::checkpointed(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = guests_.find(id);
  return it != guests_.end() && it->second->checkpointed;
}

Result<uint64_t> MicroVmBackend::checkpoint(const std::string& id) {
  auto guest = find(id);   // held: its Vm is not reaped while this runs
  std::shared_ptr<Vm> vm;  // reaped by its last holder
  std::shared_ptr<isolation::cgroup::Cgroup> qemuCgroup;
  {
    std::lock_guard lock(mutex_);
    if (guest && guest->checkpointed) {
      struct stat st;
      return ::stat((guest->dir + checkpointName(host_.kvm)).c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    }
    if (guest) {
      vm = guest->vm;
      qemuCgroup = guest->cgroup;
    }
    if (guest && !guest->volume) {
      return Error::make(Code::kUnsupported, "microVM environment " + id +
                                                 " keeps its files in its memory (made by an earlier moatd): it "
                                                 "cannot be checkpointed");
    }
  }
  if (!vm) return Error::make(Code::kConflict, "microVM environment " + id + " is not running");
  if (!os::exists(guest->dir + kOwnRootImage)) {
    return Error::make(Code::kUnsupported, "microVM environment " + id +
                                               " was made by an earlier moatd, which kept no copy of its root "
                                               "image: it cannot be checkpointed");
  }
  const uint64_t heldBytes = qemuCgroup ? qemuCgroup->usage().memoryBytes : 0;
  MOAT_TRY(roomToSave(guest->dir, "the checkpoint of microVM environment " + id, heldBytes));
  const std::string partial = guest->dir + kCheckpointPartial;
  (void)::unlink(partial.c_str());  // a checkpoint that failed before
  MOAT_ASSIGN(UniqueFd state, os::open(partial, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  // QEMU stops the guest and writes its migration stream there (its disk's
  // writes drained at the end); a save that fails lets the guest go on as
  // it was. QEMU is ended only once the file is complete and kept: until
  // then a moatd that dies leaves a stopped guest, which the next adopts
  // and lets go on. A large guest's save is given time by its size (20 ms
  // a MiB of what QEMU holds, at least kGuestSaveWait).
  if (Status saved = vm->saveStopped(state.get(), saveWait(heldBytes)); !saved.ok()) {
    (void)::unlink(partial.c_str());
    return saved.error();
  }
  const std::string complete = guest->dir + checkpointName(host_.kvm);
  struct stat st;
  Status kept = [&]() -> Status {
    if (::fsync(state.get()) != 0 || ::fstat(state.get(), &st) != 0) return Error::fromErrno("write " + partial);
    // Written and synced: its pages need not stay in memory (the point).
    (void)::posix_fadvise(state.get(), 0, 0, POSIX_FADV_DONTNEED);
    if (::rename(partial.c_str(), complete.c_str()) != 0) return Error::fromErrno("rename " + partial);
    return os::syncFileSystemOf(guest->dir);
  }();
  state.reset();
  if (!kept.ok()) {
    (void)::unlink(partial.c_str());
    (void)::unlink(complete.c_str());
    if (Status resumed = vm->resume(kGuestSendWait); !resumed.ok()) vm->kill();  // not left stopped
    return kept.error();
  }
  vm->kill();
  std::shared_ptr<Vm> ended;  // reaped outside the lock (by its last holder)
  std::shared_ptr<isolation::cgroup::Cgroup> cgroup;
  {
    std::lock_guard lock(mutex_);
    if (guest->vm) {
      ended = std::move(guest->vm);
    }
    cgroup = std::move(guest->cgroup);
    guest->checkpointed = true;
  }
  ended.reset();
  // QEMU's cgroup goes too (what it charged, the page cache of what QEMU
  // wrote, with it): the restore makes it again, as after a host reboot.
  if (cgroup) (void)cgroup->remove();
  // Its disk is root's while no QEMU of it runs: its id range, free once a
  // restart lets go of it, may serve another environment meanwhile.
  if (auto volume = volumeOf(id); volume.ok()) {
    if (auto disk = os::open(volume.value() + kLayerDisk, O_RDWR | O_NOFOLLOW | O_CLOEXEC); disk.ok()) {
      (void)::fchown(disk->get(), 0, 0);
    }
  }
  return static_cast<uint64_t>(st.st_size);
}

Result<UniqueFd> MicroVmBackend::restoreCheckpoint(const Spec& spec) {
  auto guest = find(spec.id);
  {
    std::lock_guard lock(mutex_);
    if (!guest || !guest->checkpointed) {
      return Error::make(Code::kConflict, "microVM environment " + spec.id + " has no checkpoint");
    }
  }
  const std::string state = guest->dir + checkpointName(host_.kvm);
  if (!os::exists(state)) {
    return Error::make(Code::kUnsupported, "microVM environment " + spec.id + " was checkpointed under " +
                                               (host_.kvm ? "tcg" : "kvm") + ", and this moatd's microVMs run on " +
                                               (host_.kvm ? "kvm" : "tcg") + ": a guest restores only as it was saved");
  }
  MOAT_ASSIGN(std::string initrd, initramfs());
  MOAT_ASSIGN(std::string volume, volumeOf(spec.id));
  // Its cgroup (gone after a host reboot) and its id range (QEMU's, taken
  // again after a moatd restart, and its disk made that range's).
  if (!guest->cgroup) {
    MOAT_ASSIGN(auto layout, isolation::cgroup::preparedHostLayout(false));
    std::unique_ptr<isolation::cgroup::Cgroup> made;
    if (auto left = isolation::cgroup::Cgroup::open(layout, cgroupPrefix_ + spec.id); left.ok()) {
      if (!left->processes().empty()) {
        left->leaveInPlace();  // not this restore's to end
        return Error::make(Code::kConflict,
                           "a process runs in the cgroup of microVM environment " + spec.id + " while it is on disk");
      }
      made = std::make_unique<isolation::cgroup::Cgroup>(std::move(left.value()));
    } else {
      MOAT_ASSIGN(made, isolation::cgroup::createUnderPreparedParents(layout, cgroupPrefix_ + spec.id,
                                                                      qemuLimits(spec.cpus, spec.memoryMb, host_.kvm)));
    }
    std::lock_guard lock(mutex_);
    guest->cgroup = std::move(made);
  }
  if (!guest->ids) {
    MOAT_ASSIGN(auto ids, isolation::namespaces::leaseIdMap());
    std::lock_guard lock(mutex_);
    guest->ids.emplace(std::move(ids));
  }
  {
    // Root's while it was on disk (its id range may have served another
    // meanwhile): its QEMU's again.
    const uid_t uid = guest->ids->map.hostBase;
    MOAT_ASSIGN(UniqueFd disk, os::open(volume + kLayerDisk, O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (::fchown(disk.get(), uid, uid) != 0) return Error::fromErrno("chown " + volume + kLayerDisk);
  }
  // A console of its own again (the last is the QEMU's that saved it).
  (void)::unlink((volume + kConsoleLog).c_str());
  VmSpec vm = vmSpecFor(spec, *guest, volume, guest->dir + kOwnRootImage, initrd);
  MOAT_ASSIGN(UniqueFd stateFd, os::open(state, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  vm.incomingState = stateFd.get();
  MOAT_ASSIGN(Vm started, launcher_.run([&vm] { return Vm::start(vm); }));
  // The guest goes on where it was saved, in the middle of its conversation
  // with the host that saved it: a nonce tells where the new one begins.
  if (Status loaded =
          loadSaved(started, bootWait_, "microVM environment " + spec.id + " did not come back from its checkpoint");
      !loaded.ok()) {
    started.kill();
    return loaded.error();
  }
  MOAT_TRY(os::setSendTimeout(started.control(), kGuestSendWait));
  UniqueFd control = started.takeControl();
  {
    std::lock_guard lock(mutex_);
    if (guests_.count(spec.id) == 0) {
      started.kill();
      return Error::make(Code::kConflict, "microVM environment " + spec.id + " was destroyed while being restored");
    }
    guest->vm = std::make_shared<Vm>(std::move(started));
    guest->checkpointed = false;
  }
  (void)::unlink(state.c_str());
  return control;
}

}  // namespace moat::backend::microvm
