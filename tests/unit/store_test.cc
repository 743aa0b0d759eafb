#include "store/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "os/file.h"
#include "store/sqlite/migrations.h"

namespace moat::store {
namespace {

const char kInjection[] = "x'); DROP TABLE environments; --";

EnvironmentRecord makeRecord(const std::string& id, int64_t createdAtMs,
                             EnvironmentState state = EnvironmentState::kRunning) {
  EnvironmentRecord record;
  record.id = id;
  record.taskId = "task-1";
  record.templateName = "python";
  record.cpus = 1.5;
  record.ramMb = 512;
  record.storageGb = 2.25;
  record.pids = 64;
  record.state = state;
  record.createdAtMs = createdAtMs;
  record.expiresAtMs = createdAtMs + 60000;
  record.owner = "master";
  return record;
}

std::vector<std::string> ids(const std::vector<EnvironmentRecord>& records) {
  std::vector<std::string> out;
  for (const auto& record : records) out.push_back(record.id);
  return out;
}

// A second, raw connection to the same file: what the store wrote, as SQLite
// sees it, without going through the code under test.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  }
  ~RawDb() { sqlite3_close_v2(db_); }

  // First column of the first row as text ("" when there is no row).
  std::string query(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    std::string out;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db_);
    if (sqlite3_step(stmt) == SQLITE_ROW) {
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
      if (text != nullptr) out = text;
    }
    sqlite3_finalize(stmt);
    return out;
  }
  void exec(const std::string& sql) {
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
        << sql << ": " << sqlite3_errmsg(db_);
  }

 private:
  sqlite3* db_ = nullptr;
};

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-store-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/moat.db";
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) {
      EXPECT_TRUE(os::removeTree(dir_).ok());
    }
  }

  Store& open() {
    auto store = openSqliteStore(path_);
    if (!store.ok()) {
      // Ends this test (GoogleTest reports the exception) and not the others.
      throw std::runtime_error("open " + path_ + ": " + store.error().message());
    }
    store_ = std::move(store.value());
    return *store_;
  }

  void insert(const EnvironmentRecord& record) {
    Status status = store_->insertEnvironment(record);
    ASSERT_TRUE(status.ok()) << status.error().message();
  }

  std::vector<std::string> list(const EnvironmentFilter& filter) {
    auto records = store_->listEnvironments(filter);
    EXPECT_TRUE(records.ok()) << records.error().message();
    return records.ok() ? ids(records.value()) : std::vector<std::string>{};
  }

  std::string dir_;
  std::string path_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, InsertThenGetReturnsEveryField) {
  Store& store = open();
  EnvironmentRecord record;
  record.id = "0123456789ab";
  record.taskId = "task \"quoted\" 'single'";
  record.templateName = "python-3.12";
  record.cpus = 0.25;
  record.ramMb = 18446744073709551615ull;  // above INT64_MAX: stored as its bit pattern
  record.storageGb = 10.5;
  record.pids = 4096;
  record.labels = {{"team", "ünïcødé ✓ 日本"},
                   {"quote\"key", "va'lue \"with\" \\ backslash"},
                   {"newline", "a\nb\tc"},
                   {"empty", ""}};
  record.state = EnvironmentState::kCreating;
  record.reason = "because";
  record.createdAtMs = 1700000000123;
  record.expiresAtMs = -1;
  record.owner = "key_abc";
  insert(record);

  auto got = store.getEnvironment(record.id);
  ASSERT_TRUE(got.ok()) << got.error().message();
  ASSERT_TRUE(got.value().has_value());
  const EnvironmentRecord& back = *got.value();
  EXPECT_EQ(back.id, record.id);
  EXPECT_EQ(back.taskId, record.taskId);
  EXPECT_EQ(back.templateName, record.templateName);
  EXPECT_DOUBLE_EQ(back.cpus, record.cpus);
  EXPECT_EQ(back.ramMb, record.ramMb);
  EXPECT_DOUBLE_EQ(back.storageGb, record.storageGb);
  EXPECT_EQ(back.pids, record.pids);
  EXPECT_EQ(back.labels, record.labels);
  EXPECT_EQ(back.state, record.state);
  EXPECT_EQ(back.reason, record.reason);
  EXPECT_EQ(back.createdAtMs, record.createdAtMs);
  EXPECT_EQ(back.expiresAtMs, record.expiresAtMs);
  EXPECT_EQ(back.owner, record.owner);

  // The labels column is a JSON object, readable by other tools.
  RawDb raw(path_);
  EXPECT_EQ(raw.query("SELECT json_type(labels) FROM environments"), "object");
  EXPECT_EQ(raw.query("SELECT json_extract(labels, '$.team') FROM environments"), "ünïcødé ✓ 日本");
}

TEST_F(StoreTest, GetUnknownIdIsEmpty) {
  Store& store = open();
  insert(makeRecord("aaaaaaaaaaaa", 1));
  auto got = store.getEnvironment("bbbbbbbbbbbb");
  ASSERT_TRUE(got.ok()) << got.error().message();
  EXPECT_FALSE(got.value().has_value());
}

TEST_F(StoreTest, DuplicateIdIsConflict) {
  Store& store = open();
  insert(makeRecord("abc", 1));
  EnvironmentRecord again = makeRecord("abc", 2);
  again.taskId = "other";
  Status status = store.insertEnvironment(again);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, Code::kConflict);
  EXPECT_NE(status.error().context.find("insert environment abc"), std::string::npos) << status.error().context;
  EXPECT_NE(status.error().context.find("UNIQUE constraint failed"), std::string::npos) << status.error().context;
  // The first record is untouched.
  auto got = store.getEnvironment("abc");
  ASSERT_TRUE(got.ok() && got.value().has_value());
  EXPECT_EQ(got.value()->taskId, "task-1");
}

// The code cannot name a state that does not exist (EnvironmentState); the
// table refuses one written by hand, and a row that has one anyway (a newer
// moatd's) is an error naming it, not a record in some other state.
TEST_F(StoreTest, UnknownStateIsRejected) {
  Store& store = open();
  insert(makeRecord("def", 1));
  RawDb raw(path_);
  EXPECT_NE(raw.query("SELECT sql FROM sqlite_master WHERE name = 'environments'").find("CHECK"), std::string::npos);
  raw.exec("PRAGMA ignore_check_constraints = ON");
  raw.exec("UPDATE environments SET state = 'sleeping' WHERE id = 'def'");
  auto got = store.getEnvironment("def");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, Code::kCorrupt);
  EXPECT_NE(got.error().context.find("sleeping"), std::string::npos) << got.error().context;
}

// Snapshots alike: a state written by hand past the table's check (or by a
// newer moatd) is an error naming it, never read as another state (which
// a restart would roll back).
TEST_F(StoreTest, ASnapshotStateNoMoatdKnowsIsAnErrorNamingIt) {
  Store& store = open();
  insert(makeRecord("abc", 1));
  SnapshotRecord snap;
  snap.id = "snap-000000000001";
  snap.environment = "abc";
  snap.owner = "master";
  snap.templateName = "host";
  snap.state = SnapshotState::kTransient;
  ASSERT_TRUE(store.insertSnapshot(snap).ok());
  auto back = store.getSnapshot(snap.id);
  ASSERT_TRUE(back.ok() && back.value());
  EXPECT_EQ(back.value()->state, SnapshotState::kTransient);
  ASSERT_TRUE(store.setSnapshotState(snap.id, SnapshotState::kReady, 7).ok());
  EXPECT_EQ(store.getSnapshot(snap.id).value()->state, SnapshotState::kReady);
  RawDb raw(path_);
  EXPECT_EQ(raw.query("SELECT state FROM snapshots"), "ready");
  raw.exec("PRAGMA ignore_check_constraints = ON");
  raw.exec("UPDATE snapshots SET state = 'archived'");
  auto got = store.getSnapshot(snap.id);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, Code::kCorrupt);
  EXPECT_NE(got.error().context.find("archived"), std::string::npos) << got.error().context;
  EXPECT_FALSE(store.listSnapshots("", "").ok());
}

// Approvals alike: stored by name, filtered by state, and a name no moatd
// knows is an error naming it (never taken for a pending or granted one).
TEST_F(StoreTest, AnApprovalStateNoMoatdKnowsIsAnErrorNamingIt) {
  Store& store = open();
  ApprovalRecord a;
  a.id = "aaaaaaaaaaaa";
  a.environment = "abc";
  a.scope = "run_command";
  a.action = "{}";
  a.requester = "master";
  ASSERT_TRUE(store.insertApproval(a).ok());
  a.id = "bbbbbbbbbbbb";
  a.state = ApprovalState::kDenied;
  ASSERT_TRUE(store.insertApproval(a).ok());
  auto denied = store.listApprovals({.state = ApprovalState::kDenied});
  ASSERT_TRUE(denied.ok());
  ASSERT_EQ(denied->size(), 1u);
  EXPECT_EQ(denied->at(0).id, "bbbbbbbbbbbb");
  EXPECT_EQ(store.listApprovals({}).value().size(), 2u);
  RawDb raw(path_);
  EXPECT_EQ(raw.query("SELECT state FROM approvals WHERE id = 'bbbbbbbbbbbb'"), "denied");
  raw.exec("PRAGMA ignore_check_constraints = ON");
  raw.exec("UPDATE approvals SET state = 'granted' WHERE id = 'aaaaaaaaaaaa'");
  auto got = store.getApproval("aaaaaaaaaaaa");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, Code::kCorrupt);
  EXPECT_NE(got.error().context.find("granted"), std::string::npos) << got.error().context;
  EXPECT_FALSE(store.listApprovals({}).ok());
}

TEST_F(StoreTest, LabelsThatAreNotUtf8AreRejected) {
  Store& store = open();
  EnvironmentRecord record = makeRecord("abc", 1);
  record.labels = {{"k", std::string("\xff\xfe", 2)}};
  Status status = store.insertEnvironment(record);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, Code::kInvalidArgument) << status.error().context;
  EXPECT_FALSE(store.getEnvironment("abc").value().has_value());
}

TEST_F(StoreTest, ListFiltersAndOrdersNewestFirst) {
  open();
  auto a = makeRecord("a", 100);
  a.labels = {{"team", "x"}, {"env", "prod"}};
  auto b = makeRecord("b", 300);
  b.taskId = "task-2";
  b.labels = {{"team", "x"}};
  auto c = makeRecord("c", 200, EnvironmentState::kCreating);
  c.owner = "key_1";
  c.labels = {{"team", "y"}, {"env", "prod"}};
  auto d = makeRecord("d", 200, EnvironmentState::kFailed);  // same time as c: id breaks the tie
  d.labels = {{"team", "x"}, {"env", "prod"}, {"extra", "1"}};
  for (const auto& record : {a, b, c, d}) insert(record);

  EXPECT_EQ(list({}), (std::vector<std::string>{"b", "c", "d", "a"}));
  EXPECT_EQ(list({.taskId = "task-1"}), (std::vector<std::string>{"c", "d", "a"}));
  EXPECT_EQ(list({.taskId = "task-2"}), (std::vector<std::string>{"b"}));
  EXPECT_EQ(list({.taskId = "nope"}), (std::vector<std::string>{}));
  EXPECT_EQ(list({.state = EnvironmentState::kFailed}), (std::vector<std::string>{"d"}));
  EXPECT_EQ(list({.state = EnvironmentState::kRunning}), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(list({.owner = "key_1"}), (std::vector<std::string>{"c"}));
  EXPECT_EQ(list({.owner = "master"}), (std::vector<std::string>{"b", "d", "a"}));
  // Every label asked for must match; the record may have more.
  EXPECT_EQ(list({.labels = {{"team", "x"}}}), (std::vector<std::string>{"b", "d", "a"}));
  EXPECT_EQ(list({.labels = {{"team", "x"}, {"env", "prod"}}}), (std::vector<std::string>{"d", "a"}));
  EXPECT_EQ(list({.labels = {{"env", "prod"}, {"missing", ""}}}), (std::vector<std::string>{}));
  // Filters combine.
  EXPECT_EQ(
      list({.taskId = "task-1", .state = EnvironmentState::kRunning, .labels = {{"env", "prod"}}, .owner = "master"}),
      (std::vector<std::string>{"a"}));
}

TEST_F(StoreTest, DefaultFilterHidesGone) {
  Store& store = open();
  insert(makeRecord("live", 1));
  insert(makeRecord("dead", 2, EnvironmentState::kGone));
  insert(makeRecord("broke", 3, EnvironmentState::kFailed));
  EXPECT_EQ(list({}), (std::vector<std::string>{"broke", "live"}));
  EXPECT_EQ(list({.state = EnvironmentState::kGone}), (std::vector<std::string>{"dead"}));
  ASSERT_TRUE(store.setState("live", EnvironmentState::kGone, "destroyed").ok());
  EXPECT_EQ(list({}), (std::vector<std::string>{"broke"}));
}

TEST_F(StoreTest, SetStateAndExpiryUpdateTheRecord) {
  Store& store = open();
  insert(makeRecord("abc", 1, EnvironmentState::kCreating));
  Status status = store.setState("abc", EnvironmentState::kFailed, "template missing");
  ASSERT_TRUE(status.ok()) << status.error().message();
  status = store.setExpiry("abc", 987654321, 77);
  ASSERT_TRUE(status.ok()) << status.error().message();
  auto got = store.getEnvironment("abc");
  ASSERT_TRUE(got.ok() && got.value().has_value());
  EXPECT_EQ(got.value()->state, EnvironmentState::kFailed);
  EXPECT_EQ(got.value()->reason, "template missing");
  EXPECT_EQ(got.value()->expiresAtMs, 987654321);
  EXPECT_EQ(got.value()->ttlS, 77);
  EXPECT_EQ(got.value()->taskId, "task-1");  // the rest is untouched
}

// Where a paused environment's memory is: each of the three, read back,
// the last one set replacing the one before (docs/PAUSE.md, "To disk").
TEST_F(StoreTest, PausedMemoryIsReadBackAsSet) {
  Store& store = open();
  insert(makeRecord("abc", 1));
  auto where = [&] {
    auto got = store.getEnvironment("abc");
    EXPECT_TRUE(got.ok() && got.value().has_value());
    return std::pair{got.value()->pausedToDisk, got.value()->backToDisk};
  };
  EXPECT_EQ(where(), std::pair(false, false));
  ASSERT_TRUE(store.setPausedMemory("abc", PausedMemory::kDisk).ok());
  EXPECT_EQ(where(), std::pair(true, false));
  ASSERT_TRUE(store.setPausedMemory("abc", PausedMemory::kRamUntilIdle).ok());
  EXPECT_EQ(where(), std::pair(false, true));
  ASSERT_TRUE(store.setPausedMemory("abc", PausedMemory::kDisk).ok());
  EXPECT_EQ(where(), std::pair(true, false)) << "on disk again: nothing to send back";
  ASSERT_TRUE(store.setPausedMemory("abc", PausedMemory::kRam).ok());
  EXPECT_EQ(where(), std::pair(false, false));
  // A pause's start or end is in RAM: nothing left to send back to disk.
  ASSERT_TRUE(store.setPausedMemory("abc", PausedMemory::kRamUntilIdle).ok());
  ASSERT_TRUE(store.setPause("abc", EnvironmentState::kRunning, 0, 5).ok());
  EXPECT_EQ(where(), std::pair(false, false));
  ASSERT_TRUE(store.setPausedMemory("abc", PausedMemory::kDisk).ok());
  ASSERT_TRUE(store.setPause("abc", EnvironmentState::kPaused, 7, 5).ok());
  EXPECT_EQ(where(), std::pair(false, false));
  EXPECT_EQ(store.setPausedMemory("nope", PausedMemory::kDisk).error().code, Code::kNotFound);
}

TEST_F(StoreTest, SetStateAndExpiryOfUnknownIdAreNotFound) {
  Store& store = open();
  insert(makeRecord("abc", 1));
  Status state = store.setState("nope", EnvironmentState::kGone, "destroyed");
  ASSERT_FALSE(state.ok());
  EXPECT_EQ(state.error().code, Code::kNotFound);
  EXPECT_NE(state.error().context.find("nope"), std::string::npos) << state.error().context;
  Status expiry = store.setExpiry("nope", 5, 1);
  ASSERT_FALSE(expiry.ok());
  EXPECT_EQ(expiry.error().code, Code::kNotFound);
  // The existing record was not touched by either.
  auto got = store.getEnvironment("abc");
  ASSERT_TRUE(got.ok() && got.value().has_value());
  EXPECT_EQ(got.value()->state, EnvironmentState::kRunning);
  EXPECT_EQ(got.value()->expiresAtMs, 60001);
}

// Statements are compiled once and reused (SqliteStore keeps up to 64).
// Each reuse must start clean: no bindings, no error, no read transaction
// left open by the caller before.
TEST_F(StoreTest, ReusedStatementsStartCleanEveryTime) {
  Store& store = open();
  insert(makeRecord("a", 1));
  // A failed insert leaves its statement in error; the next one succeeds.
  Status duplicate = store.insertEnvironment(makeRecord("a", 2));
  ASSERT_FALSE(duplicate.ok());
  insert(makeRecord("b", 2));
  // A lookup reads one row and stops. Had its statement stayed active, this
  // connection would keep reading the snapshot from before the change below.
  auto before = store.getEnvironment("a");
  ASSERT_TRUE(before.ok() && before.value().has_value());
  EXPECT_EQ(before.value()->state, EnvironmentState::kRunning);
  RawDb raw(path_);
  raw.exec("UPDATE environments SET state = 'failed', reason = 'by hand' WHERE id = 'a'");
  auto after = store.getEnvironment("a");
  ASSERT_TRUE(after.ok() && after.value().has_value());
  EXPECT_EQ(after.value()->state, EnvironmentState::kFailed);
  EXPECT_EQ(after.value()->reason, "by hand");
  // Label filters of every size answer (they are matched after the query:
  // the SQL, and so the cached statement, is the same for all of them).
  auto many = makeRecord("many", 3);
  for (int i = 0; i < 80; ++i) many.labels["k" + std::to_string(i)] = "v";
  insert(many);
  std::map<std::string, std::string> wanted;
  for (int i = 0; i < 80; ++i) {
    wanted["k" + std::to_string(i)] = "v";
    ASSERT_EQ(list({.labels = wanted}), (std::vector<std::string>{"many"})) << i + 1 << " labels";
  }
  wanted["k80"] = "v";
  EXPECT_EQ(list({.labels = wanted}), (std::vector<std::string>{}));
  EXPECT_EQ(list({}), (std::vector<std::string>{"many", "b", "a"}));
}

TEST_F(StoreTest, LiveEnvironmentsExcludeGoneAndFailed) {
  Store& store = open();
  insert(makeRecord("creating", 1, EnvironmentState::kCreating));
  insert(makeRecord("running", 2, EnvironmentState::kRunning));
  insert(makeRecord("destroying", 3, EnvironmentState::kDestroying));
  insert(makeRecord("gone", 4, EnvironmentState::kGone));
  insert(makeRecord("failed", 5, EnvironmentState::kFailed));
  auto live = store.liveEnvironments();
  ASSERT_TRUE(live.ok()) << live.error().message();
  EXPECT_EQ(ids(live.value()), (std::vector<std::string>{"destroying", "running", "creating"}));
}

TEST_F(StoreTest, DataSurvivesReopening) {
  open();
  auto record = makeRecord("abc", 42);
  record.labels = {{"k", "v"}};
  record.onExpiry = store::ExpiryAction::kPause;
  record.ttlS = 90;
  insert(record);
  ASSERT_TRUE(store_->setState("abc", EnvironmentState::kDestroying, "shutting down").ok());
  store_.reset();

  Store& again = open();
  auto got = again.getEnvironment("abc");
  ASSERT_TRUE(got.ok()) << got.error().message();
  ASSERT_TRUE(got.value().has_value());
  EXPECT_EQ(got.value()->state, EnvironmentState::kDestroying);
  EXPECT_EQ(got.value()->reason, "shutting down");
  EXPECT_EQ(got.value()->labels, record.labels);
  EXPECT_EQ(got.value()->onExpiry, store::ExpiryAction::kPause);
  EXPECT_EQ(got.value()->ttlS, 90);
  // Reopening did not run the migrations again (they would fail on the
  // existing table) and left the version at the newest.
  RawDb raw(path_);
  EXPECT_EQ(raw.query("PRAGMA user_version"), std::to_string(sqlite::kSchemaVersion));
}

TEST_F(StoreTest, FileIsPrivate) {
  mode_t old = umask(0);  // SQLite on its own would create 0644 (0666 & ~umask)
  open();
  umask(old);
  insert(makeRecord("abc", 1));
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // The write-ahead log holds the same data; SQLite gives it the file's mode.
  std::string wal = path_ + "-wal";
  ASSERT_EQ(stat(wal.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(StoreTest, ExistingFileIsMadePrivate) {
  ASSERT_TRUE(os::writeFile(path_, "", 0644).ok());
  ASSERT_EQ(chmod(path_.c_str(), 0644), 0);
  open();
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(StoreTest, JournalIsWal) {
  open();
  RawDb raw(path_);
  EXPECT_EQ(raw.query("PRAGMA journal_mode"), "wal");
}

TEST_F(StoreTest, NewerSchemaIsRefused) {
  open();
  insert(makeRecord("abc", 1));
  store_.reset();
  const int future = sqlite::kSchemaVersion + 1;
  {
    RawDb raw(path_);
    raw.exec("PRAGMA user_version = " + std::to_string(future));
  }
  auto store = openSqliteStore(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, Code::kUnsupported);
  const std::string& context = store.error().context;
  EXPECT_NE(context.find("schema version " + std::to_string(future)), std::string::npos) << context;
  EXPECT_NE(context.find(std::to_string(sqlite::kSchemaVersion)), std::string::npos) << context;
  // Refusing did not touch the database.
  RawDb raw(path_);
  EXPECT_EQ(raw.query("PRAGMA user_version"), std::to_string(future));
  EXPECT_EQ(raw.query("SELECT id FROM environments"), "abc");
}

TEST_F(StoreTest, NewDatabaseGetsEveryMigration) {
  open();
  RawDb raw(path_);
  EXPECT_EQ(raw.query("PRAGMA user_version"), std::to_string(sqlite::kSchemaVersion));
  EXPECT_EQ(raw.query("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN"
                      " ('environments_state', 'environments_task_id', 'environments_owner')"),
            "3");
  EXPECT_EQ(raw.query("PRAGMA foreign_keys"), "0");  // per connection: ours sets it, this one not
}

TEST_F(StoreTest, NotADatabaseIsAnError) {
  ASSERT_TRUE(os::writeFile(path_, std::string(4096, 'z'), 0600).ok());
  auto store = openSqliteStore(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, Code::kStore);
  EXPECT_NE(store.error().context.find(path_), std::string::npos) << store.error().context;
}

TEST_F(StoreTest, InjectionLookingValuesAreStoredVerbatim) {
  Store& store = open();
  EnvironmentRecord record = makeRecord(kInjection, 1);
  record.taskId = kInjection;
  record.owner = kInjection;
  record.reason = kInjection;
  record.labels = {{kInjection, kInjection}};
  insert(record);

  auto got = store.getEnvironment(kInjection);
  ASSERT_TRUE(got.ok()) << got.error().message();
  ASSERT_TRUE(got.value().has_value());
  EXPECT_EQ(got.value()->id, kInjection);
  EXPECT_EQ(got.value()->taskId, kInjection);
  EXPECT_EQ(got.value()->labels, record.labels);
  EXPECT_EQ(list({.taskId = kInjection, .labels = {{kInjection, kInjection}}, .owner = kInjection}),
            (std::vector<std::string>{kInjection}));
  ASSERT_TRUE(store.setState(kInjection, EnvironmentState::kGone, kInjection).ok());
  ASSERT_TRUE(store.setExpiry(kInjection, 7, 1).ok());

  // The table is still there, with the row, and takes more.
  insert(makeRecord("after", 2));
  RawDb raw(path_);
  EXPECT_EQ(raw.query("SELECT count(*) FROM sqlite_master WHERE name = 'environments'"), "1");
  EXPECT_EQ(raw.query("SELECT count(*) FROM environments"), "2");
}

TEST_F(StoreTest, ConcurrentInsertsAndListsFromEightThreads) {
  Store& store = open();
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto record = makeRecord("t" + std::to_string(t) + "-" + std::to_string(i), i);
        record.taskId = "thread-" + std::to_string(t);
        if (!store.insertEnvironment(record).ok()) ++failures;
        auto mine = store.listEnvironments({.taskId = record.taskId});
        // Only this thread writes this task: it sees exactly its own rows.
        if (!mine.ok() || mine.value().size() != static_cast<size_t>(i + 1)) ++failures;
        if (!store.liveEnvironments().ok()) ++failures;
        auto got = store.getEnvironment(record.id);
        if (!got.ok() || !got.value().has_value()) ++failures;
        // Errors keep their own code while other threads succeed: the code
        // is read from the connection after the failing call.
        Status duplicate = store.insertEnvironment(record);
        if (duplicate.ok() || duplicate.error().code != Code::kConflict) ++failures;
        Status unknown = store.setExpiry("missing-" + record.id, 1, 1);
        if (unknown.ok() || unknown.error().code != Code::kNotFound) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);

  auto all = store.listEnvironments({});
  ASSERT_TRUE(all.ok()) << all.error().message();
  ASSERT_EQ(all.value().size(), static_cast<size_t>(kThreads * kPerThread));
  std::set<std::string> unique;
  for (const auto& record : all.value()) unique.insert(record.id);
  EXPECT_EQ(unique.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_TRUE(unique.count("t7-49"));
}

}  // namespace
}  // namespace moat::store
