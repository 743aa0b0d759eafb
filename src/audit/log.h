#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "audit/chain.h"
#include "audit/environment_share.h"
#include "audit/event.h"
#include "common/result.h"
#include "store/store.h"

namespace moat::audit {

struct LogOptions {
  // Events older than this many days are pruned (hourly, and at start);
  // 0 keeps everything.
  int64_t retentionDays = 30;
  std::chrono::milliseconds pruneEvery = std::chrono::hours(1);
  // At most this many events are kept: beyond it, the oldest are pruned
  // (down to nine tenths of it) the same way; 0: no cap. Retention bounds
  // the log's age, this its size, whatever the rate of events.
  uint64_t maxEvents = 1'000'000;
  // Unix time in milliseconds; the system clock unless a test sets one.
  std::function<int64_t()> clock;
  // Events per transaction. A batch holds the store's lock while it is
  // written (~5 ms for 512), and requests that read the store wait.
  size_t maxBatch = 512;
  // What one environment's own doing (connections, refusals, network
  // questions) may hold of the log, EnvironmentShare; 0: maxEvents / 20.
  uint64_t environmentShare = 0;
  // The writer gathers events this long after the first before it writes
  // them: one transaction (and one wake-up) for many events, and the
  // writer stays off the CPU while the request that caused them finishes.
  std::chrono::milliseconds coalesce = std::chrono::milliseconds(10);
};

// The audit log on the store. record() only queues: a writer thread gives
// each batch of queued events its hashes and appends it in one transaction
// (gathering for `coalesce` first), then wakes the subscribers (live
// streams). Ids and times are assigned at record(), so the chain's order is
// the order of the calls.
//
// Pruning deletes the oldest events and, in the same transaction, appends an
// `audit.checkpoint` event that records the last pruned id and its hash: the
// first remaining event links to that hash, so the chain still verifies.
class Log final : public Recorder {
 public:
  // Reads the end of the chain from the store and starts the writer.
  static Result<std::unique_ptr<Log>> open(store::Store& store, LogOptions options = {});
  ~Log() override;  // writes what is queued, then stops the writer

  void record(const std::string& type, const std::string& environment, const std::string& actor,
              nlohmann::json data) override;
  void recordByEnvironment(const std::string& type, const std::string& environment, nlohmann::json data,
                           Pace pace) override;
  void closeEnvironment(const std::string& environment) override;

  // Waits until every event recorded before the call is in the store.
  Status flush(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Events in the store (ascending id); `data` parsed (an unparsable row
  // comes back with its text as a JSON string).
  Result<std::vector<Event>> read(const store::EventQuery& query);
  // The newest id in the store.
  uint64_t committedId();
  // Blocks until an event newer than `seen` is in the store, `deadline`
  // passes or the log is interrupted; returns committedId().
  uint64_t waitForNewer(uint64_t seen, std::chrono::steady_clock::time_point deadline);
  // moatd is stopping: waiters return at once from now on (recording goes on).
  void interrupt();
  bool interrupted();

  // Walks the chain from its first event (id 1, or the one after what a
  // checkpoint pruned) and reports the first event that does not hold.
  Result<VerifyResult> verify();
  // Prunes every event older than cutoffMs and records the checkpoint, on
  // the writer thread; returns how many were pruned (0: nothing to do, and
  // no checkpoint is written).
  Result<uint64_t> pruneBefore(int64_t cutoffMs);

 private:
  Log(store::Store& store, LogOptions options, uint64_t firstId, uint64_t lastId, std::string lastHash);

  struct Pending {
    uint64_t id;
    int64_t timeMs;
    std::string type;
    std::string environment;
    std::string actor;
    nlohmann::json data;
  };
  struct PruneRequest {
    int64_t cutoffMs = 0;
    bool done = false;
    Result<uint64_t> result = uint64_t{0};
  };

  void writerLoop();
  // With mutex_ held on entry and exit; unlocks it around store calls.
  void writeBatch(std::unique_lock<std::mutex>& lock);
  Result<uint64_t> prune(std::unique_lock<std::mutex>& lock, int64_t cutoffMs);
  // Prunes events up to id `through` (0: nothing), with a checkpoint that
  // also carries `why`.
  Result<uint64_t> pruneThrough(std::unique_lock<std::mutex>& lock, uint64_t through, const nlohmann::json& why);
  // Prunes the oldest events while more than maxEvents are stored.
  void capSize(std::unique_lock<std::mutex>& lock);
  Status append(std::vector<Pending>& batch, uint64_t pruneThrough);
  int64_t now() const;

  store::Store& store_;
  LogOptions options_;

  std::mutex mutex_;
  std::condition_variable writerCv_;     // work for the writer
  std::condition_variable committedCv_;  // new events in the store; flushes
  std::deque<Pending> queue_;
  uint64_t nextId_;       // the id the next record() gets
  uint64_t committedId_;  // the newest id in the store
  uint64_t firstId_;      // the oldest id in the store (committedId_ + 1: none)
  std::string lastHash_;  // its hash (the writer's alone)
  std::vector<PruneRequest*> pruneRequests_;
  bool stopping_ = false;
  bool interrupted_ = false;
  bool failing_ = false;      // the last append failed: retry after a pause
  bool writerIdle_ = false;   // waiting for a first event: record() wakes it
  bool flushWanted_ = false;  // someone waits in flush(): write without gathering

  EnvironmentShare share_;

  std::mutex verifyMutex_;  // a verify and a prune do not overlap
  std::thread writer_;
};

}  // namespace moat::audit
