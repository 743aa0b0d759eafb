// The environment manager against a recording fake backend (real moat-init
// processes, no namespaces) and a real SQLite store: lifecycle, expiry,
// warm pools, restarts and snapshots, without root.
#include "manager/environment_manager.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <functional>
#include <thread>

#include "fake_backend.h"
#include "os/file.h"

namespace moat::manager {
namespace {

// What the manager recorded, for the assertions.
class Events final : public audit::Recorder {
 public:
  struct Event {
    std::string type, environment;
    nlohmann::json data;
  };
  void record(const std::string& type, const std::string& environment, const std::string&,
              nlohmann::json data) override {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back({type, environment, std::move(data)});
  }
  std::optional<Event> find(const std::string& type, const std::string& environment) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& e : events_) {
      if (e.type == type && e.environment == environment) return e;
    }
    return std::nullopt;
  }

 private:
  std::mutex mutex_;
  std::vector<Event> events_;
};

bool waitFor(const std::function<bool()>& done, std::chrono::seconds limit = std::chrono::seconds(15)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/moat-manager-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    auto store = store::openSqliteStore(dir_ + "/moat.db");
    ASSERT_TRUE(store.ok()) << store.error().message();
    store_ = std::move(store.value());
  }
  void TearDown() override { (void)os::removeTree(dir_); }

  // A manager as moatd makes one, its programs not judged (as with the
  // default permissions).
  std::unique_ptr<EnvironmentManager> start(ManagerConfig config = {}) {
    config.stateDir = dir_;
    config.maxTotalMemoryMb = config.maxTotalMemoryMb ? config.maxTotalMemoryMb : 64 * 1024;
    auto m = std::make_unique<EnvironmentManager>(config, *store_, backend_, &events_);
    m->setExecGate([](const std::string&, const init::ExecCheck&, InitConnection::ExecAnswer answer) { answer(false); },
                   [](const std::string&) { return init::ExecPolicy{}; }, nullptr);
    return m;
  }

  // Runs argv in the environment (from /: the fake's environments see the
  // host's files) and returns its output, or why not.
  static std::string run(EnvironmentManager& m, const std::string& id, std::vector<std::string> argv) {
    ExecRequest request;
    request.argv = std::move(argv);
    request.cwd = "/";
    auto r = m.exec(id, request, {});
    if (!r.ok()) return "error: " + r.error().message();
    if (!r->started) return "not started: " + r->spawnStage;
    return r->out + (r->exitCode ? " exit " + std::to_string(r->exitCode) : "");
  }

  std::string state(EnvironmentManager& m, const std::string& id) {
    auto r = m.get(id);
    return r.ok() ? std::string(stateName(r->state)) : "error: " + r.error().message();
  }

  std::string dir_;
  std::unique_ptr<store::Store> store_;
  Events events_;
  test::FakeBackend backend_;  // after the store: the managers of a test go first
};

TEST_F(ManagerTest, CreateRunsAnEnvironmentInTheBackendAndDestroyEndsIt) {
  auto m = start();
  auto created = m->create(CreateRequest{});
  ASSERT_TRUE(created.ok()) << created.error().message();
  const std::string id = created->id;
  EXPECT_EQ(created->state, store::EnvironmentState::kRunning);
  auto creates = backend_.calls("create");
  ASSERT_EQ(creates.size(), 1u);
  EXPECT_EQ(creates[0].spec.id, id);
  EXPECT_EQ(creates[0].spec.memoryMb, 1024u);  // the defaults, resolved before the backend sees them
  EXPECT_EQ(creates[0].spec.cpus, 1);
  EXPECT_EQ(creates[0].spec.pids, 1024u);
  EXPECT_TRUE(creates[0].spec.fromSnapshot.empty());
  EXPECT_TRUE(backend_.runs(id));
  EXPECT_EQ(run(*m, id, {"/bin/sh", "-c", "echo hello"}), "hello\n");

  ASSERT_TRUE(m->destroy(id, "destroyed", "master").ok());
  EXPECT_FALSE(backend_.runs(id));
  EXPECT_EQ(state(*m, id), "gone");
  auto event = events_.find("environment.destroyed", id);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->data["reason"], "destroyed");
  EXPECT_TRUE(m->destroy(id, "destroyed", "master").ok());  // idempotent
  EXPECT_EQ(run(*m, id, {"/bin/true"}).rfind("error: ", 0), 0u);
}

TEST_F(ManagerTest, ACreateTheBackendRefusesLeavesNothingRunningOrReserved) {
  ManagerConfig config;
  config.maxTotalMemoryMb = 1024;  // room for one environment of the default size
  auto m = start(config);
  backend_.failNextCreate(Code::kInternal, "the host is out of loop devices");
  auto failed = m->create(CreateRequest{});
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message().find("out of loop devices"), std::string::npos) << failed.error().message();
  // What the backend may have made of it is removed.
  auto creates = backend_.calls("create");
  ASSERT_EQ(creates.size(), 1u);
  bool cleaned = false;
  for (const auto& c : backend_.calls("destroy")) cleaned = cleaned || c.id == creates[0].spec.id;
  EXPECT_TRUE(cleaned);
  EXPECT_EQ(state(*m, creates[0].spec.id), "failed");
  // Its memory was given back: the one environment that fits still can be made.
  auto next = m->create(CreateRequest{});
  ASSERT_TRUE(next.ok()) << next.error().message();
  auto over = m->create(CreateRequest{});
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, Code::kCapacity);
}

TEST_F(ManagerTest, TheReaperDestroysAnEnvironmentWhoseTtlPassed) {
  auto m = start();
  CreateRequest request;
  request.ttlS = 1;
  auto created = m->create(request);
  ASSERT_TRUE(created.ok()) << created.error().message();
  const std::string id = created->id;
  auto kept = m->create(CreateRequest{});  // the default ttl: an hour
  ASSERT_TRUE(kept.ok());
  ASSERT_TRUE(waitFor([&] { return state(*m, id) == "gone"; })) << state(*m, id);
  auto gone = m->get(id);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->reason, "expired");
  EXPECT_FALSE(backend_.runs(id));
  auto event = events_.find("environment.destroyed", id);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->data["reason"], "expired");
  EXPECT_EQ(state(*m, kept->id), "running");
  EXPECT_TRUE(backend_.runs(kept->id));
}

// A create that asked to be paused at its expiry, on a backend that cannot
// pause (this one): its time is up all the same, so it is destroyed, and the
// reason says the pause failed and why.
TEST_F(ManagerTest, AnEnvironmentWhosePauseAtExpiryFailsIsDestroyedSayingWhy) {
  auto m = start();
  CreateRequest request;
  request.ttlS = 1;
  request.onExpiry = store::ExpiryAction::kPause;
  auto created = m->create(request);
  ASSERT_TRUE(created.ok()) << created.error().message();
  EXPECT_EQ(created->onExpiry, store::ExpiryAction::kPause);
  EXPECT_EQ(created->ttlS, 1);
  const std::string id = created->id;
  ASSERT_TRUE(waitFor([&] { return state(*m, id) == "gone"; })) << state(*m, id);
  auto gone = m->get(id);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->reason.rfind("expired (the pause its create asked for failed: ", 0), 0) << gone->reason;
  EXPECT_NE(gone->reason.find("cannot pause"), std::string::npos) << gone->reason;
  EXPECT_FALSE(backend_.runs(id));
  EXPECT_FALSE(events_.find("environment.paused", id));
}

// A pause at expiry that takes long (a guest slow to answer) holds up no
// other environment's expiry: it runs off the reaper's thread.
TEST_F(ManagerTest, APauseAtExpiryThatTakesLongHoldsUpNoOtherExpiry) {
  auto m = start();
  backend_.holdPauses(true);
  CreateRequest pausing;
  pausing.ttlS = 1;
  pausing.onExpiry = store::ExpiryAction::kPause;
  auto slow = m->create(pausing);
  ASSERT_TRUE(slow.ok()) << slow.error().message();
  ASSERT_TRUE(waitFor([&] { return !backend_.calls("pause").empty(); })) << "its pause never began";
  CreateRequest plain;
  plain.ttlS = 1;
  auto other = m->create(plain);
  ASSERT_TRUE(other.ok()) << other.error().message();
  const bool otherExpired = waitFor([&] { return state(*m, other->id) == "gone"; });
  EXPECT_NE(state(*m, slow->id), "gone") << "its pause is still under way";
  backend_.holdPauses(false);
  EXPECT_TRUE(otherExpired) << "the other environment's expiry waited on the pause";
  ASSERT_TRUE(waitFor([&] { return state(*m, slow->id) == "gone"; })) << state(*m, slow->id);
  EXPECT_EQ(backend_.calls("pause").size(), 1u) << "one pause at a time per environment";
}

TEST_F(ManagerTest, AnEnvironmentWhosePid1DiesIsFailedByTheReaperAndFreesItsPlace) {
  ManagerConfig config;
  config.maxEnvironments = 1;
  auto m = start(config);
  auto created = m->create(CreateRequest{});
  ASSERT_TRUE(created.ok()) << created.error().message();
  const std::string id = created->id;
  EXPECT_FALSE(m->create(CreateRequest{}).ok()) << "the one place is taken";
  backend_.vanish(id);
  ASSERT_TRUE(waitFor([&] { return state(*m, id) == "failed"; })) << state(*m, id);
  EXPECT_EQ(m->get(id)->reason, "failed: pid 1 of the environment exited");
  EXPECT_FALSE(m->usage(id).ok()) << "nothing to count once it is gone";
  auto again = m->create(CreateRequest{});
  EXPECT_TRUE(again.ok()) << "its place came back: " << again.error().message();
}

TEST_F(ManagerTest, AWarmPoolIsClaimedByACreateOfItsSpecAndRefilled) {
  ManagerConfig config;
  WarmPool pool;
  pool.cpus = config.defaultCpus;
  pool.ramMb = config.defaultRamMb;
  pool.storageGb = config.defaultStorageGb;
  pool.pids = config.defaultPids;
  pool.size = 1;
  config.warmPools = {pool};
  auto m = start(config);
  ASSERT_TRUE(waitFor([&] { return m->counters().warmReady == 1; }));
  auto creates = backend_.calls("create");
  ASSERT_EQ(creates.size(), 1u);
  const std::string warm = creates[0].spec.id;

  auto claimed = m->create(CreateRequest{});
  ASSERT_TRUE(claimed.ok()) << claimed.error().message();
  EXPECT_EQ(claimed->id, warm);
  EXPECT_EQ(m->counters().warmClaims, 1u);
  EXPECT_EQ(run(*m, warm, {"/bin/sh", "-c", "echo warm"}), "warm\n");
  ASSERT_TRUE(waitFor([&] { return m->counters().warmReady == 1; }));  // refilled
  EXPECT_EQ(backend_.calls("create").size(), 2u);

  CreateRequest other;
  other.ramMb = 512;  // not the pool's spec: made for it
  auto made = m->create(other);
  ASSERT_TRUE(made.ok()) << made.error().message();
  EXPECT_NE(made->id, warm);
  EXPECT_EQ(m->counters().warmClaims, 1u);
  auto last = backend_.calls("create").back();
  EXPECT_EQ(last.spec.id, made->id);
  EXPECT_EQ(last.spec.memoryMb, 512u);
}

// --max-environments counts every environment: warm ones, and a claimed one
// once (not as warm and as running); a destroyed one gives its place back.
TEST_F(ManagerTest, WarmEnvironmentsCountAgainstTheLimitAndAClaimedOneCountsOnce) {
  ManagerConfig config;
  config.maxEnvironments = 2;
  WarmPool pool;
  pool.size = 1;  // of the default spec
  config.warmPools = {pool};
  auto m = start(config);
  ASSERT_TRUE(waitFor([&] { return m->counters().warmReady == 1; }));
  auto claimed = m->create(CreateRequest{});
  ASSERT_TRUE(claimed.ok()) << claimed.error().message();
  ASSERT_EQ(m->counters().warmClaims, 1u);
  ASSERT_TRUE(waitFor([&] { return m->counters().warmReady == 1; }));  // refilled: two now
  CreateRequest other;
  other.ramMb = 512;
  auto refused = m->create(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Code::kCapacity);
  EXPECT_EQ(refused.error().context, "at capacity: 2 environments exist");
  ASSERT_TRUE(m->destroy(claimed->id, "destroyed").ok());
  auto made = m->create(other);
  EXPECT_TRUE(made.ok()) << made.error().message();
}

TEST_F(ManagerTest, ARestartReattachesWhatRunsFailsWhatVanishedAndDestroysWhatNobodyRecorded) {
  std::string kept, lost;
  {
    auto first = start();
    auto a = first->create(CreateRequest{});
    auto b = first->create(CreateRequest{});
    ASSERT_TRUE(a.ok() && b.ok());
    kept = a->id;
    lost = b->id;
    ASSERT_EQ(run(*first, kept, {"/bin/sh", "-c", "echo before"}), "before\n");
    first->detach();  // moatd goes; its environments stay
  }
  ASSERT_TRUE(backend_.runs(kept));
  backend_.vanish(lost);
  backend::Spec stray;
  stray.id = "abcdefabcdef";  // made by a moatd that died before recording it
  ASSERT_TRUE(backend_.create(stray).ok());

  auto second = start();
  ASSERT_TRUE(second->recoverAfterRestart().ok());
  EXPECT_EQ(state(*second, kept), "running");
  EXPECT_EQ(run(*second, kept, {"/bin/sh", "-c", "echo after"}), "after\n");
  EXPECT_TRUE(events_.find("environment.reattached", kept));
  bool attached = false;
  for (const auto& c : backend_.calls("attach")) attached = attached || c.id == kept;
  EXPECT_TRUE(attached);

  auto failed = second->get(lost);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->state, EnvironmentState::kFailed);
  EXPECT_NE(failed->reason.find("gone"), std::string::npos) << failed->reason;
  // Nobody recorded the stray: it is destroyed, not adopted.
  EXPECT_FALSE(backend_.runs(stray.id));
  bool strayDestroyed = false;
  for (const auto& c : backend_.calls("destroy")) strayDestroyed = strayDestroyed || c.id == stray.id;
  EXPECT_TRUE(strayDestroyed);
}

TEST_F(ManagerTest, SnapshotsForksAndRestoresGoThroughTheBackend) {
  auto m = start();
  auto a = m->create(CreateRequest{});
  ASSERT_TRUE(a.ok()) << a.error().message();
  auto snap = m->snapshot(a->id, "first", "master");
  ASSERT_TRUE(snap.ok()) << snap.error().message();
  EXPECT_TRUE(backend_.keepsSnapshot(snap->id));
  EXPECT_EQ(snap->hostBase, 100000u);  // what the backend gave, kept for creates from it

  auto forks = m->fork(a->id, ForkRequest{});
  ASSERT_TRUE(forks.ok()) << forks.error().message();
  ASSERT_EQ(forks->size(), 1u);
  const auto& fork = forks->front();
  EXPECT_NE(fork.id, a->id);
  auto forkCreate = backend_.calls("create").back();
  EXPECT_EQ(forkCreate.spec.id, fork.id);
  ASSERT_FALSE(forkCreate.spec.fromSnapshot.empty());
  EXPECT_FALSE(forkCreate.spec.withMemory);
  EXPECT_NE(forkCreate.spec.fromSnapshot, snap->id);  // a snapshot of its own, nobody keeps
  EXPECT_FALSE(backend_.keepsSnapshot(forkCreate.spec.fromSnapshot));
  EXPECT_EQ(run(*m, fork.id, {"/bin/sh", "-c", "echo fork"}), "fork\n");

  // Several from one moment: one snapshot, as many creates from it.
  ForkRequest three;
  three.count = 3;
  auto many = m->fork(a->id, three);
  ASSERT_TRUE(many.ok()) << many.error().message();
  ASSERT_EQ(many->size(), 3u);
  auto creates = backend_.calls("create");
  ASSERT_GE(creates.size(), 3u);
  std::set<std::string> ids, sources;
  for (size_t i = creates.size() - 3; i < creates.size(); ++i) {
    ids.insert(creates[i].spec.id);
    sources.insert(creates[i].spec.fromSnapshot);
  }
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(sources.size(), 1u);
  EXPECT_FALSE(backend_.keepsSnapshot(*sources.begin()));
  ForkRequest tooMany;
  tooMany.count = kMaxForkCount + 1;
  auto refused = m->fork(a->id, tooMany);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Code::kInvalidArgument);
  // With memory: a namespace environment's would need CRIU, refused by name
  // before any snapshot is stored.
  ForkRequest memory;
  memory.memory = true;
  const size_t createsBefore = backend_.calls("create").size();
  auto withMemory = m->fork(a->id, memory);
  ASSERT_FALSE(withMemory.ok());
  EXPECT_EQ(withMemory.error().code, Code::kUnsupported);
  EXPECT_NE(withMemory.error().message().find("CRIU"), std::string::npos) << withMemory.error().message();
  EXPECT_EQ(backend_.calls("create").size(), createsBefore);

  auto restored = m->restore(a->id, snap->id, "master");
  ASSERT_TRUE(restored.ok()) << restored.error().message();
  auto again = backend_.calls("create").back();
  EXPECT_EQ(again.spec.id, a->id);  // the same environment, made again on the snapshot
  EXPECT_EQ(again.spec.fromSnapshot, snap->id);
  EXPECT_EQ(again.spec.snapshotHostBase, 100000u);
  EXPECT_EQ(state(*m, a->id), "running");
  EXPECT_EQ(run(*m, a->id, {"/bin/sh", "-c", "echo restored"}), "restored\n");

  ASSERT_TRUE(m->deleteSnapshot(snap->id, "master").ok());
  EXPECT_FALSE(backend_.keepsSnapshot(snap->id));
  EXPECT_FALSE(m->getSnapshot(snap->id).ok());
}

TEST_F(ManagerTest, ARestartRemovesSnapshotsNobodyRecorded) {
  std::string kept;
  {
    auto first = start();
    auto a = first->create(CreateRequest{});
    ASSERT_TRUE(a.ok());
    auto snap = first->snapshot(a->id, "kept", "master");
    ASSERT_TRUE(snap.ok());
    kept = snap->id;
    ASSERT_TRUE(backend_.snapshot(a->id, "snap-stray").ok());  // taken by a moatd killed before recording it
    first->detach();
  }
  auto second = start();
  ASSERT_TRUE(second->recoverAfterRestart().ok());
  EXPECT_FALSE(backend_.keepsSnapshot("snap-stray"));
  EXPECT_TRUE(backend_.keepsSnapshot(kept));
  EXPECT_TRUE(second->getSnapshot(kept).ok());
}

// A moatd killed while taking or deleting a snapshot leaves a record that
// is not "ready": the next start rolls it back, unless the backend cannot
// remove the volume now, in which case the record stays for a later start.
TEST_F(ManagerTest, ARestartRollsBackHalfDoneSnapshotsAndKeepsThoseItCannotRemove) {
  std::string env;
  {
    auto first = start();
    auto a = first->create(CreateRequest{});
    ASSERT_TRUE(a.ok());
    env = a->id;
    first->detach();
  }
  for (auto state : {SnapshotState::kCreating, SnapshotState::kDeleting}) {
    store::SnapshotRecord snap;
    snap.id = std::string("snap-") + stateName(state);
    snap.environment = env;
    snap.owner = "master";
    snap.templateName = "host";
    snap.state = state;
    ASSERT_TRUE(store_->insertSnapshot(snap).ok());
    backend_.holdSnapshot(snap.id);
  }
  backend_.failSnapshotDeletes(true);
  {
    auto second = start();
    ASSERT_TRUE(second->recoverAfterRestart().ok());
    second->detach();
  }
  EXPECT_TRUE(store_->getSnapshot("snap-creating").value().has_value());  // kept for the next start
  EXPECT_TRUE(store_->getSnapshot("snap-deleting").value().has_value());
  EXPECT_FALSE(events_.find("snapshot.failed", env));

  backend_.failSnapshotDeletes(false);
  auto third = start();
  ASSERT_TRUE(third->recoverAfterRestart().ok());
  EXPECT_FALSE(store_->getSnapshot("snap-creating").value().has_value());
  EXPECT_FALSE(store_->getSnapshot("snap-deleting").value().has_value());
  EXPECT_FALSE(backend_.keepsSnapshot("snap-creating"));
  EXPECT_FALSE(backend_.keepsSnapshot("snap-deleting"));
  EXPECT_TRUE(events_.find("snapshot.failed", env));
  EXPECT_TRUE(events_.find("snapshot.deleted", env));
}

}  // namespace
}  // namespace moat::manager
