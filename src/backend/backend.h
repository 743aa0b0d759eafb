#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "isolation/fs/layer_changes.h"

// What moatd's environment manager needs of whatever runs an environment:
// the seam between the manager (lifecycle, pools, snapshots' records) and
// one kind of isolation. backend/namespaces/ implements it with the
// namespace backend's spawner; the manager's unit tests use a recording
// fake. Every backend runs moat-init in each environment and hands back its
// guest protocol connection, so processes, files and shells work the same
// on all of them.
namespace moat::backend {

// What bounds an environment: the host kernel's namespaces, or a kernel of
// its own in a microVM (docs/MICROVM.md).
enum class Isolation { kNamespaces, kMicroVm };
const char* isolationName(Isolation isolation);  // "namespaces", "microvm"
std::optional<Isolation> isolationNamed(std::string_view name);

// The least memory a microVM guest gets (its kernel's own).
inline constexpr uint64_t kMicroVmMinMemoryMb = 128;
// The largest disk (storage limit) a microVM's writable layer may have.
inline constexpr uint64_t kMicroVmMaxStorageGb = 1024;

// One environment, whatever runs it.
struct Spec {
  std::string id;  // 12 lowercase hex digits (newEnvironmentId)
  Isolation isolation = Isolation::kNamespaces;
  std::string templateName = "host";
  double cpus = 1;
  uint64_t memoryMb = 1024;
  uint64_t pids = 1024;
  double storageGb = 4;  // fractional: 0.5 is 512 MiB
  // Not empty: the writable layer starts as a copy of this snapshot (a fork,
  // a restore) instead of empty; snapshotHostBase is what snapshot() gave
  // for it.
  std::string fromSnapshot;
  uint32_t snapshotHostBase = 0;
  // With fromSnapshot, one taken with its memory (snapshotWithMemory): the
  // environment goes on from that moment, its processes running.
  bool withMemory = false;
};

std::string newEnvironmentId();

// A storage limit given in GiB (storageGb, fractional) in bytes.
inline uint64_t storageLimitBytes(double storageGb) { return static_cast<uint64_t>(storageGb * (1ull << 30)); }

// What an environment uses now, against its Spec's limits.
struct Usage {
  bool cpuKnown = false;  // false: this host cannot account CPU time per environment
  uint64_t cpuUsec = 0;   // CPU time since the environment began
  uint64_t memoryBytes = 0;
  uint64_t pids = 0;  // tasks: processes and threads
  uint64_t oomKills = 0;
  // The bytes its writable layer holds in the storage pool, as the host
  // counts them (its volume's qgroup; a microVM's: its disk's blocks).
  bool storageKnown = false;
  uint64_t storageBytes = 0;
  // Set by the manager (the egress link is moatd's): what it sent and
  // received over its network link.
  bool networkKnown = false;
  uint64_t networkSentBytes = 0;
  uint64_t networkReceivedBytes = 0;
};

// Fills usage's storage from the volume `id` in stateDir's storage pool,
// where each backend keeps an environment's writable layer; leaves it
// unknown when that cannot be read (no pool, no qgroup).
void countStorage(const std::string& stateDir, const std::string& id, Usage& usage);

// What changes() compares: the environment `id`'s files against its
// template's (`snapshot` empty) or against snapshot `snapshot` (one of the
// same template).
struct ChangesRequest {
  std::string id;
  std::string templateName;
  std::string snapshot;
  isolation::fs::LayerChangeLimits limits;
};
using Changes = isolation::fs::LayerChanges;

// Environments a backend runs outlive the moatd that made them (a restart
// re-attaches), until destroy(). Calls may come from any thread. A fork is
// a snapshot and a create from it; a restore, a destroy and a create of
// the same id from a snapshot.
class Backend {
 public:
  virtual ~Backend() = default;

  struct Created {
    std::string id;
    UniqueFd control;  // the guest protocol connection to moat-init
  };
  virtual Result<Created> create(const Spec& spec) = 0;
  // Ends every process and removes every trace of it (its files too).
  // Idempotent: a gone environment is fine.
  virtual Status destroy(const std::string& id) = 0;
  // A new guest protocol connection to a running environment (the old one
  // is dropped).
  virtual Result<UniqueFd> attach(const std::string& id) = 0;
  // The ids of the environments it runs.
  virtual Result<std::vector<std::string>> list() = 0;
  // Whether it runs environment `id` (by default: list() names it).
  virtual bool runs(const std::string& id);
  virtual Result<Usage> usage(const std::string& id) = 0;
  // Where the environment's network attaches: its network namespace.
  virtual Result<UniqueFd> networkNamespace(const std::string& id) = 0;
  // A TCP connection (non-blocking) to a server inside the environment on
  // `port` (docs/PORTS.md): by default to 127.0.0.1:port in its network
  // namespace. Error code "refused" when nothing listens, "timeout" when
  // no answer came within `timeout`.
  virtual Result<UniqueFd> connectPort(const std::string& id, uint16_t port, std::chrono::milliseconds timeout);
  // A read-only copy of the environment's writable layer at this moment,
  // kept as `name` (like a power cut: written data is in it, processes are
  // not); returns what a create from it needs (Spec::snapshotHostBase).
  virtual Result<uint32_t> snapshot(const std::string& id, const std::string& name) = 0;
  // The same with the environment's memory and state beside its files
  // (docs/PAUSE.md, "Forks with memory"): a create with Spec::withMemory
  // goes on from this moment, its processes running. The environment is
  // held still while it is taken, then goes on as it was. By default
  // "unsupported", naming why.
  virtual Result<uint32_t> snapshotWithMemory(const std::string& id, const std::string& name);
  // Idempotent: a gone snapshot is fine.
  virtual Status deleteSnapshot(const std::string& name) = 0;
  // The names of the snapshots it keeps.
  virtual Result<std::vector<std::string>> snapshots() = 0;
  // What differs in a running environment's files (read only, for a
  // person's review): never following what the environment planted.
  virtual Result<Changes> changes(const ChangesRequest& request) = 0;
  // A pause (docs/PAUSE.md): every process of the environment stops where it
  // is (moat-init goes on answering where the backend can keep it), until
  // resume(). Both idempotent; by default "unsupported".
  virtual Status pause(const std::string& id);
  virtual Status resume(const std::string& id);
  // A checkpoint to disk (docs/PAUSE.md, "To disk") of a paused environment
  // (its commands stopped): its memory and state saved beside its files,
  // then its memory released; its guest protocol connection closes. It
  // stays in list() (a restart finds it there, checkpointed()), and
  // attach() fails. Returns the bytes the checkpoint holds. By default
  // "unsupported", naming why.
  virtual Result<uint64_t> checkpoint(const std::string& id);
  // Brings a checkpointed environment back where it was (`spec`: its
  // create's) and hands back a new guest protocol connection, on which
  // moat-init's Hello comes next; its network namespace is a new one.
  virtual Result<UniqueFd> restoreCheckpoint(const Spec& spec);
  virtual bool checkpointed(const std::string& id) {
    (void)id;
    return false;
  }
  // Why an environment whose guest protocol connection closed by itself
  // ended, when the backend can tell more than "pid 1 exited" (a microVM's
  // kernel panic, its QEMU's crash); "" when it cannot. Called before its
  // destroy; may wait a moment for the end to be certain.
  virtual std::string whyEnded(const std::string& id) {
    (void)id;
    return "";
  }
};

}  // namespace moat::backend
