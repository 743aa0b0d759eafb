// The audit log against a real SQLite file: the hash chain, what verify
// finds when rows are edited, deleted or moved, pruning with checkpoints.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "audit/chain.h"
#include "audit/log.h"
#include "os/file.h"
#include "store/store.h"

namespace moat::audit {
namespace {

using json = nlohmann::json;

// A raw connection to the same file: the tampering an attacker with write
// access to moat.db could do.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    sqlite3_busy_timeout(db_, 5000);
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  int exec(const std::string& sql) { return sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr); }
  void mustExec(const std::string& sql) { ASSERT_EQ(exec(sql), SQLITE_OK) << sql << ": " << sqlite3_errmsg(db_); }
  std::string error() const { return sqlite3_errmsg(db_); }

 private:
  sqlite3* db_ = nullptr;
};

class AuditLog : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-audit-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/moat.db";
    auto store = store::openSqliteStore(path_);
    if (!store.ok()) throw std::runtime_error(store.error().message());
    store_ = std::move(store.value());
  }
  void TearDown() override {
    log_.reset();
    store_.reset();
    EXPECT_TRUE(os::removeTree(dir_).ok());
  }

  Log& open(LogOptions options = {}) {
    if (!options.clock) options.clock = [this] { return clockMs_.load(); };
    auto log = Log::open(*store_, std::move(options));
    if (!log.ok()) throw std::runtime_error(log.error().message());
    log_ = std::move(log.value());
    return *log_;
  }

  // n events "test.N" (N from `from`), all in the store afterwards.
  void recordN(int n, int from = 1) {
    for (int i = from; i < from + n; ++i) {
      log_->record("test." + std::to_string(i), "env" + std::to_string(i % 3), "master",
                   {{"i", i}, {"text", "event " + std::to_string(i)}});
    }
    Status s = log_->flush();
    ASSERT_TRUE(s.ok()) << s.error().message();
  }

  VerifyResult verify() {
    auto r = log_->verify();
    if (!r.ok()) throw std::runtime_error(r.error().message());
    return r.value();
  }

  std::vector<Event> all() {
    store::EventQuery q;
    q.limit = 100000;
    auto events = log_->read(q);
    if (!events.ok()) throw std::runtime_error(events.error().message());
    return events.value();
  }

  std::string dir_;
  std::string path_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<Log> log_;
  std::atomic<int64_t> clockMs_{1700000000000};
};

TEST(AuditChain, TheHashIsSha256OfTheDocumentedCanonicalForm) {
  // Computed independently (Python: json.dumps(sort_keys=True,
  // separators=(",", ":"), ensure_ascii=False), then SHA-256), as a third
  // party checking an export would.
  json data = {{"size", 5}, {"path", "/workspace/\xc3\xbc \"q\"\n\x01"}, {"a", {1, true, nullptr}}};
  std::string prev(64, ' ');
  for (size_t i = 0; i < 64; i += 2) prev.replace(i, 2, "ab");
  EXPECT_EQ(canonicalEvent(7, 1700000000123, "file.written", "0123456789ab", "master", canonicalData(data), prev),
            "[7,1700000000123,\"file.written\",\"0123456789ab\",\"master\","
            "{\"a\":[1,true,null],\"path\":\"/workspace/\xc3\xbc \\\"q\\\"\\n\\u0001\",\"size\":5},\"" +
                prev + "\"]");
  Event e{7, 1700000000123, "file.written", "0123456789ab", "master", data, prev, ""};
  EXPECT_EQ(chainHash(e), "1a65b24a3734cdf57f56874205102ef60cde9f54d403f789ef29c5b32aafa4fc");
}

TEST(AuditChain, EveryFieldIsCovered) {
  Event base{3, 1000, "exec.ended", "abc", "master", {{"exit_code", 0}}, kGenesisHash, ""};
  const std::string h = chainHash(base);
  std::set<std::string> seen = {h};
  auto changed = [&](auto edit) {
    Event e = base;
    edit(e);
    return seen.insert(chainHash(e)).second;
  };
  EXPECT_TRUE(changed([](Event& e) { e.id = 4; }));
  EXPECT_TRUE(changed([](Event& e) { e.timeMs = 1001; }));
  EXPECT_TRUE(changed([](Event& e) { e.type = "exec.started"; }));
  EXPECT_TRUE(changed([](Event& e) { e.environment = "abd"; }));
  EXPECT_TRUE(changed([](Event& e) { e.actor = "0123456789ab"; }));
  EXPECT_TRUE(changed([](Event& e) { e.data["exit_code"] = 1; }));
  EXPECT_TRUE(changed([](Event& e) { e.prevHash = std::string(64, '1'); }));
  // Fields do not run into each other: moving text between them changes it.
  EXPECT_TRUE(changed([](Event& e) {
    e.type = "exec.endedabc";
    e.environment = "";
  }));
  EXPECT_EQ(chainHash(base), h) << "the same event hashes the same";
}

TEST(AuditChain, ControlCharactersAreEscapedAsPythonsJsonDoes) {
  std::string s;
  for (int c = 1; c < 32; ++c) s += static_cast<char>(c);
  s += "\x7f\\/";
  // json.dumps({"s": s}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
  EXPECT_EQ(canonicalData(json{{"s", s}}),
            "{\"s\":\"\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r"
            "\\u000e\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019"
            "\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f\x7f\\\\/\"}");
}

TEST(AuditChain, TextThatIsNotUtf8IsReplacedNotRefused) {
  json data = {{"path", std::string("/tmp/\xff\xfe")}};
  EXPECT_EQ(canonicalData(data), "{\"path\":\"/tmp/\xef\xbf\xbd\xef\xbf\xbd\"}");
}

TEST_F(AuditLog, EventsGetConsecutiveIdsAndAChainThatVerifies) {
  open();
  recordN(20);
  auto events = all();
  ASSERT_EQ(events.size(), 20u);
  std::string prev = kGenesisHash;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].id, i + 1);
    EXPECT_EQ(events[i].type, "test." + std::to_string(i + 1));
    EXPECT_EQ(events[i].actor, "master");
    EXPECT_EQ(events[i].data["i"], i + 1);
    EXPECT_EQ(events[i].prevHash, prev);
    EXPECT_EQ(events[i].hash, chainHash(events[i]));
    prev = events[i].hash;
  }
  VerifyResult r = verify();
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(r.checked, 20u);
  EXPECT_EQ(r.lastId, 20u);
  EXPECT_EQ(r.lastHash, prev);
}

TEST_F(AuditLog, ConcurrentRecordersGetEveryIdOnce) {
  open();
  constexpr int kThreads = 8, kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) log_->record("test.concurrent", "", std::to_string(t), {{"i", i}});
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(log_->flush().ok());
  auto events = all();
  ASSERT_EQ(events.size(), static_cast<size_t>(kThreads * kEach));
  // Each thread's events keep their order along the ids.
  std::vector<int> next(kThreads, 0);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].id, i + 1);
    int t = std::stoi(events[i].actor);
    EXPECT_EQ(events[i].data["i"], next[t]++);
  }
  EXPECT_TRUE(verify().ok);
}

TEST_F(AuditLog, TheStoreRefusesToEditARow) {
  open();
  recordN(3);
  RawDb raw(path_);
  EXPECT_NE(raw.exec("UPDATE events SET actor = 'someone' WHERE id = 2"), SQLITE_OK);
  EXPECT_NE(raw.error().find("append-only"), std::string::npos) << raw.error();
  EXPECT_TRUE(verify().ok);
}

TEST_F(AuditLog, AnEditedRowIsNamed) {
  open();
  recordN(10);
  {
    RawDb raw(path_);
    raw.mustExec("DROP TRIGGER events_append_only");  // what an attacker would do first
    raw.mustExec("UPDATE events SET data = '{\"i\":6,\"text\":\"nothing to see\"}' WHERE id = 6");
  }
  VerifyResult r = verify();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.firstBrokenId, 6u);
  EXPECT_NE(r.reason.find("edited"), std::string::npos) << r.reason;
  EXPECT_EQ(r.checked, 5u);
  EXPECT_EQ(r.lastId, 5u);
}

TEST_F(AuditLog, AnEditedTimeOrActorIsNamedToo) {
  open();
  recordN(5);
  {
    RawDb raw(path_);
    raw.mustExec("DROP TRIGGER events_append_only");
    raw.mustExec("UPDATE events SET actor = 'moatd' WHERE id = 4");
  }
  VerifyResult r = verify();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.firstBrokenId, 4u);
}

TEST_F(AuditLog, DataThatIsNoLongerJsonIsNamed) {
  open();
  recordN(5);
  {
    RawDb raw(path_);
    raw.mustExec("DROP TRIGGER events_append_only");
    raw.mustExec("UPDATE events SET data = 'not json' WHERE id = 2");
  }
  VerifyResult r = verify();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.firstBrokenId, 2u);
  EXPECT_NE(r.reason.find("not JSON"), std::string::npos) << r.reason;
}

TEST_F(AuditLog, ADeletedRowIsNamed) {
  open();
  recordN(10);
  RawDb(path_).mustExec("DELETE FROM events WHERE id = 7");
  VerifyResult r = verify();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.firstBrokenId, 7u);
  EXPECT_NE(r.reason.find("deleted"), std::string::npos) << r.reason;
  EXPECT_EQ(r.checked, 6u);
}

TEST_F(AuditLog, DeletedOldestRowsWithoutACheckpointAreNamed) {
  open();
  recordN(10);
  RawDb(path_).mustExec("DELETE FROM events WHERE id <= 3");
  VerifyResult r = verify();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.firstBrokenId, 4u);
  EXPECT_NE(r.reason.find("events 1 to 3 are missing"), std::string::npos) << r.reason;
}

TEST_F(AuditLog, ReorderedRowsAreNamed) {
  open();
  recordN(10);
  {
    // Swap events 4 and 6: each keeps its own hashes, only the place changes.
    RawDb raw(path_);
    raw.mustExec("CREATE TEMP TABLE moved AS SELECT * FROM events WHERE id IN (4, 6)");
    raw.mustExec("DELETE FROM events WHERE id IN (4, 6)");
    raw.mustExec(
        "INSERT INTO events SELECT 10 - id, time_ms, type, environment, actor, data, prev_hash, "
        "hash FROM moved");
  }
  VerifyResult r = verify();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.firstBrokenId, 4u);
}

TEST_F(AuditLog, AnEditWithARecomputedHashBreaksTheNextLink) {
  open();
  recordN(10);
  auto events = all();
  Event forged = events[4];  // id 5
  forged.data["text"] = "forged";
  forged.hash = chainHash(forged);
  {
    RawDb raw(path_);
    raw.mustExec("DROP TRIGGER events_append_only");
    raw.mustExec("UPDATE events SET data = '" + canonicalData(forged.data) + "', hash = '" + forged.hash +
                 "' WHERE id = 5");
  }
  VerifyResult r = verify();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.firstBrokenId, 6u);
  EXPECT_NE(r.reason.find("prev_hash mismatch"), std::string::npos) << r.reason;
}

TEST_F(AuditLog, PruningWritesACheckpointAndTheChainStillVerifies) {
  open();
  recordN(5);  // at 1700000000000
  clockMs_ = 1700000100000;
  recordN(5, 6);
  const std::string lastPrunedHash = all()[4].hash;
  auto pruned = log_->pruneBefore(1700000050000);
  ASSERT_TRUE(pruned.ok()) << pruned.error().message();
  EXPECT_EQ(pruned.value(), 5u);
  auto events = all();
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events.front().id, 6u);
  EXPECT_EQ(events.front().prevHash, lastPrunedHash);
  const Event& checkpoint = events.back();
  EXPECT_EQ(checkpoint.id, 11u);
  EXPECT_EQ(checkpoint.type, "audit.checkpoint");
  EXPECT_EQ(checkpoint.actor, "moatd");
  EXPECT_EQ(checkpoint.data["pruned_through"], 5);
  EXPECT_EQ(checkpoint.data["pruned_hash"], lastPrunedHash);
  EXPECT_EQ(checkpoint.data["pruned_count"], 5);
  VerifyResult r = verify();
  EXPECT_TRUE(r.ok) << r.firstBrokenId << ": " << r.reason;
  EXPECT_EQ(r.checked, 6u);
  EXPECT_EQ(r.lastId, 11u);

  // Again, through the first checkpoint: the newest one anchors the chain.
  clockMs_ = 1700000200000;
  recordN(2, 12);
  pruned = log_->pruneBefore(1700000150000);
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(pruned.value(), 6u);  // 6..11
  events = all();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events.front().id, 12u);
  r = verify();
  EXPECT_TRUE(r.ok) << r.firstBrokenId << ": " << r.reason;

  // Nothing old enough: nothing pruned, no checkpoint.
  EXPECT_EQ(log_->pruneBefore(1).value(), 0u);
  EXPECT_EQ(all().size(), 3u);
}

TEST_F(AuditLog, AForgedCheckpointDoesNotVerify) {
  open();
  recordN(5);
  clockMs_ += 100000;
  recordN(3, 6);
  ASSERT_TRUE(log_->pruneBefore(clockMs_ - 50000).ok());
  {
    RawDb raw(path_);
    raw.mustExec("DROP TRIGGER events_append_only");
    raw.mustExec("UPDATE events SET data = json_set(data, '$.pruned_hash', '" + std::string(64, 'f') +
                 "') WHERE type = 'audit.checkpoint'");
  }
  VerifyResult r = verify();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.firstBrokenId, 6u) << r.reason;  // it no longer links to what the checkpoint says
}

TEST_F(AuditLog, TheOldPrefixIsFoundAcrossGaps) {
  std::vector<store::EventRecord> rows;
  for (uint64_t id : {3, 4, 5, 7, 8, 12, 13}) {
    rows.push_back({id, static_cast<int64_t>(id * 100), "test", "", "", "{}", "", ""});
  }
  ASSERT_TRUE(store_->appendEvents(rows, 0).ok());
  auto before = [&](int64_t t) { return store_->lastEventBefore(t).value(); };
  EXPECT_EQ(before(0), 0u);
  EXPECT_EQ(before(300), 0u);
  EXPECT_EQ(before(301), 3u);
  EXPECT_EQ(before(600), 5u);
  EXPECT_EQ(before(701), 7u);
  EXPECT_EQ(before(1200), 8u);
  EXPECT_EQ(before(1201), 12u);
  EXPECT_EQ(before(1301), 13u);
  EXPECT_EQ(before(1LL << 60), 13u);
}

TEST_F(AuditLog, RetentionPrunesOnItsOwn) {
  LogOptions options;
  options.retentionDays = 1;
  options.pruneEvery = std::chrono::milliseconds(5);
  open(options);
  recordN(4);
  EXPECT_EQ(all().size(), 4u) << "not old enough yet";
  clockMs_ += 2 * 24 * 3600 * 1000LL;  // two days later
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<Event> events;
  do {
    events = all();
  } while (events.front().id == 1 && std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, 5u);
  EXPECT_EQ(events[0].type, "audit.checkpoint");
  EXPECT_EQ(events[0].data["pruned_through"], 4);
  EXPECT_TRUE(verify().ok);
}

// Events arrive faster than retention removes them: past maxEvents the
// oldest go, down to nine tenths, with a checkpoint that says why; a
// reopened log knows how many are stored. (Which ids go depends on how the
// writer batches them, so the test checks what must hold for any.)
TEST_F(AuditLog, BeyondMaxEventsTheOldestArePruned) {
  LogOptions options;
  options.maxEvents = 10;
  open(options);
  // The events once the writer has pruned past `after` (it prunes after
  // writing a batch; flush() does not wait for that).
  auto prunedAfter = [&](uint64_t after) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      auto events = all();
      if (events.back().type == "audit.checkpoint" && events.back().id > after &&
          events.back().data.contains("max_events")) {
        return events;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "no prune after event " << after;
        return events;
      }
    }
  };
  auto checkPruned = [&](const std::vector<Event>& events) {
    EXPECT_LE(events.size(), 10u);
    const Event& checkpoint = events.back();
    EXPECT_EQ(checkpoint.data["max_events"], 10);
    EXPECT_FALSE(checkpoint.data.contains("before_ms"));
    EXPECT_EQ(checkpoint.data["pruned_through"].get<uint64_t>() + 1, events.front().id);
    EXPECT_TRUE(verify().ok);
  };
  recordN(25);
  auto events = prunedAfter(25);
  checkPruned(events);
  EXPECT_EQ(events.back().data["pruned_count"], events.front().id - 1);

  log_.reset();
  open(options);
  const uint64_t last = events.back().id;
  const uint64_t firstBefore = events.front().id;
  recordN(static_cast<int>(11 - events.size()), 100);  // eleven stored: one too many
  events = prunedAfter(last);
  checkPruned(events);
  EXPECT_EQ(events.back().data["pruned_count"], events.front().id - firstBefore)
      << "the reopened log counted from the first stored event";
}

TEST_F(AuditLog, WithoutACapNothingIsPrunedForSize) {
  LogOptions options;
  options.maxEvents = 0;
  options.retentionDays = 0;
  open(options);
  recordN(40);
  ASSERT_TRUE(log_->flush().ok());
  auto events = all();
  ASSERT_EQ(events.size(), 40u);
  EXPECT_EQ(events.front().id, 1u);
}

TEST_F(AuditLog, AReopenedLogContinuesTheChain) {
  open();
  recordN(3);
  log_.reset();  // flushes
  open();
  recordN(3, 4);
  auto events = all();
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[3].id, 4u);
  EXPECT_EQ(events[3].prevHash, events[2].hash);
  EXPECT_TRUE(verify().ok);
}

TEST_F(AuditLog, DestroyingTheLogWritesWhatIsQueued) {
  open();
  for (int i = 0; i < 1000; ++i) log_->record("test.queued", "", "moatd", {{"i", i}});
  log_.reset();
  open();
  EXPECT_EQ(all().size(), 1000u);
  EXPECT_TRUE(verify().ok);
}

TEST_F(AuditLog, WaitersWakeOnNewEventsAndOnInterrupt) {
  open();
  recordN(1);
  uint64_t seen = log_->committedId();
  EXPECT_EQ(seen, 1u);
  std::atomic<uint64_t> woke{0};
  std::thread waiter(
      [&] { woke = log_->waitForNewer(seen, std::chrono::steady_clock::now() + std::chrono::seconds(30)); });
  log_->record("test.wake", "", "master", json::object());
  waiter.join();
  EXPECT_EQ(woke.load(), 2u);

  auto started = std::chrono::steady_clock::now();
  std::thread interrupted([&] { log_->waitForNewer(2, std::chrono::steady_clock::now() + std::chrono::seconds(30)); });
  log_->interrupt();
  interrupted.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  EXPECT_TRUE(log_->interrupted());
}

TEST_F(AuditLog, ReadFiltersByEnvironmentTypeAndOwner) {
  store::EnvironmentRecord mine;
  mine.id = "aaaaaaaaaaaa";
  mine.state = store::EnvironmentState::kRunning;
  mine.owner = "key1";
  ASSERT_TRUE(store_->insertEnvironment(mine).ok());
  open();
  log_->record("exec.started", "aaaaaaaaaaaa", "key1", json::object());
  log_->record("exec.ended", "bbbbbbbbbbbb", "master", json::object());
  log_->record("file.written", "aaaaaaaaaaaa", "master", json::object());
  log_->record("exec.ended", "aaaaaaaaaaaa", "key1", json::object());
  log_->record("auth.failed", "", "anonymous", json::object());
  ASSERT_TRUE(log_->flush().ok());
  auto ids = [&](store::EventQuery q) {
    std::vector<uint64_t> out;
    auto events = log_->read(q);
    if (!events.ok()) throw std::runtime_error(events.error().message());
    for (const auto& e : events.value()) out.push_back(e.id);
    return out;
  };
  store::EventQuery q;
  q.environment = "aaaaaaaaaaaa";
  EXPECT_EQ(ids(q), (std::vector<uint64_t>{1, 3, 4}));
  q = {};
  q.typePrefix = "exec.";
  EXPECT_EQ(ids(q), (std::vector<uint64_t>{1, 2, 4}));
  q.typePrefix = "exec.ended";
  EXPECT_EQ(ids(q), (std::vector<uint64_t>{2, 4}));
  q.typePrefix = "x%";  // no LIKE patterns
  EXPECT_TRUE(ids(q).empty());
  q = {};
  q.owner = "key1";
  EXPECT_EQ(ids(q), (std::vector<uint64_t>{1, 3, 4}));
  q.afterId = 3;
  EXPECT_EQ(ids(q), (std::vector<uint64_t>{4}));
  q = {};
  q.limit = 2;
  q.afterId = 1;
  EXPECT_EQ(ids(q), (std::vector<uint64_t>{2, 3}));
}

}  // namespace
}  // namespace moat::audit
