#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/result.h"
#include "common/unique_fd.h"
#include "egress/policy.h"
#include "egress/secrets.h"
#include "gate/permissions.h"
#include "init/protocol.h"
#include "manager/process.h"
#include "manager/process_table.h"
#include "manager/warm_pools.h"
#include "store/store.h"

// What the API (and whatever else drives environments) asks of the
// manager: the requests and answers, and one narrow interface per resource.
// EnvironmentManager serves them all; a caller holds only the ones it uses.
namespace moat::manager {

struct ManagerConfig {
  std::string stateDir;
  int64_t defaultTtlS = 3600;
  int64_t maxTtlS = 7 * 24 * 3600;
  size_t maxEnvironments = 256;
  uint64_t maxTotalMemoryMb = 0;  // 0: the host's memory
  double defaultCpus = 1;
  uint64_t defaultRamMb = 1024;
  double defaultStorageGb = 4;
  uint64_t defaultPids = 1024;
  // What a create that names none gets (moatd --isolation), and the
  // accelerator microVMs run on ("kvm" or "tcg"; recorded with each).
  backend::Isolation defaultIsolation = backend::Isolation::kNamespaces;
  std::string microvmAccel = "auto";  // moatd's start puts "kvm" or "tcg" here (accel.h)
  std::string microvmMissing;         // not empty: why this host runs no microVMs
  // Environments kept ready per (template, spec), so that a create asking
  // for exactly that becomes a claim (moatd --warm-pool).
  std::vector<WarmPool> warmPools;
  ProcessLimits processLimits;
  // What one caller's (a key's, or the master token's) blocking execs in
  // flight may hold of output at once: each reserves twice its output
  // limit (two streams) while it runs; an exec beyond is refused with
  // `capacity`. Bounds what a flood of execs makes moatd hold, and keeps a
  // flooding key's execs from using up another's.
  uint64_t execOutputPerCaller = 256u << 20;
  // Snapshots one owner (a key, or the master token) may keep at once.
  size_t maxSnapshotsPerOwner = 64;
  // A microVM checkpointed to disk that a file read brought back into RAM
  // goes back to disk once no read came for this long (moatd
  // --back-to-disk-after; docs/PAUSE.md, "To disk").
  int64_t backToDiskAfterMs = 60000;
  // What an environment created without "permissions" gets (docs/GATE.md).
  gate::Permissions defaultPermissions = gate::Permissions::defaults();
};

// What a named template gives the environments made from it
// (docs/TEMPLATES.md): variables under the creator's own, the commands'
// default directory and user.
struct TemplateDefaults {
  std::map<std::string, std::string> env;
  std::string cwd;  // empty: /workspace
  uint32_t uid = 0;
  uint32_t gid = 0;
  // A built template: environments are forks of this snapshot (owned by
  // snapshotOwner, whoever creates them), on its base's files and defaults.
  std::string snapshot;
  std::string snapshotOwner;
};

// The template catalog as the manager sees it (moatd sets it; without it,
// only "host" and directories exist).
struct TemplateHooks {
  // An error when the template cannot be used now (unknown, importing, failed).
  std::function<Result<TemplateDefaults>(const std::string& name)> defaults;
  // Keeps the template from being deleted while the hold lives.
  std::function<std::shared_ptr<void>(const std::string& name)> hold;
};

struct CreateRequest {
  std::string taskId;
  std::string templateName = "host";
  double cpus = 0;  // 0: the default
  uint64_t ramMb = 0;
  double storageGb = 0;
  uint64_t pids = 0;
  std::optional<backend::Isolation> isolation;  // none: the default
  int64_t ttlS = 0;                             // 0: the default
  bool ttlRunsWhilePaused = false;              // its time to live goes on while paused (default: it stops)
  store::ExpiryAction onExpiry = store::ExpiryAction::kDestroy;  // what its time to live does when it runs out
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> env;  // added to every command's environment
  std::string owner = "master";
  std::optional<gate::Permissions> permissions;  // none: the server's defaults
  // Layers over it (a fork's: its source's tightenings), stored with it in
  // one write, so no moment or kill finds the environment without them.
  std::vector<gate::Permissions> furtherLayers;
  egress::Policy network;               // mode none: loopback only
  std::vector<egress::Secret> secrets;  // their placeholders go into `env`
  // Not empty: a fork. The writable layer starts as this snapshot (its
  // template is the environment's; the storage limit defaults to its).
  std::string fromSnapshot;
  std::string forkedFrom;  // a fork of this environment (for the audit log)
  // A memory fork's (ForkRequest::memory): fromSnapshot holds its source's
  // memory too, and these are the source's processes at that moment
  // (copied again for this environment, which runs them on).
  bool withMemory = false;
  std::vector<std::shared_ptr<Process>> processes;
  // Not empty: fromSnapshot must belong to this owner (a built template's
  // snapshot, which the caller resolved from the template's name), whoever
  // the environment's owner is.
  std::string snapshotOwner;
};

// A fork: a new environment with a copy of a running one's files and all
// its settings (spec, template, variables, permission layers, network
// policy, secrets); these may differ.
struct ForkRequest {
  std::optional<std::string> taskId;
  std::optional<std::map<std::string, std::string>> labels;
  int64_t ttlS = 0;  // 0: the default
  std::string owner = "master";
  // Its processes too, running on where they were (docs/PAUSE.md, "Forks
  // with memory"): a microVM's.
  bool memory = false;
  size_t count = 1;  // copies from one moment (all made, or none)
};
inline constexpr size_t kMaxForkCount = 16;

// A command started in the background (or a shell): it runs on while
// clients attach, detach and read its output from an offset.
struct ProcessRequest {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // added to the environment's set
  std::string cwd;                         // empty: the template's WorkingDir, else /workspace
  bool stdinOpen = true;                   // false: stdin is /dev/null
  bool pty = false;
  uint16_t rows = 24;
  uint16_t cols = 80;
  uint64_t timeoutMs = 0;
  bool lossless = false;  // output waits for its followers (Process::makeLossless)
  std::string kind = "process";
  std::string actor = "master";  // who asked: for the audit log
};

struct ExecRequest {
  std::vector<std::string> argv;
  std::string cwd;  // empty: the template's WorkingDir, else /workspace
  std::string stdinData;
  bool withStdin = false;
  nlohmann::json stdinEvent;  // what exec.started says of stdinData (size, hash, short text)
  uint64_t timeoutMs = 0;
  uint64_t outputLimit = 0;      // bytes kept per stream; 0: 16 MiB
  std::string actor = "master";  // who asked: for the audit log
};

struct ExecResult {
  bool started = false;  // false: spawnErrno/spawnStage say why
  int spawnErrno = 0;
  std::string spawnStage;
  int exitCode = -1;
  int signal = 0;
  bool timedOut = false;
  std::string out;
  std::string err;
  bool outTruncated = false;
  bool errTruncated = false;
  uint64_t durationUs = 0;
};

struct Counters {
  std::map<std::string, uint64_t> byState;
  uint64_t execs = 0;
  uint64_t warmReady = 0;
  uint64_t warmClaims = 0;
  // Per warm pool (template and spec resolved): ready now, claims so far.
  using Pool = PoolCount;
  std::vector<Pool> warmPools;
};

// Environments: made, found, listed, given more time, destroyed.
class EnvironmentService {
 public:
  virtual ~EnvironmentService() = default;
  virtual Result<store::EnvironmentRecord> create(const CreateRequest& request) = 0;
  virtual Result<store::EnvironmentRecord> get(const std::string& id) = 0;
  // Who created the environment ("master" or a key id); from memory while it
  // runs (no store read on every keyed request), else from the store; empty
  // when there is no such environment.
  virtual std::string ownerOf(const std::string& id) = 0;
  virtual Result<std::vector<store::EnvironmentRecord>> list(const store::EnvironmentFilter& filter) = 0;
  virtual Result<store::EnvironmentRecord> setTtl(const std::string& id, int64_t ttlS) = 0;
  // Stops every process of a running environment where it is (its pid 1
  // goes on answering file reads) / lets them go on (docs/PAUSE.md). Both
  // idempotent: a paused one's pause (a running one's resume) is its record.
  // `toDisk`: its memory is then saved to disk and released (a checkpoint;
  // a paused one's pause with it goes on to that; docs/PAUSE.md, "To disk").
  virtual Result<store::EnvironmentRecord> pause(const std::string& id, const std::string& actor,
                                                 bool toDisk = false) = 0;
  virtual Result<store::EnvironmentRecord> resume(const std::string& id, const std::string& actor) = 0;
  // What a running environment uses now (conflict when it does not run).
  virtual Result<backend::Usage> usage(const std::string& id) = 0;
  // Idempotent: destroying a gone environment is fine. `actor`: who asked
  // ("moatd" for expiry, failure and shutdown).
  virtual Status destroy(const std::string& id, const std::string& reason, const std::string& actor = "moatd") = 0;
  virtual Counters counters() = 0;
  virtual const ManagerConfig& config() const = 0;
};

// Commands in an environment: blocking execs, background processes, files.
class CommandService {
 public:
  virtual ~CommandService() = default;
  // The variables the environment adds to every command (empty when it does
  // not run).
  virtual std::map<std::string, std::string> envOf(const std::string& id) = 0;
  // The command's environment is the environment's base set plus `env`.
  // Runs a command to its end: a process like the others (it shows in the
  // list while it runs) whose whole output comes back at once.
  virtual Result<ExecResult> exec(const std::string& id, const ExecRequest& request,
                                  const std::map<std::string, std::string>& env) = 0;
  // Before an exec: counts twice its output limit (0: the maximum) against
  // what `caller` may hold in flight (ManagerConfig::execOutputPerCaller),
  // until the returned handle is released; `capacity` when it would not fit.
  virtual Result<std::shared_ptr<void>> reserveExecOutput(const std::string& caller, uint64_t outputLimit) = 0;
  // Background processes: started, listed, found by id (docs/API.md).
  virtual Result<std::shared_ptr<Process>> startProcess(const std::string& id, const ProcessRequest& request) = 0;
  virtual Result<std::vector<std::shared_ptr<Process>>> processes(const std::string& id) = 0;
  virtual Result<std::shared_ptr<Process>> process(const std::string& id, uint64_t processId) = 0;
  virtual Result<init::FileResult> file(const std::string& id, const init::FileRequest& request) = 0;
};

// The gate's view of an environment: its permission layers (docs/GATE.md).
class PermissionService {
 public:
  virtual ~PermissionService() = default;
  // The gate: what the environment's permission layers (and the caller's
  // ceiling) say about an action.
  virtual Result<gate::Evaluation> evaluate(const std::string& id, const gate::Action& action,
                                            const gate::Permissions* ceiling) = 0;
  virtual Result<std::vector<gate::Permissions>> permissions(const std::string& id) = 0;
  // replace: the layers become [p] (loosening is possible: the API lets only
  // the master or a "permissions" key do it); otherwise p is added as a
  // further layer, which can only tighten.
  virtual Status setPermissions(const std::string& id, const gate::Permissions& p, bool replace) = 0;
  // Puts a rule first in the environment's first layer, or in every layer
  // ("remember": an allow must hold in each layer; a key's ceiling still applies).
  virtual Status rememberRule(const std::string& id, gate::Scope scope, const gate::Rule& rule, bool everyLayer) = 0;
};

// An environment's network policy (docs/EGRESS.md).
class NetworkService {
 public:
  virtual ~NetworkService() = default;
  // The policy as stored (mode "none" when there is none).
  virtual Result<egress::Policy> network(const std::string& id) = 0;
  // Changes the policy of a running environment: plugs its link in or out
  // as the mode requires; open connections finish as they were.
  virtual Status setNetwork(const std::string& id, const egress::Policy& policy) = 0;
  // A connection (non-blocking) to a server on `port` inside a running
  // environment (docs/PORTS.md); "conflict" when it is not running,
  // "refused" when nothing listens, "timeout" when nothing answers in time.
  virtual Result<UniqueFd> connectToPort(const std::string& id, uint16_t port, std::chrono::milliseconds timeout) = 0;
};

// Snapshots, forks and restores (docs/API.md, "Snapshots").
class SnapshotService {
 public:
  virtual ~SnapshotService() = default;
  // Snapshots (docs/API.md, "Snapshots"): the writable layer's files at one
  // point in time (like a power cut: written data is in, processes are not).
  virtual Result<store::SnapshotRecord> snapshot(const std::string& id, const std::string& name,
                                                 const std::string& actor) = 0;
  // A snapshot that belongs to `owner`, not to the environment's owner (a
  // built template's: templates::snapshotOwner); counted against `owner`'s.
  virtual Result<store::SnapshotRecord> snapshotOwnedBy(const std::string& id, const std::string& owner,
                                                        const std::string& name, const std::string& actor) = 0;
  virtual Result<store::SnapshotRecord> getSnapshot(const std::string& snapshotId) = 0;
  virtual Result<std::vector<store::SnapshotRecord>> snapshots(const std::string& owner,
                                                               const std::string& environment) = 0;
  virtual Status deleteSnapshot(const std::string& snapshotId, const std::string& actor) = 0;
  virtual Result<std::vector<store::EnvironmentRecord>> fork(const std::string& id, const ForkRequest& request) = 0;
  // Puts the environment's files back as the snapshot has them: every
  // process ends (the environment restarts on the snapshot, same id, same
  // settings, network and permissions).
  virtual Result<store::EnvironmentRecord> restore(const std::string& id, const std::string& snapshotId,
                                                   const std::string& actor) = 0;
  // What differs in a running environment's files from its template's
  // (snapshotId empty) or from a snapshot's of the same template.
  virtual Result<backend::Changes> changes(const std::string& id, const std::string& snapshotId,
                                           const isolation::fs::LayerChangeLimits& limits) = 0;
};

}  // namespace moat::manager
