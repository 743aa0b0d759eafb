#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "backend/microvm/accel.h"
#include "backend/microvm/saved_guests.h"
#include "backend/microvm/vm.h"
#include "common/dedicated_thread.h"
#include "common/keyed_lock.h"
#include "isolation/cgroup/cgroup.h"
#include "isolation/fs/storage_pool.h"
#include "isolation/namespaces/user_namespace.h"

// Environments in microVMs behind moatd's seam (docs/MICROVM.md): each a
// QEMU of its own, booted from the template's root image (made once per
// template and moatd) or restored from a saved guest, with moat-init as
// the guest's pid 1 on the same guest protocol, and its writable layer on
// a disk in a volume of the storage pool (snapshots are copies of that
// volume). They outlive moatd, as the namespace backend's do: the next
// moatd of the state directory adopts them.
namespace moat::backend::microvm {

// What this host offers microVMs, looked at once (moatd's start, doctor).
struct HostSupport {
  bool available = false;
  std::string missing;   // why not: what to install or name
  bool kvm = false;      // QEMU's accelerator: KVM, or TCG (emulated)
  std::string accelWhy;  // what chose it (accel.h chooseAccel)
  GuestKernel kernel;
  std::string initBinary;
};
// `accel`: "kvm", "tcg" or "auto" (KVM where a probe boot under it works:
// accel.h chooseAccel; docs/MICROVM.md).
HostSupport probeHost(const std::string& accel);

// Whether a guest's saved state (a checkpoint, a memory fork's), at most
// about `heldBytes` (what its QEMU holds), fits in `freeBytes` with room to
// spare (kStateHeadroomBytes): refused before the guest is stopped, saying
// how much is needed and free (code "capacity"), rather than failing half
// written.
inline constexpr uint64_t kStateHeadroomBytes = 256ull << 20;
Status roomForState(const std::string& what, uint64_t freeBytes, uint64_t heldBytes);

class MicroVmBackend final : public Backend {
 public:
  // `bootWait`: how long a guest may take to answer (kGuestBootWait).
  // `savedGuests`: creates restore a guest saved once per template and
  // machine, at most that many kept (the least recently used go); 0: each
  // create boots.
  MicroVmBackend(std::string stateDir, HostSupport host, std::chrono::seconds bootWait = kGuestBootWait,
                 size_t savedGuests = kMaxSavedGuests);
  ~MicroVmBackend() override;  // leaves every VM running (for the next moatd)

  const HostSupport& host() const { return host_; }
  // Ends every guest's QEMU now, waiting for nothing (a stop hurried by a
  // second signal: their records go with the next moatd's start).
  void endAll();

  Result<Created> create(const Spec& spec) override;
  Status destroy(const std::string& id) override;
  Result<UniqueFd> attach(const std::string& id) override;
  Result<std::vector<std::string>> list() override;
  bool runs(const std::string& id) override;
  Result<Usage> usage(const std::string& id) override;
  Result<UniqueFd> networkNamespace(const std::string& id) override;
  Result<UniqueFd> connectPort(const std::string& id, uint16_t port, std::chrono::milliseconds timeout) override;
  Result<uint32_t> snapshot(const std::string& id, const std::string& name) override;
  Result<uint32_t> snapshotWithMemory(const std::string& id, const std::string& name) override;
  Status deleteSnapshot(const std::string& name) override;
  Result<std::vector<std::string>> snapshots() override;
  Result<Changes> changes(const ChangesRequest& request) override;
  std::string whyEnded(const std::string& id) override;
  Result<uint64_t> checkpoint(const std::string& id) override;
  Result<UniqueFd> restoreCheckpoint(const Spec& spec) override;
  bool checkpointed(const std::string& id) override;

 private:
  // Set once the last holder of a guest let go of it (its QEMU reaped, its
  // cgroup removed and its lease returned by Guest's members' destructors).
  struct Released {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  struct Guest {
    std::shared_ptr<Released> released;  // newGuest's
    std::string dir;
    bool volume = false;  // it has a volume in the storage pool (its disk, its console): mutex_
    std::optional<isolation::namespaces::IdMapLease> ids;  // QEMU's own
    // QEMU's (removed after it is reaped) and QEMU: replaced by a checkpoint
    // and its restore, so copied under mutex_ by whoever uses them.
    std::shared_ptr<isolation::cgroup::Cgroup> cgroup;
    std::shared_ptr<Vm> vm;
    UniqueFd reattached;  // an adopted guest's connection, made again for attach()
    // On disk, its QEMU gone (checkpoint()): mutex_.
    bool checkpointed = false;
  };
  // A guest whose release destroy() can wait for.
  static std::shared_ptr<Guest> newGuest();
  // The lease of the id range an adopted QEMU runs as, taken again when
  // QEMU no longer holds it.
  static std::optional<isolation::namespaces::IdMapLease> leaseHeldBy(pid_t qemu);
  // The root image of the template `name` (built on first use).
  Result<std::string> imageFor(const std::string& templateName);
  // Starts QEMU for `vm` as `guest`'s (environment `id`'s; a destroy from
  // then on ends it): refused, and QEMU ended, if it was destroyed meanwhile.
  Result<std::shared_ptr<Vm>> startFor(Guest& guest, const VmSpec& vm, const std::string& id);
  // Starts QEMU for `vm` (a restore when vm.incomingState is set: then
  // sends Resume) and waits for the guest's Hello.
  Status run(Guest& guest, const VmSpec& vm, const Spec& spec);
  // Runs `vm` restored from the saved guest of its template and machine
  // (one that does not restore is forgotten), else booted.
  Status runSavedOrBooted(Guest& guest, VmSpec& vm, const Spec& spec);
  // Starts QEMU for `vm`, restoring a guest saved running (a memory
  // snapshot's), lets it run once loaded and finds its conversation again:
  // the guest's Hello is next.
  Status runRestored(Guest& guest, const VmSpec& vm, const Spec& spec);
  // Where snapshot `name` keeps its memory (snapshotWithMemory): root's.
  std::string memoryDir(const std::string& name) const;
  Result<std::string> initramfs();
  // What QEMU runs for `spec` in `guest` (its cgroup and ids made): its
  // writable layer in `volume`, booting `image`.
  VmSpec vmSpecFor(const Spec& spec, const Guest& guest, const std::string& volume, const std::string& image,
                   const std::string& initramfs) const;
  // The volume of the guest being created (storage pool volume `spec.id`:
  // a new disk of `storageBytes`, or a copy of snapshot spec.fromSnapshot's).
  Result<std::string> makeVolume(isolation::fs::StoragePool& pool, const Spec& spec, uint64_t storageBytes,
                                 Guest& guest);
  // Guest `id`'s volume, when there is one; removes it.
  Result<std::string> volumeOf(const std::string& id) const;
  bool removeVolume(const std::string& id);  // false: it stays (said on moatd's log)
  // The images, saved guests and initramfs this process made (or the last).
  void removeMadeFiles();
  // The guests of the last moatd of this state directory that QEMU still
  // runs (their directories in vms/, their cgroups with QEMU in them).
  void adoptGuests(const Result<isolation::cgroup::Layout>& layout);
  std::shared_ptr<Guest> take(const std::string& id);
  // Its QEMU, held: a checkpoint may take it out of the guest meanwhile.
  std::shared_ptr<Vm> vmOf(const std::shared_ptr<Guest>& guest);
  std::shared_ptr<Guest> find(const std::string& id);

  const std::string stateDir_;
  std::string notAdopted_;  // set once, at construction: why the last moatd's guests could not be adopted
  const std::string dir_;   // <state>/microvm: root's alone
  const HostSupport host_;
  const std::chrono::seconds bootWait_;
  const std::string cgroupPrefix_;  // of this state directory's QEMU cgroups
  std::mutex filesMutex_;           // the initramfs
  std::string initramfs_;
  KeyedLock imageLocks_;  // an image name: held while it is made
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Guest>> guests_;
  DedicatedThread launcher_;  // QEMUs are forked here: they die with moatd
  SavedGuests saved_;
};

}  // namespace moat::backend::microvm
