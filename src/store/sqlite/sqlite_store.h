#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "store/store.h"

struct sqlite3;
struct sqlite3_stmt;

// The Store on one SQLite file (see openSqliteStore in store/store.h).
namespace moat::store::sqlite {

struct DbCloser {
  void operator()(::sqlite3* db) const;
};
using DbPtr = std::unique_ptr<::sqlite3, DbCloser>;

// Prepared statements kept for reuse, by their SQL text: compiling one costs
// more than running it (tens of microseconds on every create and destroy).
struct CachedStatement {
  ::sqlite3_stmt* stmt = nullptr;
  bool inUse = false;  // a caller holds it; a second one prepares its own
};
using StatementCache = std::unordered_map<std::string, CachedStatement>;

class SqliteStore final : public Store {
 public:
  // Opens or creates the database file (mode 0600), sets the connection up
  // and brings the schema to kSchemaVersion (store/sqlite/migrations.h).
  static Result<std::unique_ptr<SqliteStore>> open(const std::string& path);
  ~SqliteStore() override;

  Status insertEnvironment(const EnvironmentRecord& record) override;
  Result<std::optional<EnvironmentRecord>> getEnvironment(const std::string& id) override;
  Result<std::vector<EnvironmentRecord>> listEnvironments(const EnvironmentFilter& filter) override;
  Status setState(const std::string& id, EnvironmentState state, const std::string& reason) override;
  Status setExpiry(const std::string& id, int64_t expiresAtMs, int64_t ttlS) override;
  Status setPause(const std::string& id, EnvironmentState state, int64_t pausedAtMs, int64_t expiresAtMs) override;
  Status setPausedMemory(const std::string& id, PausedMemory where) override;
  Result<std::vector<EnvironmentRecord>> liveEnvironments() override;
  Status insertKey(const ApiKeyRecord& key) override;
  Result<std::optional<ApiKeyRecord>> getKey(const std::string& id) override;
  Result<std::vector<ApiKeyRecord>> listKeys() override;
  Status revokeKey(const std::string& id, int64_t atMs) override;
  Status setPermissions(const std::string& environmentId, const std::string& permissions) override;
  Status setNetwork(const std::string& environmentId, const std::string& network, int64_t netSlot) override;
  Status insertSnapshot(const SnapshotRecord& snapshot) override;
  Status setSnapshotState(const std::string& id, SnapshotState state, uint32_t hostBase) override;
  Result<std::optional<SnapshotRecord>> getSnapshot(const std::string& id) override;
  Result<std::vector<SnapshotRecord>> listSnapshots(const std::string& owner, const std::string& environment) override;
  Status deleteSnapshot(const std::string& id) override;
  Status insertTemplate(const TemplateRecord& record) override;
  Status updateTemplate(const TemplateRecord& record) override;
  Result<std::optional<TemplateRecord>> getTemplate(const std::string& name) override;
  Result<std::vector<TemplateRecord>> listTemplates() override;
  Status deleteTemplate(const std::string& name) override;
  Result<std::vector<std::string>> templateUsers(const std::string& name) override;
  Status insertApproval(const ApprovalRecord& approval) override;
  Status updateApproval(const ApprovalRecord& approval) override;
  Result<std::optional<ApprovalRecord>> getApproval(const std::string& id) override;
  Result<std::vector<ApprovalRecord>> listApprovals(const ApprovalFilter& filter) override;
  Status expirePendingApprovals(const std::string& reason, int64_t atMs) override;
  Status appendEvents(const std::vector<EventRecord>& events, uint64_t pruneThrough) override;
  Result<std::vector<EventRecord>> listEvents(const EventQuery& query) override;
  Result<std::optional<EventRecord>> getEvent(uint64_t id) override;
  Result<std::optional<EventRecord>> firstEvent() override;
  Result<std::optional<EventRecord>> lastEvent() override;
  Result<uint64_t> lastEventBefore(int64_t timeMs) override;

 private:
  explicit SqliteStore(DbPtr db) : db_(std::move(db)) {}

  // One connection shared by every caller. SQLite's own FULLMUTEX lock makes
  // each call safe, but not the error message and change count read after
  // it, so every public method holds mutex_ for its whole duration.
  std::mutex mutex_;
  DbPtr db_;
  StatementCache statements_;  // under mutex_; finalized before db_ closes
};

}  // namespace moat::store::sqlite
