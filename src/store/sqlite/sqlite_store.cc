#include "store/sqlite/sqlite_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "common/unique_fd.h"
#include "os/file.h"
#include "store/sqlite/migrations.h"

namespace moat::store {

Result<std::unique_ptr<Store>> openSqliteStore(const std::string& path) {
  MOAT_ASSIGN(std::unique_ptr<sqlite::SqliteStore> store, sqlite::SqliteStore::open(path));
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace moat::store

namespace moat::store::sqlite {

void DbCloser::operator()(::sqlite3* db) const { sqlite3_close_v2(db); }

SqliteStore::~SqliteStore() {
  for (auto& [sql, cached] : statements_) sqlite3_finalize(cached.stmt);
}

namespace {

// The connection's last error as an Error that says what was being done:
// "insert environment abc: UNIQUE constraint failed: environments.id".
Error sqliteError(::sqlite3* db, const std::string& what) {
  const int rc = sqlite3_extended_errcode(db);
  Code code = Code::kStore;
  if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE) {
    code = Code::kConflict;
  } else if (rc == SQLITE_CONSTRAINT_CHECK || rc == SQLITE_CONSTRAINT_NOTNULL) {
    code = Code::kInvalidArgument;
  }
  // Only an I/O failure has a meaningful errno behind it.
  const int primary = rc & 0xff;
  const int sysErrno = (primary == SQLITE_IOERR || primary == SQLITE_CANTOPEN) ? sqlite3_system_errno(db) : 0;
  return Error{code, sysErrno, what + ": " + sqlite3_errmsg(db)};
}

// Runs SQL that carries no outside values (pragmas, schema, BEGIN/COMMIT).
Status exec(::sqlite3* db, const char* sql, const std::string& what) {
  if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return sqliteError(db, what);
  return {};
}

// One prepared statement, finalized when it goes out of scope. Values only
// ever reach SQL through bind*.
class Statement {
 public:
  static Result<Statement> prepare(::sqlite3* db, std::string_view sql, std::string what) {
    MOAT_ASSIGN(::sqlite3_stmt * stmt, compile(db, sql, 0, what));
    return Statement(db, stmt, std::move(what), nullptr);
  }

  // From the cache, compiled on first use; reset for the next caller when
  // this one goes out of scope. A statement in use elsewhere (or a full
  // cache: SQL built from filters varies) gets one of its own.
  static Result<Statement> cached(StatementCache& cache, ::sqlite3* db, std::string_view sql, std::string what) {
    constexpr size_t kMaxCached = 64;
    auto it = cache.find(std::string(sql));
    if (it == cache.end() && cache.size() < kMaxCached) {
      MOAT_ASSIGN(::sqlite3_stmt * stmt, compile(db, sql, SQLITE_PREPARE_PERSISTENT, what));
      it = cache.emplace(std::string(sql), CachedStatement{stmt, false}).first;
    }
    if (it == cache.end() || it->second.inUse) return prepare(db, sql, std::move(what));
    it->second.inUse = true;
    return Statement(db, it->second.stmt, std::move(what), &it->second.inUse);
  }

  Statement(Statement&& other) noexcept
      : db_(other.db_),
        stmt_(std::exchange(other.stmt_, nullptr)),
        what_(std::move(other.what_)),
        inUse_(std::exchange(other.inUse_, nullptr)) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() {
    if (inUse_ != nullptr) {
      reset();
      *inUse_ = false;
    } else {
      sqlite3_finalize(stmt_);  // a no-op on nullptr
    }
  }

  Status bindAt(int index, std::string_view value) {
    return check(sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  Status bindAt(int index, int64_t value) { return check(sqlite3_bind_int64(stmt_, index, value)); }
  Status bindAt(int index, double value) { return check(sqlite3_bind_double(stmt_, index, value)); }

  // Binds the arguments to ?1, ?2, ... in order.
  template <class... Args>
  Status bindAll(const Args&... args) {
    int index = 0;
    Status status;
    ((status = status.ok() ? bindAt(++index, args) : status), ...);
    return status;
  }

  // True while there is a row to read.
  Result<bool> step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return sqliteError(db_, what_);
  }
  // For statements that return no rows.
  Status run() {
    MOAT_ASSIGN(bool row, step());
    (void)row;
    return {};
  }
  // Ready to be bound and run again (a batch reuses one prepared statement).
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  std::string text(int column) const {
    const auto* data = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    if (data == nullptr) return {};  // NULL
    return std::string(data, static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
  }
  int64_t integer(int column) const { return sqlite3_column_int64(stmt_, column); }
  double real(int column) const { return sqlite3_column_double(stmt_, column); }

 private:
  Statement(::sqlite3* db, ::sqlite3_stmt* stmt, std::string what, bool* inUse)
      : db_(db), stmt_(stmt), what_(std::move(what)), inUse_(inUse) {}

  static Result<::sqlite3_stmt*> compile(::sqlite3* db, std::string_view sql, unsigned flags, const std::string& what) {
    ::sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()), flags, &stmt, nullptr) != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return sqliteError(db, what);
    }
    return stmt;
  }

  Status check(int rc) const {
    if (rc != SQLITE_OK) return sqliteError(db_, what_);
    return {};
  }

  ::sqlite3* db_;
  ::sqlite3_stmt* stmt_;
  std::string what_;
  bool* inUse_;  // the cache's flag, when the statement is the cache's
};

// BEGIN IMMEDIATE ... COMMIT; rolled back unless committed.
class Transaction {
 public:
  static Result<Transaction> begin(::sqlite3* db, const std::string& what) {
    // IMMEDIATE takes the write lock now, so two processes opening the same
    // file cannot both decide to apply the same migration.
    MOAT_TRY(exec(db, "BEGIN IMMEDIATE", what + ": begin"));
    return Transaction(db);
  }
  Transaction(Transaction&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction() {
    if (db_ != nullptr) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }

  Status commit(const std::string& what) {
    MOAT_TRY(exec(db_, "COMMIT", what + ": commit"));
    db_ = nullptr;
    return {};
  }

 private:
  explicit Transaction(::sqlite3* db) : db_(db) {}
  ::sqlite3* db_;
};

Result<int64_t> userVersion(::sqlite3* db, const std::string& path) {
  const std::string what = "read schema version of " + path;
  MOAT_ASSIGN(Statement stmt, Statement::prepare(db, "PRAGMA user_version", what));
  MOAT_ASSIGN(bool row, stmt.step());
  if (!row) return Error::make(Code::kStore, what + ": no result");
  return stmt.integer(0);
}

Status checkSupported(int64_t version, const std::string& path) {
  if (version >= 0 && version <= kSchemaVersion) return {};
  return Error::make(Code::kUnsupported, "database " + path + " has schema version " + std::to_string(version) +
                                             ", this moatd knows versions 1 to " + std::to_string(kSchemaVersion));
}

Status migrate(::sqlite3* db, const std::string& path) {
  MOAT_ASSIGN(int64_t version, userVersion(db, path));
  for (const Migration& step : kMigrations) {
    if (step.version <= version) continue;
    const std::string what = "migrate " + path + " to schema version " + std::to_string(step.version);
    MOAT_ASSIGN(Transaction transaction, Transaction::begin(db, what));
    // Another process may have migrated between our read and the lock.
    MOAT_ASSIGN(version, userVersion(db, path));
    MOAT_TRY(checkSupported(version, path));
    if (step.version <= version) continue;  // the rollback only releases the lock
    MOAT_TRY(exec(db, step.sql, what));
    // PRAGMA takes no bound parameters; the number is our own constant.
    const std::string setVersion = "PRAGMA user_version = " + std::to_string(step.version);
    MOAT_TRY(exec(db, setVersion.c_str(), what));
    MOAT_TRY(transaction.commit(what));
    version = step.version;
  }
  return {};
}

Result<std::string> encodeLabels(const std::map<std::string, std::string>& labels, const std::string& what) {
  try {
    return nlohmann::json(labels).dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() throws on strings that are not UTF-8.
    return Error::make(Code::kInvalidArgument, what + ": labels: " + e.what());
  }
}

Result<std::map<std::string, std::string>> decodeLabels(const std::string& text, const std::string& id) {
  std::map<std::string, std::string> labels;
  if (text.empty()) return labels;
  const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const std::string corrupt = "environment " + id + ": stored labels are not a JSON object of strings";
  if (!json.is_object()) return Error::make(Code::kStore, corrupt);
  for (const auto& [key, value] : json.items()) {
    if (!value.is_string()) return Error::make(Code::kStore, corrupt);
    labels.emplace(key, value.get<std::string>());
  }
  return labels;
}

constexpr std::string_view kSelectEnvironments =
    "SELECT id, task_id, template, cpus, ram_mb, storage_gb, pids, labels, state, reason,"
    " created_at_ms, expires_at_ms, owner, env, permissions, network, secrets, net_slot, isolation, accel,"
    " paused_at_ms, ttl_while_paused, on_expiry, ttl_s, paused_memory, expiry_memory, back_to_disk"
    " FROM environments";
constexpr std::string_view kNewestFirst = " ORDER BY created_at_ms DESC, id";

// Reads the current row of a statement that selected kSelectEnvironments.
Result<EnvironmentRecord> readEnvironment(const Statement& stmt) {
  EnvironmentRecord record;
  record.id = stmt.text(0);
  record.taskId = stmt.text(1);
  record.templateName = stmt.text(2);
  record.cpus = stmt.real(3);
  record.ramMb = static_cast<uint64_t>(stmt.integer(4));
  record.storageGb = stmt.real(5);
  record.pids = static_cast<uint64_t>(stmt.integer(6));
  MOAT_ASSIGN(record.labels, decodeLabels(stmt.text(7), record.id));
  MOAT_ASSIGN(record.env, decodeLabels(stmt.text(13), record.id));
  auto state = environmentStateNamed(stmt.text(8));
  if (!state)
    return Error::make(Code::kCorrupt, "environment " + record.id + " has no known state ('" + stmt.text(8) + "')");
  record.state = *state;
  record.reason = stmt.text(9);
  record.createdAtMs = stmt.integer(10);
  record.expiresAtMs = stmt.integer(11);
  record.owner = stmt.text(12);
  record.permissions = stmt.text(14);
  record.network = stmt.text(15);
  record.secrets = stmt.text(16);
  record.netSlot = stmt.integer(17);
  record.isolation = stmt.text(18);
  record.accel = stmt.text(19);
  record.pausedAtMs = stmt.integer(20);
  record.ttlRunsWhilePaused = stmt.text(21) == "runs";
  auto action = expiryActionNamed(stmt.text(22));
  if (!action) {
    return Error::make(Code::kCorrupt,
                       "environment " + record.id + " has no known action at expiry ('" + stmt.text(22) + "')");
  }
  record.onExpiry = *action == ExpiryAction::kPause && stmt.text(25) == "disk" ? ExpiryAction::kCheckpoint : *action;
  record.ttlS = stmt.integer(23);
  record.pausedToDisk = stmt.text(24) == "disk";
  record.backToDisk = stmt.integer(26) != 0;
  return record;
}

Result<std::vector<EnvironmentRecord>> readEnvironments(Statement& stmt) {
  std::vector<EnvironmentRecord> records;
  while (true) {
    MOAT_ASSIGN(bool row, stmt.step());
    if (!row) break;
    MOAT_ASSIGN(EnvironmentRecord record, readEnvironment(stmt));
    records.push_back(std::move(record));
  }
  return records;
}

bool labelsMatch(const std::map<std::string, std::string>& have, const std::map<std::string, std::string>& want) {
  for (const auto& [key, value] : want) {
    auto it = have.find(key);
    if (it == have.end() || it->second != value) return false;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<SqliteStore>> SqliteStore::open(const std::string& path) {
  // Create the file ourselves so that it never exists with a wider mode than
  // 0600 (SQLite would use 0644), and tighten an existing one. SQLite gives
  // the -wal and -shm files the mode of the database file.
  {
    MOAT_ASSIGN(UniqueFd fd, os::open(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0600));
    if (::fchmod(fd.get(), 0600) != 0) return Error::fromErrno("chmod 0600 " + path);
  }

  ::sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  DbPtr db(raw);  // a handle comes back even on failure, to be closed
  if (rc != SQLITE_OK) {
    if (!db) return Error::make(Code::kStore, "open " + path + ": " + sqlite3_errstr(rc));
    return sqliteError(db.get(), "open " + path);
  }

  const std::string setUp = "set up " + path;
  MOAT_TRY(exec(db.get(), "PRAGMA busy_timeout = 5000", setUp));
  // Refuse a newer database before writing anything to it.
  MOAT_ASSIGN(int64_t version, userVersion(db.get(), path));
  MOAT_TRY(checkSupported(version, path));

  {
    const std::string what = "set WAL journal mode on " + path;
    MOAT_ASSIGN(Statement stmt, Statement::prepare(db.get(), "PRAGMA journal_mode = WAL", what));
    MOAT_ASSIGN(bool row, stmt.step());
    // SQLite answers with the mode now in force; it keeps the old one when
    // the file system cannot do WAL.
    const std::string mode = row ? stmt.text(0) : "";
    if (mode != "wal") return Error::make(Code::kStore, what + ": journal mode is \"" + mode + "\"");
  }
  MOAT_TRY(exec(db.get(), "PRAGMA synchronous = NORMAL", setUp));
  MOAT_TRY(exec(db.get(), "PRAGMA foreign_keys = ON", setUp));
  MOAT_TRY(migrate(db.get(), path));

  return std::unique_ptr<SqliteStore>(new SqliteStore(std::move(db)));
}

Status SqliteStore::insertEnvironment(const EnvironmentRecord& record) {
  const std::string what = "insert environment " + record.id;
  MOAT_ASSIGN(std::string labels, encodeLabels(record.labels, what));
  MOAT_ASSIGN(std::string env, encodeLabels(record.env, what));
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(),
                                                "INSERT INTO environments (id, task_id, template, cpus, ram_mb,"
                                                " storage_gb, pids, labels, state, reason, created_at_ms,"
                                                " expires_at_ms, owner, env, permissions, network, secrets, net_slot,"
                                                " isolation, accel, paused_at_ms, ttl_while_paused, on_expiry,"
                                                " ttl_s, expiry_memory)"
                                                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                                                " ?, ?, ?, ?, ?)",
                                                what));
  // The unsigned counts are stored as their 64-bit pattern and read back the
  // same way, so every value round-trips.
  MOAT_TRY(stmt.bindAll(
      record.id, record.taskId, record.templateName, record.cpus, static_cast<int64_t>(record.ramMb), record.storageGb,
      static_cast<int64_t>(record.pids), labels, std::string(stateName(record.state)), record.reason,
      record.createdAtMs, record.expiresAtMs, record.owner, env, record.permissions, record.network, record.secrets,
      record.netSlot, record.isolation, record.accel, record.pausedAtMs,
      std::string(record.ttlRunsWhilePaused ? "runs" : "stops"),
      // A checkpoint at expiry is a pause whose memory goes to disk.
      std::string(actionName(record.onExpiry == ExpiryAction::kCheckpoint ? ExpiryAction::kPause : record.onExpiry)),
      record.ttlS, std::string(record.onExpiry == ExpiryAction::kCheckpoint ? "disk" : "ram")));
  return stmt.run();
}

Result<std::optional<EnvironmentRecord>> SqliteStore::getEnvironment(const std::string& id) {
  const std::string what = "get environment " + id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(), std::string(kSelectEnvironments) + " WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(id));
  MOAT_ASSIGN(bool row, stmt.step());
  if (!row) return std::optional<EnvironmentRecord>();
  MOAT_ASSIGN(EnvironmentRecord record, readEnvironment(stmt));
  return std::optional<EnvironmentRecord>(std::move(record));
}

Result<std::vector<EnvironmentRecord>> SqliteStore::listEnvironments(const EnvironmentFilter& filter) {
  // The SQL is assembled from fixed fragments only (so the indexes on
  // task_id, state and owner can serve it); the values are bound.
  std::string sql(kSelectEnvironments);
  std::vector<std::string_view> values;
  bool first = true;
  auto condition = [&](std::string_view fragment) {
    sql += first ? " WHERE " : " AND ";
    sql += fragment;
    first = false;
  };
  if (!filter.taskId.empty()) {
    condition("task_id = ?");
    values.push_back(filter.taskId);
  }
  if (!filter.state) {
    condition("state != 'gone'");
  } else {
    condition("state = ?");
    values.push_back(stateName(*filter.state));
  }
  if (!filter.owner.empty()) {
    condition("owner = ?");
    values.push_back(filter.owner);
  }
  sql += kNewestFirst;

  std::vector<EnvironmentRecord> records;
  {
    std::lock_guard lock(mutex_);
    MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(), sql, "list environments"));
    for (size_t i = 0; i < values.size(); ++i) {
      MOAT_TRY(stmt.bindAt(static_cast<int>(i) + 1, values[i]));
    }
    MOAT_ASSIGN(records, readEnvironments(stmt));
  }
  if (!filter.labels.empty()) {
    std::erase_if(records, [&](const EnvironmentRecord& record) { return !labelsMatch(record.labels, filter.labels); });
  }
  return records;
}

Status SqliteStore::setState(const std::string& id, EnvironmentState state, const std::string& reason) {
  const std::string what = "set state of environment " + id + " to " + stateName(state);
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(),
                                                "UPDATE environments SET state = ?, reason = ? WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(std::string(stateName(state)), reason, id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) {
    return Error::make(Code::kNotFound, what + ": no such environment");
  }
  return {};
}

Status SqliteStore::setExpiry(const std::string& id, int64_t expiresAtMs, int64_t ttlS) {
  const std::string what = "set expiry of environment " + id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                "UPDATE environments SET expires_at_ms = ?, ttl_s = ? WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(expiresAtMs, ttlS, id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) {
    return Error::make(Code::kNotFound, what + ": no such environment");
  }
  return {};
}

Status SqliteStore::setPermissions(const std::string& id, const std::string& permissions) {
  const std::string what = "set permissions of environment " + id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(), "UPDATE environments SET permissions = ? WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(permissions, id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) return Error::make(Code::kNotFound, what + ": no such environment");
  return {};
}

Status SqliteStore::setNetwork(const std::string& id, const std::string& network, int64_t netSlot) {
  const std::string what = "set network of environment " + id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                "UPDATE environments SET network = ?, net_slot = ? WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(network, netSlot, id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) return Error::make(Code::kNotFound, what + ": no such environment");
  return {};
}

Status SqliteStore::setPause(const std::string& id, EnvironmentState state, int64_t pausedAtMs, int64_t expiresAtMs) {
  const std::string what = "set the pause of environment " + id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(
      Statement stmt,
      Statement::cached(statements_, db_.get(),
                        "UPDATE environments SET state = ?, paused_at_ms = ?, expires_at_ms = ?, paused_memory = 'ram',"
                        " back_to_disk = 0 WHERE id = ?",
                        what));
  MOAT_TRY(stmt.bindAll(std::string(stateName(state)), pausedAtMs, expiresAtMs, id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) return Error::make(Code::kNotFound, what + ": no such environment");
  return {};
}

Status SqliteStore::setPausedMemory(const std::string& id, PausedMemory where) {
  const std::string what = "set where environment " + id + "'s memory is";
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                "UPDATE environments SET paused_memory = ?, back_to_disk = ? WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(std::string(where == PausedMemory::kDisk ? "disk" : "ram"),
                        int64_t{where == PausedMemory::kRamUntilIdle}, id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) return Error::make(Code::kNotFound, what + ": no such environment");
  return {};
}

Result<std::vector<EnvironmentRecord>> SqliteStore::liveEnvironments() {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                std::string(kSelectEnvironments) + " WHERE state NOT IN ('gone', 'failed')" +
                                    std::string(kNewestFirst),
                                "list live environments"));
  return readEnvironments(stmt);
}

namespace {

constexpr std::string_view kSelectKeys =
    "SELECT id, name, token_hash, scopes, created_at_ms, revoked_at_ms, permissions FROM api_keys";

Result<ApiKeyRecord> readKey(const Statement& stmt) {
  ApiKeyRecord key;
  key.id = stmt.text(0);
  key.name = stmt.text(1);
  key.tokenHash = stmt.text(2);
  auto scopes = nlohmann::json::parse(stmt.text(3), nullptr, false);
  if (!scopes.is_array())
    return Error::make(Code::kStore, "api key " + key.id + ": stored scopes are not a JSON array");
  for (const auto& s : scopes) {
    if (!s.is_string()) return Error::make(Code::kStore, "api key " + key.id + ": a scope is not a string");
    key.scopes.push_back(s.get<std::string>());
  }
  key.createdAtMs = stmt.integer(4);
  key.revokedAtMs = stmt.integer(5);
  key.permissions = stmt.text(6);
  return key;
}

}  // namespace

Status SqliteStore::insertKey(const ApiKeyRecord& key) {
  const std::string what = "insert api key " + key.id;
  std::string scopes = nlohmann::json(key.scopes).dump();
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(),
                                                "INSERT INTO api_keys (id, name, token_hash, scopes, created_at_ms,"
                                                " revoked_at_ms, permissions) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                                what));
  MOAT_TRY(stmt.bindAll(key.id, key.name, key.tokenHash, scopes, key.createdAtMs, key.revokedAtMs, key.permissions));
  return stmt.run();
}

Result<std::optional<ApiKeyRecord>> SqliteStore::getKey(const std::string& id) {
  const std::string what = "get api key " + id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(), std::string(kSelectKeys) + " WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(id));
  MOAT_ASSIGN(bool row, stmt.step());
  if (!row) return std::optional<ApiKeyRecord>();
  MOAT_ASSIGN(ApiKeyRecord key, readKey(stmt));
  return std::optional<ApiKeyRecord>(std::move(key));
}

Result<std::vector<ApiKeyRecord>> SqliteStore::listKeys() {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(), std::string(kSelectKeys) + " ORDER BY created_at_ms DESC, id",
                                "list api keys"));
  std::vector<ApiKeyRecord> keys;
  while (true) {
    MOAT_ASSIGN(bool row, stmt.step());
    if (!row) break;
    MOAT_ASSIGN(ApiKeyRecord key, readKey(stmt));
    keys.push_back(std::move(key));
  }
  return keys;
}

Status SqliteStore::revokeKey(const std::string& id, int64_t atMs) {
  const std::string what = "revoke api key " + id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                "UPDATE api_keys SET revoked_at_ms = ? WHERE id = ? AND revoked_at_ms = 0", what));
  MOAT_TRY(stmt.bindAll(atMs, id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) return Error::make(Code::kNotFound, what + ": no such active key");
  return {};
}

namespace {

constexpr std::string_view kSelectApprovals =
    "SELECT id, environment, scope, action, requester, created_at_ms, state, decided_by, reason,"
    " decided_at_ms, remember, used FROM approvals";

Result<ApprovalRecord> readApproval(const Statement& stmt) {
  ApprovalRecord a;
  a.id = stmt.text(0);
  a.environment = stmt.text(1);
  a.scope = stmt.text(2);
  a.action = stmt.text(3);
  a.requester = stmt.text(4);
  a.createdAtMs = stmt.integer(5);
  auto state = approvalStateNamed(stmt.text(6));
  if (!state) return Error::make(Code::kCorrupt, "approval " + a.id + " has no known state ('" + stmt.text(6) + "')");
  a.state = *state;
  a.decidedBy = stmt.text(7);
  a.reason = stmt.text(8);
  a.decidedAtMs = stmt.integer(9);
  a.remember = stmt.integer(10) != 0;
  a.used = stmt.integer(11) != 0;
  return a;
}

}  // namespace

namespace {

constexpr std::string_view kSelectSnapshots =
    "SELECT id, environment, owner, template, storage_gb, host_base, name, state, created_at_ms, isolation FROM "
    "snapshots";

Result<SnapshotRecord> readSnapshot(const Statement& stmt) {
  SnapshotRecord r;
  r.id = stmt.text(0);
  r.environment = stmt.text(1);
  r.owner = stmt.text(2);
  r.templateName = stmt.text(3);
  r.storageGb = stmt.real(4);
  r.hostBase = static_cast<uint32_t>(stmt.integer(5));
  r.name = stmt.text(6);
  auto state = snapshotStateNamed(stmt.text(7));
  if (!state) return Error::make(Code::kCorrupt, "snapshot " + r.id + " has no known state ('" + stmt.text(7) + "')");
  r.state = *state;
  r.createdAtMs = stmt.integer(8);
  r.isolation = stmt.text(9);
  return r;
}

}  // namespace

Status SqliteStore::insertSnapshot(const SnapshotRecord& r) {
  const std::string what = "insert snapshot " + r.id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                "INSERT INTO snapshots (id, environment, owner, template, storage_gb, host_base,"
                                " name, state, created_at_ms, isolation) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                what));
  MOAT_TRY(stmt.bindAll(r.id, r.environment, r.owner, r.templateName, r.storageGb, static_cast<int64_t>(r.hostBase),
                        r.name, std::string(stateName(r.state)), r.createdAtMs, r.isolation));
  return stmt.run();
}

Status SqliteStore::setSnapshotState(const std::string& id, SnapshotState state, uint32_t hostBase) {
  const std::string what = "set snapshot " + id + " " + stateName(state);
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(),
                                                "UPDATE snapshots SET state = ?, host_base = ? WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(std::string(stateName(state)), static_cast<int64_t>(hostBase), id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) return Error::make(Code::kNotFound, what + ": no such snapshot");
  return {};
}

Result<std::optional<SnapshotRecord>> SqliteStore::getSnapshot(const std::string& id) {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(), std::string(kSelectSnapshots) + " WHERE id = ?",
                                                "get snapshot " + id));
  MOAT_TRY(stmt.bindAll(id));
  MOAT_ASSIGN(bool row, stmt.step());
  if (!row) return std::optional<SnapshotRecord>();
  MOAT_ASSIGN(SnapshotRecord snapshot, readSnapshot(stmt));
  return std::optional<SnapshotRecord>(std::move(snapshot));
}

Result<std::vector<SnapshotRecord>> SqliteStore::listSnapshots(const std::string& owner,
                                                               const std::string& environment) {
  std::lock_guard lock(mutex_);
  std::string sql = std::string(kSelectSnapshots) +
                    " WHERE (? = '' OR owner = ?) AND (? = '' OR environment = ?) ORDER BY created_at_ms DESC, id";
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(), sql, "list snapshots"));
  MOAT_TRY(stmt.bindAll(owner, owner, environment, environment));
  std::vector<SnapshotRecord> out;
  while (true) {
    MOAT_ASSIGN(bool row, stmt.step());
    if (!row) break;
    MOAT_ASSIGN(SnapshotRecord snapshot, readSnapshot(stmt));
    out.push_back(std::move(snapshot));
  }
  return out;
}

Status SqliteStore::deleteSnapshot(const std::string& id) {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(), "DELETE FROM snapshots WHERE id = ?", "delete snapshot " + id));
  MOAT_TRY(stmt.bindAll(id));
  return stmt.run();
}

namespace {

constexpr std::string_view kSelectTemplates =
    "SELECT name, source, state, error_code, error_message, config, size_bytes, owner, created_at_ms FROM templates";

Result<TemplateRecord> readTemplate(const Statement& stmt) {
  TemplateRecord r;
  r.name = stmt.text(0);
  r.source = stmt.text(1);
  auto state = templateStateNamed(stmt.text(2));
  if (!state) return Error::make(Code::kCorrupt, "template " + r.name + " has no known state ('" + stmt.text(2) + "')");
  r.state = *state;
  r.errorCode = stmt.text(3);
  r.errorMessage = stmt.text(4);
  r.config = stmt.text(5);
  r.sizeBytes = static_cast<uint64_t>(stmt.integer(6));
  r.owner = stmt.text(7);
  r.createdAtMs = stmt.integer(8);
  return r;
}

}  // namespace

Status SqliteStore::insertTemplate(const TemplateRecord& r) {
  const std::string what = "insert template " + r.name;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                "INSERT INTO templates (name, source, state, error_code, error_message, config,"
                                " size_bytes, owner, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                what));
  MOAT_TRY(stmt.bindAll(r.name, r.source, std::string(stateName(r.state)), r.errorCode, r.errorMessage, r.config,
                        static_cast<int64_t>(r.sizeBytes), r.owner, r.createdAtMs));
  return stmt.run();
}

Status SqliteStore::updateTemplate(const TemplateRecord& r) {
  const std::string what = "update template " + r.name;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(),
                                                "UPDATE templates SET state = ?, error_code = ?, error_message = ?,"
                                                " config = ?, size_bytes = ? WHERE name = ?",
                                                what));
  MOAT_TRY(stmt.bindAll(std::string(stateName(r.state)), r.errorCode, r.errorMessage, r.config,
                        static_cast<int64_t>(r.sizeBytes), r.name));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) return Error::make(Code::kNotFound, what + ": no such template");
  return {};
}

Result<std::optional<TemplateRecord>> SqliteStore::getTemplate(const std::string& name) {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(), std::string(kSelectTemplates) + " WHERE name = ?",
                                "get template " + name));
  MOAT_TRY(stmt.bindAll(name));
  MOAT_ASSIGN(bool row, stmt.step());
  if (!row) return std::optional<TemplateRecord>();
  MOAT_ASSIGN(TemplateRecord record, readTemplate(stmt));
  return std::optional<TemplateRecord>(std::move(record));
}

Result<std::vector<TemplateRecord>> SqliteStore::listTemplates() {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(),
                                                std::string(kSelectTemplates) + " ORDER BY name", "list templates"));
  std::vector<TemplateRecord> out;
  while (true) {
    MOAT_ASSIGN(bool row, stmt.step());
    if (!row) break;
    MOAT_ASSIGN(TemplateRecord record, readTemplate(stmt));
    out.push_back(std::move(record));
  }
  return out;
}

Status SqliteStore::deleteTemplate(const std::string& name) {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(), "DELETE FROM templates WHERE name = ?",
                                                "delete template " + name));
  MOAT_TRY(stmt.bindAll(name));
  return stmt.run();
}

Result<std::vector<std::string>> SqliteStore::templateUsers(const std::string& name) {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(
      Statement stmt,
      Statement::cached(statements_, db_.get(),
                        "SELECT 'environment ' || id FROM environments WHERE template = ? AND state NOT IN"
                        " ('gone', 'failed') UNION ALL SELECT 'snapshot ' || id FROM snapshots WHERE template = ?",
                        "list the users of template " + name));
  MOAT_TRY(stmt.bindAll(name, name));
  std::vector<std::string> out;
  while (true) {
    MOAT_ASSIGN(bool row, stmt.step());
    if (!row) break;
    out.push_back(stmt.text(0));
  }
  return out;
}

Status SqliteStore::insertApproval(const ApprovalRecord& a) {
  const std::string what = "insert approval " + a.id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                "INSERT INTO approvals (id, environment, scope, action, requester,"
                                " created_at_ms, state, decided_by, reason, decided_at_ms, remember, used)"
                                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                what));
  MOAT_TRY(stmt.bindAll(a.id, a.environment, a.scope, a.action, a.requester, a.createdAtMs,
                        std::string(stateName(a.state)), a.decidedBy, a.reason, a.decidedAtMs,
                        static_cast<int64_t>(a.remember), static_cast<int64_t>(a.used)));
  return stmt.run();
}

Status SqliteStore::updateApproval(const ApprovalRecord& a) {
  const std::string what = "update approval " + a.id;
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(),
                                                "UPDATE approvals SET state = ?, decided_by = ?, reason = ?,"
                                                " decided_at_ms = ?, remember = ?, used = ? WHERE id = ?",
                                                what));
  MOAT_TRY(stmt.bindAll(std::string(stateName(a.state)), a.decidedBy, a.reason, a.decidedAtMs,
                        static_cast<int64_t>(a.remember), static_cast<int64_t>(a.used), a.id));
  MOAT_TRY(stmt.run());
  if (sqlite3_changes(db_.get()) == 0) return Error::make(Code::kNotFound, what + ": no such approval");
  return {};
}

Result<std::optional<ApprovalRecord>> SqliteStore::getApproval(const std::string& id) {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(), std::string(kSelectApprovals) + " WHERE id = ?",
                                                "get approval " + id));
  MOAT_TRY(stmt.bindAll(id));
  MOAT_ASSIGN(bool row, stmt.step());
  if (!row) return std::optional<ApprovalRecord>();
  MOAT_ASSIGN(ApprovalRecord approval, readApproval(stmt));
  return std::optional<ApprovalRecord>(std::move(approval));
}

Result<std::vector<ApprovalRecord>> SqliteStore::listApprovals(const ApprovalFilter& filter) {
  std::lock_guard lock(mutex_);
  std::string sql = std::string(kSelectApprovals) +
                    " WHERE (? = '' OR state = ?) AND (? = '' OR environment = ?)"
                    " ORDER BY created_at_ms DESC, id LIMIT 1000";
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(), sql, "list approvals"));
  const std::string state = filter.state ? stateName(*filter.state) : "";
  MOAT_TRY(stmt.bindAll(state, state, filter.environment, filter.environment));
  std::vector<ApprovalRecord> out;
  while (true) {
    MOAT_ASSIGN(bool row, stmt.step());
    if (!row) break;
    MOAT_ASSIGN(ApprovalRecord a, readApproval(stmt));
    if (!filter.environments.empty() &&
        std::find(filter.environments.begin(), filter.environments.end(), a.environment) == filter.environments.end()) {
      continue;
    }
    out.push_back(std::move(a));
  }
  return out;
}

Status SqliteStore::expirePendingApprovals(const std::string& reason, int64_t atMs) {
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(),
                                "UPDATE approvals SET state = 'expired', reason = ?, decided_by = 'moatd',"
                                " decided_at_ms = ? WHERE state = 'pending'",
                                "expire pending approvals"));
  MOAT_TRY(stmt.bindAll(reason, atMs));
  return stmt.run();
}

namespace {

constexpr std::string_view kSelectEvents =
    "SELECT id, time_ms, type, environment, actor, data, prev_hash, hash FROM events";

EventRecord readEvent(const Statement& stmt) {
  EventRecord event;
  event.id = static_cast<uint64_t>(stmt.integer(0));
  event.timeMs = stmt.integer(1);
  event.type = stmt.text(2);
  event.environment = stmt.text(3);
  event.actor = stmt.text(4);
  event.data = stmt.text(5);
  event.prevHash = stmt.text(6);
  event.hash = stmt.text(7);
  return event;
}

Result<std::vector<EventRecord>> readEvents(Statement& stmt) {
  std::vector<EventRecord> events;
  while (true) {
    MOAT_ASSIGN(bool row, stmt.step());
    if (!row) break;
    events.push_back(readEvent(stmt));
  }
  return events;
}

}  // namespace

Status SqliteStore::appendEvents(const std::vector<EventRecord>& events, uint64_t pruneThrough) {
  const std::string what = "append " + std::to_string(events.size()) + " audit events";
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Transaction transaction, Transaction::begin(db_.get(), what));
  if (pruneThrough > 0) {
    MOAT_ASSIGN(Statement prune, Statement::cached(statements_, db_.get(), "DELETE FROM events WHERE id <= ?", what));
    MOAT_TRY(prune.bindAll(static_cast<int64_t>(pruneThrough)));
    MOAT_TRY(prune.run());
  }
  MOAT_ASSIGN(Statement insert, Statement::cached(statements_, db_.get(),
                                                  "INSERT INTO events (id, time_ms, type, environment, actor, data,"
                                                  " prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                                  what));
  for (const EventRecord& e : events) {
    MOAT_TRY(insert.bindAll(static_cast<int64_t>(e.id), e.timeMs, e.type, e.environment, e.actor, e.data, e.prevHash,
                            e.hash));
    MOAT_TRY(insert.run());
    insert.reset();
  }
  return transaction.commit(what);
}

Result<std::vector<EventRecord>> SqliteStore::listEvents(const EventQuery& query) {
  // Fixed fragments only; the values are bound. The id range comes first so
  // that a follower's "what is new" reads from the primary key.
  std::string sql(kSelectEvents);
  sql += " WHERE id > ?1";
  if (!query.environment.empty()) sql += " AND environment = ?2";
  if (!query.typePrefix.empty()) sql += " AND substr(type, 1, length(?3)) = ?3";
  if (!query.owner.empty()) {
    sql += " AND environment IN (SELECT id FROM environments WHERE owner = ?4)";
  }
  sql += " ORDER BY id LIMIT ?5";
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt, Statement::cached(statements_, db_.get(), sql, "list audit events"));
  MOAT_TRY(stmt.bindAt(1, static_cast<int64_t>(query.afterId)));
  if (!query.environment.empty()) MOAT_TRY(stmt.bindAt(2, query.environment));
  if (!query.typePrefix.empty()) MOAT_TRY(stmt.bindAt(3, query.typePrefix));
  if (!query.owner.empty()) MOAT_TRY(stmt.bindAt(4, query.owner));
  MOAT_TRY(stmt.bindAt(5, static_cast<int64_t>(query.limit)));
  return readEvents(stmt);
}

Result<std::optional<EventRecord>> SqliteStore::getEvent(uint64_t id) {
  const std::string what = "get audit event " + std::to_string(id);
  std::lock_guard lock(mutex_);
  MOAT_ASSIGN(Statement stmt,
              Statement::cached(statements_, db_.get(), std::string(kSelectEvents) + " WHERE id = ?", what));
  MOAT_TRY(stmt.bindAll(static_cast<int64_t>(id)));
  MOAT_ASSIGN(bool row, stmt.step());
  if (!row) return std::optional<EventRecord>();
  return std::optional<EventRecord>(readEvent(stmt));
}

namespace {

Result<std::optional<EventRecord>> oneEvent(::sqlite3* db, const std::string& sql, const std::string& what) {
  MOAT_ASSIGN(Statement stmt, Statement::prepare(db, sql, what));
  MOAT_ASSIGN(bool row, stmt.step());
  if (!row) return std::optional<EventRecord>();
  return std::optional<EventRecord>(readEvent(stmt));
}

}  // namespace

Result<std::optional<EventRecord>> SqliteStore::firstEvent() {
  std::lock_guard lock(mutex_);
  return oneEvent(db_.get(), std::string(kSelectEvents) + " ORDER BY id LIMIT 1", "read the first audit event");
}

Result<std::optional<EventRecord>> SqliteStore::lastEvent() {
  std::lock_guard lock(mutex_);
  return oneEvent(db_.get(), std::string(kSelectEvents) + " ORDER BY id DESC LIMIT 1", "read the last audit event");
}

Result<uint64_t> SqliteStore::lastEventBefore(int64_t timeMs) {
  const std::string what = "find audit events before " + std::to_string(timeMs);
  std::lock_guard lock(mutex_);
  // A binary search over the ids (a few primary key lookups) instead of an
  // index on time_ms, which every append would have to write.
  MOAT_ASSIGN(
      Statement bounds,
      Statement::cached(statements_, db_.get(), "SELECT coalesce(min(id), 0), coalesce(max(id), 0) FROM events", what));
  MOAT_ASSIGN(bool row, bounds.step());
  if (!row || bounds.integer(0) == 0) return uint64_t{0};
  MOAT_ASSIGN(Statement at,
              Statement::cached(statements_, db_.get(),
                                "SELECT id, time_ms FROM events WHERE id >= ? ORDER BY id LIMIT 1", what));
  // The first event at or after `id` (ids may have gaps): its id and time.
  auto eventAt = [&](int64_t id, int64_t& foundId, int64_t& foundTime) -> Status {
    at.reset();
    MOAT_TRY(at.bindAll(id));
    MOAT_ASSIGN(bool found, at.step());
    if (!found) return Error::make(Code::kStore, what + ": no event at or after " + std::to_string(id));
    foundId = at.integer(0);
    foundTime = at.integer(1);
    return {};
  };
  int64_t lo = bounds.integer(0), hi = bounds.integer(1), id = 0, time = 0;
  MOAT_TRY(eventAt(lo, id, time));
  if (time >= timeMs) return uint64_t{0};
  MOAT_TRY(eventAt(hi, id, time));
  if (time < timeMs) return static_cast<uint64_t>(hi);
  // lo is older than timeMs, hi is not.
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    MOAT_TRY(eventAt(mid, id, time));
    if (id >= hi) {
      hi = mid;  // nothing between mid and hi
    } else if (time < timeMs) {
      lo = id;
    } else {
      hi = id;
    }
  }
  return static_cast<uint64_t>(lo);
}

}  // namespace moat::store::sqlite
