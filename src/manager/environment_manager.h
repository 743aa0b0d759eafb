#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "audit/event.h"
#include "backend/backend.h"
#include "common/clock.h"
#include "common/keyed_lock.h"
#include "common/result.h"
#include "common/scope_exit.h"
#include "egress/controller.h"
#include "gate/permissions.h"
#include "init/protocol.h"
#include "manager/capacity.h"
#include "manager/exec_output_budget.h"
#include "manager/init_connection.h"
#include "manager/live_table.h"
#include "manager/process_table.h"
#include "manager/services.h"
#include "manager/warm_pools.h"
#include "store/store.h"

namespace moat::manager {

using store::EnvironmentState;
using store::SnapshotState;
using store::stateName;

// A paused environment's expiry once its pause ends (pause.cc): as stored
// when its time ran on, else moved on by the pause's length (what was left
// is left again).
int64_t expiryAfterPause(const store::EnvironmentRecord& record, int64_t nowMs);
// What is refused (409) while an environment is checkpointed to disk.
std::string checkpointedWhy(const std::string& id);

// The lifecycle of moatd's environments: creating -> running -> destroying
// -> gone, or failed. Every transition is written to the store first. Expired
// environments are destroyed by a reaper thread, with the reason recorded.
// Lifecycle changes and every command's start and end go to the audit log
// (`audit`; none: not recorded).
//
// A thin facade over owners with a lock each (LiveTable, Capacity,
// WarmPools, ExecOutputBudget, KeyedLock); its own code is in one file per concern:
// environment_manager.cc (create, destroy, restart), commands.cc,
// permission_layers.cc, network_binding.cc, snapshots.cc, reaper.cc and
// warm_pool_refill.cc.
class EnvironmentManager final : public EnvironmentService,
                                 public CommandService,
                                 public PermissionService,
                                 public NetworkService,
                                 public SnapshotService {
 public:
  EnvironmentManager(ManagerConfig config, store::Store& store, backend::Backend& backend,
                     audit::Recorder* audit = nullptr);
  ~EnvironmentManager();

  // Re-attaches to the environments a previous moatd left running (the
  // backend still runs them); records whose environment is gone are marked
  // failed, and environments without a record are destroyed. Egress links
  // are reconciled with the store: links nobody's record names are removed,
  // and a recorded policy without its link gets a new one.
  Status recoverAfterRestart();
  // Stop without destroying: the environments keep running for the next moatd.
  void detach();
  // The start of a shutdown: stops the reaper and the pool, and drops every
  // control connection so that requests waiting on an environment end now.
  void interrupt();

  // The services (manager/services.h).
  Result<store::EnvironmentRecord> create(const CreateRequest& request) override;
  Result<store::EnvironmentRecord> get(const std::string& id) override;
  std::string ownerOf(const std::string& id) override;
  std::map<std::string, std::string> envOf(const std::string& id) override;
  Result<std::vector<store::EnvironmentRecord>> list(const store::EnvironmentFilter& filter) override;
  Result<store::EnvironmentRecord> setTtl(const std::string& id, int64_t ttlS) override;
  Result<store::EnvironmentRecord> pause(const std::string& id, const std::string& actor, bool toDisk = false) override;
  Result<store::EnvironmentRecord> resume(const std::string& id, const std::string& actor) override;
  Result<backend::Usage> usage(const std::string& id) override;
  Status destroy(const std::string& id, const std::string& reason, const std::string& actor = "moatd") override;
  Counters counters() override;
  const ManagerConfig& config() const override { return config_; }
  Result<ExecResult> exec(const std::string& id, const ExecRequest& request,
                          const std::map<std::string, std::string>& env) override;
  Result<std::shared_ptr<void>> reserveExecOutput(const std::string& caller, uint64_t outputLimit) override;
  Result<std::shared_ptr<Process>> startProcess(const std::string& id, const ProcessRequest& request) override;
  Result<std::vector<std::shared_ptr<Process>>> processes(const std::string& id) override;
  Result<std::shared_ptr<Process>> process(const std::string& id, uint64_t processId) override;
  Result<init::FileResult> file(const std::string& id, const init::FileRequest& request) override;
  Result<gate::Evaluation> evaluate(const std::string& id, const gate::Action& action,
                                    const gate::Permissions* ceiling) override;
  Result<std::vector<gate::Permissions>> permissions(const std::string& id) override;
  Status setPermissions(const std::string& id, const gate::Permissions& p, bool replace) override;
  Status rememberRule(const std::string& id, gate::Scope scope, const gate::Rule& rule, bool everyLayer) override;
  Result<egress::Policy> network(const std::string& id) override;
  Status setNetwork(const std::string& id, const egress::Policy& policy) override;
  Result<UniqueFd> connectToPort(const std::string& id, uint16_t port, std::chrono::milliseconds timeout) override;
  Result<store::SnapshotRecord> snapshot(const std::string& id, const std::string& name,
                                         const std::string& actor) override;
  Result<store::SnapshotRecord> snapshotOwnedBy(const std::string& id, const std::string& owner,
                                                const std::string& name, const std::string& actor) override;
  Result<store::SnapshotRecord> getSnapshot(const std::string& snapshotId) override {
    return usableSnapshot(snapshotId, "");
  }
  Result<std::vector<store::SnapshotRecord>> snapshots(const std::string& owner,
                                                       const std::string& environment) override;
  Status deleteSnapshot(const std::string& snapshotId, const std::string& actor) override;
  Result<std::vector<store::EnvironmentRecord>> fork(const std::string& id, const ForkRequest& request) override;
  Result<store::EnvironmentRecord> restore(const std::string& id, const std::string& snapshotId,
                                           const std::string& actor) override;
  Result<backend::Changes> changes(const std::string& id, const std::string& snapshotId,
                                   const isolation::fs::LayerChangeLimits& limits) override;

  // Egress (docs/EGRESS.md): without a controller, only mode "none" works.
  void setEgress(egress::Controller* egress) { egress_ = egress; }
  // Named templates (docs/TEMPLATES.md). Set before recoverAfterRestart.
  void setTemplates(TemplateHooks hooks) { templates_ = std::move(hooks); }
  void destroyAll(const std::string& reason);
  // Called (on the destroying thread) when an environment ends, with why:
  // what waits on it elsewhere (approvals) can end too. Set before serving.
  // Safe to change while environments end (moatd resets it at stop).
  void onEnded(std::function<void(const std::string& id, const std::string& reason)> hook) {
    std::lock_guard<std::mutex> lock(hooksMutex_);
    endedHook_ = std::move(hook);
  }
  // The exec gate (docs/GATE.md, "Every program"): `check` judges a
  // program an environment's process is about to run (on a connection's
  // reader thread: it must answer later when it waits for a person), and
  // `policy` says whether an environment's programs need judging at all
  // (init::ExecPolicy), given to moat-init at every connection and after
  // every change of its permissions. Set before serving.
  using ExecCheckHook =
      std::function<void(const std::string& id, const init::ExecCheck& check, InitConnection::ExecAnswer answer)>;
  using ExecPolicyHook = std::function<init::ExecPolicy(const std::string& id)>;
  using ExecReportHook = std::function<void(const std::string& id, const init::ExecReport& report)>;
  // `report` hears what moat-init judged by itself; reports that arrive
  // before it is set (from environments re-attached at start) are kept for
  // it (at most kEarlyReports).
  void setExecGate(ExecCheckHook check, ExecPolicyHook policy, ExecReportHook report);
  // Tells every running environment's moat-init whether to ask (after
  // setExecGate, for the environments re-attached before it).
  void refreshExecPolicies();
  audit::Recorder& audit() { return audit_; }

 private:
  LiveEnvironment makeLive(std::shared_ptr<InitConnection> connection, const store::EnvironmentRecord& record) const;
  // A memory fork's copy of one of its source's processes, in `live` (id's):
  // its end is recorded (as `actor`'s), as a process started here is.
  void adoptProcess(LiveEnvironment& live, const std::string& id, const std::string& actor,
                    const std::shared_ptr<Process>& process);
  // Puts a pause in force (`hold`) or lifts it: the backend freezes a
  // namespace environment's processes from the host; a microVM's moat-init
  // freezes its guest's (QEMU's stop would stop moat-init too, and nothing
  // could read the guest's files while paused).
  // Suspends `connection` (sends then fail saying `why`) behind a barrier
  // its moat-init answers once it has read all before it and, told to
  // quiesce (protocol 7), says nothing more of its own accord (a
  // checkpoint's, a memory fork's save). A failure ends the suspension.
  static Status suspendQuiet(const std::shared_ptr<InitConnection>& connection, const std::string& why);
  // A guest's moat-init quiesced for a save that did not happen, or whose
  // guest goes on paused, speaks again (file op 13's end; an older one's
  // quiet ends with its resume).
  void endGuestQuiet(const std::string& id, const std::shared_ptr<InitConnection>& connection);
  // A guest saved and restored (a checkpoint, a memory fork) is told the
  // time, given entropy and reseeded, and named `hostname` unless empty
  // (file op clock).
  Status setGuestClock(const std::string& id, const std::shared_ptr<InitConnection>& connection,
                       const std::string& hostname = "");
  Status holdProcesses(const store::EnvironmentRecord& record, const std::shared_ptr<InitConnection>& connection,
                       bool hold);
  // pause(), by a person or program (`atExpiry` false), or by the reaper
  // when its time to live ran out and its create asked for a pause: then
  // its stored expiry becomes the pause's moment plus its time to live, so
  // that a resume gives it that time again.
  Result<store::EnvironmentRecord> pauseHeld(const std::string& id, const std::string& actor, bool atExpiry,
                                             bool toDisk = false);
  // A paused environment's memory saved to disk and released (the backend's
  // checkpoint; its connection suspended meanwhile), and brought back
  // (docs/PAUSE.md, "To disk"). Under exclusive(id).
  Status checkpointHeld(const store::EnvironmentRecord& record, const LiveEnvironment& live, const std::string& actor,
                        const std::string& reason = "");
  // Its guest back in RAM from its checkpoint, recorded as `after` (in RAM
  // for good, by a resume; or until no file read came for a while).
  Status restoreCheckpointHeld(const store::EnvironmentRecord& record, const LiveEnvironment& live,
                               store::PausedMemory after = store::PausedMemory::kRam);
  // A file read of a paused microVM (docs/PAUSE.md, "To disk"): one whose
  // memory is on disk is brought back into RAM, still paused, until no
  // read came for config_.backToDiskAfterMs; each read puts that off.
  Result<init::FileResult> readPausedGuest(const std::string& id, const LiveEnvironment& live,
                                           const init::FileRequest& request);
  // Under exclusive(id): its checkpoint back in RAM for reads (nothing
  // where it is in RAM already), and the return to disk put off.
  Status backForReadsHeld(const store::EnvironmentRecord& record, const LiveEnvironment& live);
  // One in RAM for reads (just loaded, or read again): its return to disk
  // put off to config_.backToDiskAfterMs from now.
  void putOffBackToDisk(const std::string& id);
  // The reaper's: the return to disk that no read put off.
  void backToDisk(const std::string& id);
  // Runs `work` on a thread of its own, one per environment at a time (a
  // pause at expiry, a return to disk: either may wait on the guest), which
  // a stop waits for; false: one runs for `id` already, or moatd stops.
  bool aside(const std::string& id, std::function<void()> work);
  // The reaper's end of a time to live: a destroy (reason "expired"), or a
  // pause where the create asked for one (docs/PAUSE.md, "At expiry"), on
  // a thread of its own (a pause may wait on the environment: a microVM's
  // moat-init answers it), one per environment at a time.
  void expire(const std::string& id);
  // That pause; one that fails destroys the environment, saying why,
  // unless it is no longer due or running by then.
  void pauseAtExpiry(const std::string& id);
  // Gives a running environment its egress link and the files and variables
  // that go with it (resolver, CA bundle, proxy variables).
  Status connectNetwork(const std::string& id, const egress::Policy& policy,
                        const std::vector<egress::Secret>& secrets);
  // connectNetwork for a create, under networkMutex_, unless a policy was
  // set meanwhile.
  Status connectNetworkUnlessSet(const std::string& id, const egress::Policy& policy,
                                 const std::vector<egress::Secret>& secrets);
  Status writeNetworkFiles(const std::shared_ptr<InitConnection>& connection, const egress::EgressNetwork::Link& link);
  // After a restart: snapshots a killed moatd left half made, half deleted
  // or made for a fork are rolled back, and snapshot volumes without a
  // record are removed.
  void recoverSnapshots();
  // restore() up to its network: the environment runs on the snapshot's files.
  Result<store::EnvironmentRecord> restoreFiles(const std::string& id, const std::string& snapshotId,
                                                const std::string& actor);
  // transient: for a fork (not counted, never listed, not an event; state
  // "transient", so a moatd killed before the fork removed it rolls it back).
  // A ready snapshot, or the transient one taken for a fork of `forkOf`.
  Result<store::SnapshotRecord> usableSnapshot(const std::string& snapshotId, const std::string& forkOf);
  // owner "": the environment's. `memory` (a memory fork's): with its
  // memory (Backend::snapshotWithMemory), and its running processes' copies
  // of that moment put there.
  Result<store::SnapshotRecord> takeSnapshot(const std::string& id, const std::string& name, const std::string& actor,
                                             bool transient, const std::string& owner = "",
                                             std::vector<std::shared_ptr<Process>>* memory = nullptr);
  // changes() of a microVM: its guest lists them (FileOp kChanges).
  Result<backend::Changes> guestChanges(const store::EnvironmentRecord& record, const LiveEnvironment& live,
                                        const std::string& snapshotId, const isolation::fs::LayerChangeLimits& limits);
  // takeSnapshot's backend part with memory (snapshots.cc).
  Result<uint32_t> snapshotWithMemory(const store::EnvironmentRecord& record, const LiveEnvironment& live,
                                      const std::string& snapshotId, std::vector<std::shared_ptr<Process>>& processes);
  // Held by a create or restore from the snapshot until its copy is made:
  // a deletion waits for the holds, and a hold for a deletion in progress
  // (which then leaves the snapshot not found). No-op for "".
  ScopeExit<std::function<void()>> holdSnapshot(const std::string& snapshotId);
  // One destroy, snapshot or restore of an environment at a time: waits for
  // the one in progress, then holds the environment until the handle goes.
  ScopeExit<std::function<void()>> exclusive(const std::string& id);
  // After a restart, for a re-attached environment whose link the store and
  // the egress namespace disagree on: puts its stored policy in force again.
  Status restoreNetwork(const std::string& id, const std::string& why);
  // Writes an environment's permission layers to the store, then swaps them
  // in (permissionsMutex_ held by the caller).
  Status storeLayers(const std::string& id, std::vector<gate::Permissions> layers);
  // A copy of the environment's live handles, or why there are none.
  Result<LiveEnvironment> liveOf(const std::string& id);
  // liveOf, for what a pause stops (commands, file writes): "conflict",
  // naming the pause, while it is paused. `what`: "run commands", ...
  Result<LiveEnvironment> unpausedLiveOf(const std::string& id, const char* what);
  // Its network is gone: its commands no longer get the proxy variables.
  void dropNetworkVariables(const std::string& id);
  void reaperLoop();
  void stopThreads();  // idempotent
  // stopThreads in two: no new work from here on (stopping_), then the
  // threads joined and the work aside() (pauses at expiry, returns to disk)
  // waited for.
  void markStopping();
  void joinThreads();
  void onInitGone(const std::string& id);
  // Fills every warm pool up to its size; returns when all are full, at
  // capacity, or backing off.
  void refillPool();
  void warmUp(const std::shared_ptr<InitConnection>& connection, const std::string& id);
  void poolLoop();
  // What a microVM create is refused for, before anything is stored or booted.
  Status microVmCreatable(const store::EnvironmentRecord& record) const;
  backend::Spec specFor(const std::string& templateName, double cpus, uint64_t ramMb, double storageGb, uint64_t pids,
                        backend::Isolation isolation = backend::Isolation::kNamespaces) const;
  backend::Spec poolSpec(size_t pool) const;
  // The warm pool whose template and spec a create asks for exactly.
  std::optional<size_t> poolFor(const store::EnvironmentRecord& record) const;

  ManagerConfig config_;  // its memory limit and warm pools resolved (see the constructor)
  Capacity capacity_{config_.maxEnvironments, config_.maxTotalMemoryMb};
  WarmPools pools_{config_.warmPools};
  store::Store& store_;
  backend::Backend& backend_;
  audit::Recorder& audit_;
  egress::Controller* egress_ = nullptr;
  TemplateHooks templates_;
  std::mutex networkMutex_;  // serializes network changes (and restores, which redo the network); before exclusive()
  LiveTable live_;
  // What the reaper and the pool threads wake up for: stopping_, detached_,
  // initGone_, lossless_.
  std::mutex threadsMutex_;
  std::vector<std::string> initGone_;
  std::atomic<uint64_t> execs_{0};
  // Environments being destroyed, snapshotted or restored, held
  // exclusively: a second such operation on the same one waits; operations
  // on different environments overlap (in the backend).
  KeyedLock operations_;
  // What a pause must not miss: commands and file changes on their way to
  // moat-init hold it shared from the pause check until moat-init has them
  // (a process it starts after the freezer's last look would run on); a
  // pause holds it exclusively once new ones are refused (pause.cc).
  KeyedLock starts_;
  // Snapshots being copied from (shared, by a create or restore) or deleted
  // (exclusive).
  KeyedLock snapshotUse_;
  ExecOutputBudget execOutput_{config_.execOutputPerCaller};
  std::mutex permissionsMutex_;  // serializes read-modify-write of permission layers
  std::function<void(const std::string&, const std::string&)> endedHook_;  // under hooksMutex_
  // Calls endedHook_ (a copy, outside the lock: it may take long).
  void ended(const std::string& id, const std::string& reason);
  std::mutex hooksMutex_;  // the exec gate's hooks and the reports kept for them
  ExecCheckHook execCheck_;
  ExecPolicyHook execPolicy_;
  ExecReportHook execReport_;
  static constexpr size_t kEarlyReports = 4096;
  std::vector<std::pair<std::string, init::ExecReport>> earlyReports_;
  // A new connection to `id`'s moat-init: its exec checks go to the gate,
  // and it is told whether to ask.
  // `suspendedWhy`: see InitConnection's constructor.
  // `adopted`: a memory fork's processes (its LiveEnvironment's too).
  std::shared_ptr<InitConnection> connect(const std::string& id, UniqueFd control, const std::string& suspendedWhy = "",
                                          const std::vector<std::shared_ptr<Process>>& adopted = {});
  void sendExecPolicy(const std::string& id, const std::shared_ptr<InitConnection>& connection);
  bool stopping_ = false;
  bool detached_ = false;
  // Work under way aside() (a pause at expiry, a return to disk), by
  // environment, and how many threads run it; asideCv_ says when one ends.
  std::set<std::string> asideIds_;
  int asideWorkers_ = 0;
  std::condition_variable asideCv_;
  // Checkpoints back in RAM for reads, and when each goes back to disk;
  // loads for reads that failed (when, why), not tried again for a while.
  std::map<std::string, int64_t> backToDiskAt_;
  std::map<std::string, std::pair<int64_t, std::string>> loadFailed_;
  static constexpr int64_t kLoadRetryMs = 30000;
  // Loads for reads and saves back to disk under way at once, host-wide
  // (each a QEMU reading or writing a guest's whole memory): at most one
  // per host CPU, so that reads cannot set off more.
  std::counting_semaphore<256> checkpointMoves_{
      std::clamp<ptrdiff_t>(static_cast<ptrdiff_t>(std::thread::hardware_concurrency()), 1, 256)};
  struct MovesHeld {
    explicit MovesHeld(std::counting_semaphore<256>& s) : s_(s) { s_.acquire(); }
    ~MovesHeld() { s_.release(); }
    MovesHeld(const MovesHeld&) = delete;
    MovesHeld& operator=(const MovesHeld&) = delete;
    std::counting_semaphore<256>& s_;
  };
  std::vector<std::weak_ptr<Process>> lossless_;  // watched by the reaper (releaseIfUnfollowed)
  std::condition_variable reaperCv_;
  std::thread reaper_;
  std::condition_variable poolCv_;
  std::thread pooler_;
};

}  // namespace moat::manager
