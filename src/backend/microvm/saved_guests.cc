#include "backend/microvm/saved_guests.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <functional>

#include "init/protocol.h"
#include "isolation/cgroup/cgroup.h"
#include "os/file.h"

namespace moat::backend::microvm {

SavedGuests::SavedGuests(std::string dir, size_t keep, std::chrono::seconds bootWait, std::string cgroupPrefix,
                         DedicatedThread& launcher)
    : dir_(std::move(dir)),
      keep_(keep),
      bootWait_(bootWait),
      cgroupPrefix_(std::move(cgroupPrefix)),
      launcher_(launcher) {}

Result<std::string> SavedGuests::nameOf(const VmSpec& vm) const {
  // What a state restores only into: the same image and machine, and the
  // same QEMU and guest kernel (another version of either cannot take it).
  MOAT_ASSIGN(std::string qemu, findProgram("MOAT_QEMU", "qemu-system-x86_64", "qemu-system-x86"));
  std::string identity = vm.kvm ? "kvm" : "tcg";
  if (!vm.disk.empty() || vm.scratchDisk) identity += "|disk";
  for (const std::string& file : {qemu, vm.kernel.image}) {
    struct stat st;
    if (::stat(file.c_str(), &st) != 0) return Error::fromErrno("stat " + file);
    identity += "|" + file + ":" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
                std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
  }
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016zx", std::hash<std::string>{}(identity));
  return vm.rootImage.substr(vm.rootImage.rfind('/') + 1) + "-" + std::to_string(vm.memoryMb) + "m-" +
         std::to_string(vm.cpus) + "c-" + hash + ".state";
}

Result<SavedGuests::Saved> SavedGuests::take(const VmSpec& vm, const std::string& id) {
  if (keep_ == 0) return Error::make(Code::kUnsupported, "moatd --microvm-saved-guests 0");
  MOAT_ASSIGN(std::string name, nameOf(vm));
  const std::string path = dir_ + "/" + name;
  MOAT_TRY(os::makeDirs(dir_, 0700, 0700));
  auto held = names_.tryExclusive(name);
  if (!held) return Error::make(Code::kUnavailable, "a save of this guest is under way");
  // Opened while its lock is held: an eviction after this does not take it
  // from this create.
  auto open = [&]() -> Result<Saved> {
    MOAT_ASSIGN(UniqueFd state, os::open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    std::lock_guard files(mutex_);
    order_.remove(name);
    order_.push_back(name);
    return Saved{name, std::move(state)};
  };
  if (::access(path.c_str(), F_OK) == 0) return open();
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard files(mutex_);
    if (records_.size() > 4096) records_.clear();  // bounded: callers may ask for ever new machines
    auto& record = records_[name];
    if (now < record.retryAt) return Error::make(Code::kUnavailable, "its last save failed a moment ago");
    // A machine asked for once is not worth a save (3 s here, and its RAM
    // on disk): ever new ram_mb values make none.
    if (++record.asks < 2) return Error::make(Code::kUnavailable, "the first create of it boots; the next saves it");
    if (saving_ > 0) return Error::make(Code::kUnavailable, "another save is under way");
    ++saving_;
  }
  Status made = save(vm, id, path);
  {
    std::lock_guard files(mutex_);
    --saving_;
    if (!made.ok()) {
      records_[name] = Record{0, now + kRetryAfter};
      return made.error();
    }
  }
  evictFor(name);
  return open();
}

Status SavedGuests::save(const VmSpec& vm, const std::string& id, const std::string& path) {
  // Its own directory: the parked guest's console, and the state while it
  // is written (renamed into place once whole).
  std::string scratch = dir_ + "/.save-XXXXXX";
  if (!::mkdtemp(scratch.data())) return Error::fromErrno("mkdtemp " + scratch);
  Status made = [&]() -> Status {
    // A cgroup of moatd's, not the create's: its limits are the machine's,
    // whatever CPU time the environment that asked has.
    MOAT_ASSIGN(auto layout, isolation::cgroup::preparedHostLayout(false));
    MOAT_ASSIGN(auto cgroup, isolation::cgroup::createUnderPreparedParents(layout, cgroupPrefix_ + "save-" + id,
                                                                           qemuLimits(vm.cpus, vm.memoryMb, vm.kvm)));
    VmSpec parked = vm;
    parked.workDir = scratch;
    parked.cgroupJoin = cgroup->procsFiles();
    parked.park = true;
    parked.monitor = true;
    parked.incomingState = -1;
    // Each copy restored from it gets its own disk: this one parks before
    // it reads any.
    parked.scratchDisk = !vm.disk.empty() || vm.scratchDisk;
    parked.disk.clear();
    parked.consoleLog.clear();
    // It dies with this moatd (a save is not worth adopting).
    parked.lasting = false;
    parked.holdFd = -1;
    if ((vm.uid != 0 || vm.gid != 0) && ::chown(scratch.c_str(), vm.uid, vm.gid) != 0) {
      return Error::fromErrno("chown " + scratch);
    }
    // Reaped before its cgroup goes (declared after it).
    MOAT_ASSIGN(Vm booted, launcher_.run([&parked] { return Vm::start(parked); }));
    MOAT_TRY(booted.awaitGuest(bootWait_));
    init::FrameReader reader;
    MOAT_ASSIGN(init::Frame first, init::readFrame(booted.control(), reader));
    if (first.type != init::MsgType::kParked) {
      return Error::make(Code::kProtocol, "a parked guest's first message was not Parked");
    }
    MOAT_ASSIGN(UniqueFd state,
                os::open(scratch + "/state", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    MOAT_TRY(booted.save(state.get(), kGuestSaveWait));
    if (::rename((scratch + "/state").c_str(), path.c_str()) != 0) return Error::fromErrno("rename " + path);
    return {};
  }();
  (void)os::removeTree(scratch);
  return made;
}

void SavedGuests::evictFor(const std::string& name) {
  // At most keep_ kept (each about as large as the RAM a boot touches): the
  // least recently used go, but none being made, opened or removed.
  std::lock_guard files(mutex_);
  for (auto it = order_.begin(); order_.size() >= keep_ && it != order_.end();) {
    if (*it == name) {  // its file went by other hands: made again here
      it = order_.erase(it);
      continue;
    }
    auto held = names_.tryExclusive(*it);
    if (!held) {
      ++it;
      continue;
    }
    (void)::unlink((dir_ + "/" + *it).c_str());
    it = order_.erase(it);
  }
}

void SavedGuests::forget(const std::string& name) {
  auto held = names_.exclusive(name);
  (void)::unlink((dir_ + "/" + name).c_str());
  std::lock_guard files(mutex_);
  order_.remove(name);
}

}  // namespace moat::backend::microvm
