#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/enum_names.h"
#include "common/result.h"

// moatd's persistent state: environments, API keys and the audit log;
// approvals later. SQLite by default (one file in the state directory),
// PostgreSQL in cluster mode later, behind this one interface.
namespace moat::store {

// An environment's life: creating -> running (<-> paused) -> destroying ->
// gone, or failed from any of them. Stored, listed and shown by name.
enum class EnvironmentState : uint8_t { kCreating, kRunning, kPaused, kDestroying, kGone, kFailed };

inline constexpr EnumName<EnvironmentState> kEnvironmentStates[] = {
    {EnvironmentState::kCreating, "creating"}, {EnvironmentState::kRunning, "running"},
    {EnvironmentState::kPaused, "paused"},     {EnvironmentState::kDestroying, "destroying"},
    {EnvironmentState::kGone, "gone"},         {EnvironmentState::kFailed, "failed"},
};
static_assert(std::size(kEnvironmentStates) == static_cast<size_t>(EnvironmentState::kFailed) + 1);
constexpr const char* stateName(EnvironmentState state) { return nameIn(kEnvironmentStates, state, "failed"); }
constexpr std::optional<EnvironmentState> environmentStateNamed(std::string_view name) {
  return valueNamed(kEnvironmentStates, name);
}

// A snapshot's: creating (being taken), ready (kept and listed), transient
// (a fork's, used by the fork's create and then removed), deleting (being
// removed). A moatd that starts finds only ready ones: it rolls back the rest.
enum class SnapshotState : uint8_t { kCreating, kReady, kTransient, kDeleting };

inline constexpr EnumName<SnapshotState> kSnapshotStates[] = {
    {SnapshotState::kCreating, "creating"},
    {SnapshotState::kReady, "ready"},
    {SnapshotState::kTransient, "transient"},
    {SnapshotState::kDeleting, "deleting"},
};
static_assert(std::size(kSnapshotStates) == static_cast<size_t>(SnapshotState::kDeleting) + 1);
constexpr const char* stateName(SnapshotState state) { return nameIn(kSnapshotStates, state, "creating"); }
constexpr std::optional<SnapshotState> snapshotStateNamed(std::string_view name) {
  return valueNamed(kSnapshotStates, name);
}

// What an environment's time to live does when it runs out (docs/PAUSE.md,
// "At expiry"): destroy it (the default), pause it, or pause it with its
// memory on disk (a checkpoint: microVMs).
enum class ExpiryAction : uint8_t { kDestroy, kPause, kCheckpoint };

// Where a paused environment's memory is (docs/PAUSE.md, "To disk"): in
// RAM, on disk (a checkpoint), or in RAM because a file read brought its
// checkpoint back, until no read came for a while.
enum class PausedMemory : uint8_t { kRam, kDisk, kRamUntilIdle };
inline constexpr EnumName<ExpiryAction> kExpiryActions[] = {
    {ExpiryAction::kDestroy, "destroy"},
    {ExpiryAction::kPause, "pause"},
    {ExpiryAction::kCheckpoint, "checkpoint"},
};
static_assert(std::size(kExpiryActions) == static_cast<size_t>(ExpiryAction::kCheckpoint) + 1);
// Whether it is a pause of either kind.
constexpr bool pausesAtExpiry(ExpiryAction action) {
  return action == ExpiryAction::kPause || action == ExpiryAction::kCheckpoint;
}
constexpr const char* actionName(ExpiryAction action) { return nameIn(kExpiryActions, action, "destroy"); }
constexpr std::optional<ExpiryAction> expiryActionNamed(std::string_view name) {
  return valueNamed(kExpiryActions, name);
}

// An approval's: pending (a person has yet to decide), approved, denied,
// or expired (nobody decided in time, or moatd stopped meanwhile).
enum class ApprovalState : uint8_t { kPending, kApproved, kDenied, kExpired };

inline constexpr EnumName<ApprovalState> kApprovalStates[] = {
    {ApprovalState::kPending, "pending"},
    {ApprovalState::kApproved, "approved"},
    {ApprovalState::kDenied, "denied"},
    {ApprovalState::kExpired, "expired"},
};
static_assert(std::size(kApprovalStates) == static_cast<size_t>(ApprovalState::kExpired) + 1);
constexpr const char* stateName(ApprovalState state) { return nameIn(kApprovalStates, state, "expired"); }
constexpr std::optional<ApprovalState> approvalStateNamed(std::string_view name) {
  return valueNamed(kApprovalStates, name);
}

// A template's (templates/): importing or building until its root file
// system is in place, then ready; failed keeps the error until it is
// deleted. A moatd that starts fails those it finds importing or building.
enum class TemplateState : uint8_t { kImporting, kBuilding, kReady, kFailed };
inline constexpr EnumName<TemplateState> kTemplateStates[] = {
    {TemplateState::kImporting, "importing"},
    {TemplateState::kBuilding, "building"},
    {TemplateState::kReady, "ready"},
    {TemplateState::kFailed, "failed"},
};
static_assert(std::size(kTemplateStates) == static_cast<size_t>(TemplateState::kFailed) + 1);
constexpr const char* stateName(TemplateState state) { return nameIn(kTemplateStates, state, "failed"); }
constexpr std::optional<TemplateState> templateStateNamed(std::string_view name) {
  return valueNamed(kTemplateStates, name);
}

struct EnvironmentRecord {
  std::string id;      // 12 hex digits
  std::string taskId;  // caller's label for the task; may be empty
  std::string templateName;
  double cpus = 0;
  uint64_t ramMb = 0;
  double storageGb = 0;
  uint64_t pids = 0;
  std::map<std::string, std::string> labels;
  EnvironmentState state = EnvironmentState::kCreating;
  std::string reason;       // why it is gone or failed ("destroyed", "expired", ...)
  int64_t createdAtMs = 0;  // unix time, milliseconds
  int64_t expiresAtMs = 0;
  std::string owner;                       // who created it: "master" or an API key id
  std::map<std::string, std::string> env;  // variables every command gets
  std::string permissions;                 // JSON array of permission layers (gate/); "" = the defaults
  std::string network;                     // egress policy JSON (egress/policy.h); "" = none
  std::string secrets;                     // egress secrets as stored (egress/secrets.h); "" = none
  int64_t netSlot = -1;                    // the egress link's slot; -1: no link
  std::string isolation = "namespaces";    // "namespaces" or "microvm" (backend::Isolation)
  std::string accel;                       // a microVM's accelerator: "kvm" or "tcg" (moatd's); "" otherwise
  int64_t pausedAtMs = 0;                  // unix time of the pause that holds it; 0: none
  bool ttlRunsWhilePaused = false;         // its time to live goes on while paused (default: it stops)
  ExpiryAction onExpiry = ExpiryAction::kDestroy;
  bool pausedToDisk = false;  // paused, its memory on disk (a checkpoint); else in RAM
  // Paused in RAM because a file read brought its checkpoint back: it goes
  // back to disk when no read came for a while (docs/PAUSE.md, "To disk").
  bool backToDisk = false;
  int64_t ttlS = 0;  // the time to live given last (by the create or a timeout); 0: not recorded (older records)
};

// A scoped API key. The token itself is never stored: only its SHA-256.
struct ApiKeyRecord {
  std::string id;  // 12 hex digits, also in the token
  std::string name;
  std::string tokenHash;            // hex SHA-256 of the whole token
  std::vector<std::string> scopes;  // create, read, exec, files, destroy, timeout
  int64_t createdAtMs = 0;
  int64_t revokedAtMs = 0;  // 0: active
  std::string permissions;  // JSON ceiling for its environments; "" = none
};

// A pending or decided request for a person's approval (the gate's "ask").
struct ApprovalRecord {
  std::string id;  // 12 hex digits
  std::string environment;
  std::string scope;      // read_file, write_file, run_command, network
  std::string action;     // JSON
  std::string requester;  // "master" or an API key id
  int64_t createdAtMs = 0;
  ApprovalState state = ApprovalState::kPending;
  std::string decidedBy;
  std::string reason;
  int64_t decidedAtMs = 0;
  bool remember = false;
  bool used = false;
};

struct ApprovalFilter {
  std::optional<ApprovalState> state;     // none: any
  std::string environment;                // empty: any
  std::vector<std::string> environments;  // non-empty: only these (a key's own)
};

// One audit event as stored. src/audit/ says what the fields mean and how
// the hashes chain; to the store they are opaque. `data` is JSON text.
struct EventRecord {
  uint64_t id = 0;  // 1, 2, ... in append order
  int64_t timeMs = 0;
  std::string type;
  std::string environment;
  std::string actor;
  std::string data;
  std::string prevHash;
  std::string hash;
};

struct EventQuery {
  uint64_t afterId = 0;     // events with a greater id
  std::string environment;  // empty: any
  std::string typePrefix;   // empty: any type
  std::string owner;        // set: only events of the environments this owner created
  size_t limit = 1000;
};

// A snapshot of an environment's writable layer (files, not processes).
struct SnapshotRecord {
  std::string id;                        // "s" + 12 hex digits
  std::string environment;               // what it was taken of
  std::string owner;                     // the environment's owner: "master" or an API key id
  std::string templateName;              // the lower layer it sits on
  double storageGb = 0;                  // the environment's storage limit
  uint32_t hostBase = 0;                 // host uid of root inside when it was taken
  std::string isolation = "namespaces";  // of the environment it was taken of: what a create from it is
  std::string name;                      // the caller's label; may be empty
  SnapshotState state = SnapshotState::kCreating;
  int64_t createdAtMs = 0;
};

// A named template: a root file system moatd keeps under its state
// directory (made from an OCI image or a recipe).
struct TemplateRecord {
  std::string name;
  std::string source;  // as given: "docker-archive:/x.tar", "docker://...", "build:<base>"
  TemplateState state = TemplateState::kImporting;
  std::string errorCode;  // failed: why
  std::string errorMessage;
  std::string config;  // JSON text (templates/): the image's defaults; opaque here
  uint64_t sizeBytes = 0;
  std::string owner;  // who made it: "master" or an API key id
  int64_t createdAtMs = 0;
};

struct EnvironmentFilter {
  std::string taskId;                         // empty: any
  std::optional<EnvironmentState> state;      // none: any state but gone
  std::map<std::string, std::string> labels;  // all must match
  std::string owner;                          // empty: any
};

class Store {
 public:
  virtual ~Store() = default;
  // Inserts a new record; an existing id is an error (code "conflict").
  virtual Status insertEnvironment(const EnvironmentRecord& record) = 0;
  virtual Result<std::optional<EnvironmentRecord>> getEnvironment(const std::string& id) = 0;
  // Newest first.
  virtual Result<std::vector<EnvironmentRecord>> listEnvironments(const EnvironmentFilter& filter) = 0;
  // Error code "not_found" for an unknown id.
  virtual Status setState(const std::string& id, EnvironmentState state, const std::string& reason) = 0;
  // The expiry, and the time to live it came from (ttlS).
  virtual Status setExpiry(const std::string& id, int64_t expiresAtMs, int64_t ttlS) = 0;
  // A pause (state paused, pausedAtMs its time) or its end (state running,
  // pausedAtMs 0), with the expiry that follows, in one step; its memory
  // in RAM (a checkpoint to disk is set after; a resume brought it back).
  virtual Status setPause(const std::string& id, EnvironmentState state, int64_t pausedAtMs, int64_t expiresAtMs) = 0;
  // Where a paused environment's memory is (docs/PAUSE.md, "To disk").
  virtual Status setPausedMemory(const std::string& id, PausedMemory where) = 0;
  // Records in a state other than gone and failed (what a restart must look at).
  virtual Result<std::vector<EnvironmentRecord>> liveEnvironments() = 0;

  virtual Status insertKey(const ApiKeyRecord& key) = 0;  // "conflict" on a duplicate id
  virtual Result<std::optional<ApiKeyRecord>> getKey(const std::string& id) = 0;
  virtual Result<std::vector<ApiKeyRecord>> listKeys() = 0;           // newest first, revoked too
  virtual Status revokeKey(const std::string& id, int64_t atMs) = 0;  // "not_found"

  virtual Status setPermissions(const std::string& environmentId, const std::string& permissions) = 0;
  virtual Status setNetwork(const std::string& environmentId, const std::string& network, int64_t netSlot) = 0;
  virtual Status insertSnapshot(const SnapshotRecord& snapshot) = 0;  // "conflict" on a duplicate id
  // The state and the host uid its files' root had. "not_found".
  virtual Status setSnapshotState(const std::string& id, SnapshotState state, uint32_t hostBase) = 0;
  virtual Result<std::optional<SnapshotRecord>> getSnapshot(const std::string& id) = 0;
  // Newest first; owner "" lists everyone's, environment "" every environment's.
  virtual Result<std::vector<SnapshotRecord>> listSnapshots(const std::string& owner,
                                                            const std::string& environment) = 0;
  virtual Status deleteSnapshot(const std::string& id) = 0;  // no error when already gone
  // Templates: "conflict" on a duplicate name; update writes state, error,
  // config and size ("not_found").
  virtual Status insertTemplate(const TemplateRecord& record) = 0;
  virtual Status updateTemplate(const TemplateRecord& record) = 0;
  virtual Result<std::optional<TemplateRecord>> getTemplate(const std::string& name) = 0;
  virtual Result<std::vector<TemplateRecord>> listTemplates() = 0;  // by name
  virtual Status deleteTemplate(const std::string& name) = 0;       // no error when already gone
  // What stands on a template: "environment <id>" for each one not gone or
  // failed, "snapshot <id>" for each snapshot (their files sit on it).
  virtual Result<std::vector<std::string>> templateUsers(const std::string& name) = 0;
  virtual Status insertApproval(const ApprovalRecord& approval) = 0;
  // Writes state, decided_by, reason, decided_at_ms, remember and used.
  virtual Status updateApproval(const ApprovalRecord& approval) = 0;
  virtual Result<std::optional<ApprovalRecord>> getApproval(const std::string& id) = 0;
  virtual Result<std::vector<ApprovalRecord>> listApprovals(const ApprovalFilter& filter) = 0;  // newest first
  // Pending approvals become expired with `reason` (a restart: nobody waits any more).
  virtual Status expirePendingApprovals(const std::string& reason, int64_t atMs) = 0;
  // Audit events: append-only. One transaction deletes every event with an
  // id up to `pruneThrough` (0: none) and appends `events` in order.
  virtual Status appendEvents(const std::vector<EventRecord>& events, uint64_t pruneThrough) = 0;
  // Ascending id.
  virtual Result<std::vector<EventRecord>> listEvents(const EventQuery& query) = 0;
  virtual Result<std::optional<EventRecord>> getEvent(uint64_t id) = 0;
  virtual Result<std::optional<EventRecord>> firstEvent() = 0;
  virtual Result<std::optional<EventRecord>> lastEvent() = 0;
  // The end of the oldest events: the greatest id such that it and every
  // event before it are older than `timeMs` (times grow with the ids; a
  // clock that stepped back ends the prefix early). 0 when the first event
  // is not older.
  virtual Result<uint64_t> lastEventBefore(int64_t timeMs) = 0;
};

// Opens (creating if needed) the SQLite store at `path`: WAL journal,
// foreign keys on, schema migrated to the newest version in one transaction
// per step; a database newer than this binary is refused with a clear error.
// Thread-safe: one connection guarded by a mutex.
Result<std::unique_ptr<Store>> openSqliteStore(const std::string& path);

}  // namespace moat::store
