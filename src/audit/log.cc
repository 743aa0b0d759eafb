#include "audit/log.h"

#include <pthread.h>

#include <cstdio>

#include "common/log.h"

namespace moat::audit {
namespace {

int64_t systemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr int64_t kDayMs = 24LL * 3600 * 1000;
constexpr size_t kVerifyPage = 5000;
// A failed append is retried after this pause; at shutdown, a few times only.
constexpr auto kRetryPause = std::chrono::seconds(1);
constexpr int kRetriesAtShutdown = 3;

Event toEvent(store::EventRecord record, bool* dataIsJson = nullptr) {
  Event e;
  e.id = record.id;
  e.timeMs = record.timeMs;
  e.type = std::move(record.type);
  e.environment = std::move(record.environment);
  e.actor = std::move(record.actor);
  e.data = nlohmann::json::parse(record.data, nullptr, /*allow_exceptions=*/false);
  bool parsed = !e.data.is_discarded();
  if (!parsed) e.data = record.data;  // shown as it is; it cannot verify
  if (dataIsJson) *dataIsJson = parsed;
  e.prevHash = std::move(record.prevHash);
  e.hash = std::move(record.hash);
  return e;
}

}  // namespace

Result<std::unique_ptr<Log>> Log::open(store::Store& store, LogOptions options) {
  if (!options.clock) options.clock = systemNowMs;
  if (options.maxBatch == 0) options.maxBatch = 1;
  MOAT_ASSIGN(auto last, store.lastEvent());
  MOAT_ASSIGN(auto first, store.firstEvent());
  uint64_t lastId = last ? last->id : 0;
  uint64_t firstId = first ? first->id : lastId + 1;
  std::string lastHash = last ? last->hash : kGenesisHash;
  return std::unique_ptr<Log>(new Log(store, std::move(options), firstId, lastId, std::move(lastHash)));
}

Log::Log(store::Store& store, LogOptions options, uint64_t firstId, uint64_t lastId, std::string lastHash)
    : store_(store),
      options_(std::move(options)),
      nextId_(lastId + 1),
      committedId_(lastId),
      firstId_(firstId),
      lastHash_(std::move(lastHash)),
      share_([this](const std::string& type, const std::string& environment,
                    nlohmann::json data) { record(type, environment, "environment", std::move(data)); },
             {options_.environmentShare ? options_.environmentShare : options_.maxEvents / 20, 60'000, {}}) {
  writer_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "moatd-audit");  // for top and bench/audit.sh
    writerLoop();
  });
}

Log::~Log() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    interrupted_ = true;
  }
  writerCv_.notify_all();
  committedCv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

int64_t Log::now() const { return options_.clock(); }

void Log::recordByEnvironment(const std::string& type, const std::string& environment, nlohmann::json data, Pace pace) {
  share_.record(type, environment, std::move(data), pace);
}

void Log::closeEnvironment(const std::string& environment) { share_.close(environment); }

void Log::record(const std::string& type, const std::string& environment, const std::string& actor,
                 nlohmann::json data) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Time taken under the lock: times never go backwards along the ids
    // (unless the clock does).
    queue_.push_back(Pending{nextId_++, now(), type, environment, actor, std::move(data)});
    // A writer that is gathering wakes on its own; only an idle one, or a
    // full batch, needs a signal (a futex wake is most of what this costs).
    wake = writerIdle_ || queue_.size() == options_.maxBatch;
    writerIdle_ = false;
  }
  if (wake) writerCv_.notify_one();
}

Status Log::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = nextId_ - 1;
  if (committedId_ >= target) return {};
  flushWanted_ = true;
  writerCv_.notify_one();
  if (!committedCv_.wait_for(lock, timeout, [&] { return committedId_ >= target; })) {
    return Error::make(Code::kTimeout, "the audit log did not write event " + std::to_string(target) + " in time");
  }
  return {};
}

uint64_t Log::committedId() {
  std::lock_guard<std::mutex> lock(mutex_);
  return committedId_;
}

uint64_t Log::waitForNewer(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  committedCv_.wait_until(lock, deadline, [&] { return committedId_ > seen || interrupted_; });
  return committedId_;
}

void Log::interrupt() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    interrupted_ = true;
  }
  committedCv_.notify_all();
}

bool Log::interrupted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return interrupted_;
}

Result<std::vector<Event>> Log::read(const store::EventQuery& query) {
  MOAT_ASSIGN(auto records, store_.listEvents(query));
  std::vector<Event> events;
  events.reserve(records.size());
  for (auto& r : records) events.push_back(toEvent(std::move(r)));
  return events;
}

Status Log::append(std::vector<Pending>& batch, uint64_t pruneThrough) {
  std::vector<store::EventRecord> records;
  records.reserve(batch.size());
  std::string prev = lastHash_;
  for (const Pending& p : batch) {
    store::EventRecord r;
    r.id = p.id;
    r.timeMs = p.timeMs;
    r.type = p.type;
    r.environment = p.environment;
    r.actor = p.actor;
    r.data = canonicalData(p.data);
    r.prevHash = prev;
    r.hash = chainHash(r.id, r.timeMs, r.type, r.environment, r.actor, r.data, r.prevHash);
    prev = r.hash;
    records.push_back(std::move(r));
  }
  MOAT_TRY(store_.appendEvents(records, pruneThrough));
  lastHash_ = std::move(prev);
  return {};
}

void Log::writeBatch(std::unique_lock<std::mutex>& lock) {
  std::vector<Pending> batch;
  size_t n = std::min(queue_.size(), options_.maxBatch);
  batch.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  lock.unlock();
  Status s = append(batch, 0);
  lock.lock();
  if (!s.ok()) {
    moat::log::warnf("audit log: %s (retrying)\n", s.error().message().c_str());
    for (auto it = batch.rbegin(); it != batch.rend(); ++it) queue_.push_front(std::move(*it));
    failing_ = true;
    return;
  }
  committedId_ = batch.back().id;
  committedCv_.notify_all();
}

Result<uint64_t> Log::prune(std::unique_lock<std::mutex>& lock, int64_t cutoffMs) {
  lock.unlock();
  // Only stored events are pruned; queued ones have greater ids.
  auto through = store_.lastEventBefore(cutoffMs);
  lock.lock();
  if (!through.ok()) return through.error();
  return pruneThrough(lock, through.value(), {{"before_ms", cutoffMs}});
}

Result<uint64_t> Log::pruneThrough(std::unique_lock<std::mutex>& lock, uint64_t through, const nlohmann::json& why) {
  if (through == 0) return uint64_t{0};
  lock.unlock();
  std::unique_lock<std::mutex> noVerify(verifyMutex_);
  auto first = store_.firstEvent();
  auto last = store_.getEvent(through);
  lock.lock();
  if (!first.ok()) return first.error();
  if (!last.ok()) return last.error();
  if (!first.value() || !last.value()) {
    return Error::make(Code::kStore, "audit event " + std::to_string(through) + " vanished while being pruned");
  }
  const uint64_t count = through - first.value()->id + 1;
  // The checkpoint comes after everything recorded so far: those go into
  // the same transaction, before it, so the ids stay consecutive.
  std::vector<Pending> batch;
  batch.reserve(queue_.size() + 1);
  for (auto& p : queue_) batch.push_back(std::move(p));
  queue_.clear();
  nlohmann::json data = {{"pruned_through", through}, {"pruned_hash", last.value()->hash}, {"pruned_count", count}};
  data.update(why);
  batch.push_back(Pending{nextId_++, now(), "audit.checkpoint", "", "moatd", std::move(data)});
  lock.unlock();
  Status s = append(batch, through);
  lock.lock();
  if (!s.ok()) {
    // Nothing was pruned; the checkpoint's id is taken, so it becomes a
    // record of the failure (a gap would read as a deleted event).
    Pending& checkpoint = batch.back();
    checkpoint.type = "audit.prune_failed";
    checkpoint.data = {{"error", s.error().message()}};
    checkpoint.data.update(why);
    for (auto it = batch.rbegin(); it != batch.rend(); ++it) queue_.push_front(std::move(*it));
    failing_ = true;
    return s.error();
  }
  committedId_ = batch.back().id;
  firstId_ = through + 1;
  committedCv_.notify_all();
  return count;
}

void Log::capSize(std::unique_lock<std::mutex>& lock) {
  const uint64_t cap = options_.maxEvents;
  if (cap == 0 || committedId_ + 1 - firstId_ <= cap) return;
  // Down to nine tenths: one prune for many batches, not one for each.
  const uint64_t keep = cap - cap / 10;
  auto pruned = pruneThrough(lock, committedId_ - keep + 1, {{"max_events", cap}});
  if (pruned.ok()) {
    moat::log::infof("audit log: more than %llu events: pruned the oldest %llu (--audit-max-events)\n",
                     static_cast<unsigned long long>(cap), static_cast<unsigned long long>(pruned.value()));
  } else {
    moat::log::warnf("audit log: pruning beyond %llu events: %s\n", static_cast<unsigned long long>(cap),
                     pruned.error().message().c_str());
  }
}

Result<uint64_t> Log::pruneBefore(int64_t cutoffMs) {
  PruneRequest request;
  request.cutoffMs = cutoffMs;
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) return Error::make(Code::kUnavailable, "the audit log is stopping");
  pruneRequests_.push_back(&request);
  writerCv_.notify_one();
  committedCv_.wait(lock, [&] { return request.done; });
  return request.result;
}

void Log::writerLoop() {
  using clock = std::chrono::steady_clock;
  const bool retention = options_.retentionDays > 0;
  clock::time_point nextPrune = clock::now();  // once at start
  int failures = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (failing_) {
      failing_ = false;
      ++failures;
      if (stopping_ && failures > kRetriesAtShutdown) {
        moat::log::errorf("audit log: %zu events could not be written\n", queue_.size());
        queue_.clear();
        break;
      }
      writerCv_.wait_for(lock, kRetryPause, [&] { return stopping_; });
      continue;
    }
    if (!pruneRequests_.empty()) {
      PruneRequest* request = pruneRequests_.front();
      pruneRequests_.erase(pruneRequests_.begin());
      request->result = prune(lock, request->cutoffMs);
      request->done = true;
      committedCv_.notify_all();
      if (request->result.ok()) failures = 0;
      continue;
    }
    if (retention && !stopping_ && clock::now() >= nextPrune) {
      nextPrune = clock::now() + options_.pruneEvery;
      auto pruned = prune(lock, now() - options_.retentionDays * kDayMs);
      if (!pruned.ok()) {
        moat::log::warnf("audit log: pruning: %s\n", pruned.error().message().c_str());
      }
      continue;
    }
    if (!queue_.empty()) {
      auto hurry = [&] {
        return stopping_ || flushWanted_ || queue_.size() >= options_.maxBatch || !pruneRequests_.empty();
      };
      if (!hurry()) writerCv_.wait_for(lock, options_.coalesce, hurry);
      flushWanted_ = false;
      writeBatch(lock);
      if (!failing_) {
        failures = 0;
        capSize(lock);
      }
      continue;
    }
    if (stopping_) break;
    auto ready = [&] { return !queue_.empty() || stopping_ || !pruneRequests_.empty(); };
    writerIdle_ = true;
    if (retention) {
      writerCv_.wait_until(lock, nextPrune, ready);
    } else {
      writerCv_.wait(lock, ready);
    }
    writerIdle_ = false;
  }
  // Anyone still waiting for a prune hears that it did not happen.
  for (PruneRequest* request : pruneRequests_) {
    request->result = Error::make(Code::kUnavailable, "the audit log stopped");
    request->done = true;
  }
  pruneRequests_.clear();
  committedCv_.notify_all();
}

Result<VerifyResult> Log::verify() {
  std::lock_guard<std::mutex> noPrune(verifyMutex_);
  MOAT_ASSIGN(auto first, store_.firstEvent());
  if (!first) return VerifyResult{};
  std::string anchor = kGenesisHash;
  if (first->id != 1) {
    // Pruned: the newest checkpoint that accounts for everything before the
    // first event gives the hash that event links to. The checkpoint is
    // itself in the chain, so it is checked on the way.
    bool found = false;
    store::EventQuery query;
    query.typePrefix = "audit.checkpoint";
    for (;;) {
      MOAT_ASSIGN(auto page, store_.listEvents(query));
      for (const auto& record : page) {
        query.afterId = record.id;
        auto data = nlohmann::json::parse(record.data, nullptr, false);
        if (record.type != "audit.checkpoint" || !data.is_object()) continue;
        auto through = data.find("pruned_through");
        auto hash = data.find("pruned_hash");
        if (through == data.end() || !through->is_number_unsigned() || hash == data.end() || !hash->is_string()) {
          continue;
        }
        if (through->get<uint64_t>() + 1 == first->id) {
          anchor = hash->get<std::string>();
          found = true;
        }
      }
      if (page.size() < query.limit) break;
    }
    if (!found) {
      VerifyResult broken;
      broken.ok = false;
      broken.firstBrokenId = first->id;
      broken.reason = "deleted: events 1 to " + std::to_string(first->id - 1) +
                      " are missing and no audit.checkpoint records their pruning";
      return broken;
    }
  }
  ChainVerifier verifier(first->id, anchor);
  store::EventQuery query;
  query.limit = kVerifyPage;
  for (;;) {
    MOAT_ASSIGN(auto page, store_.listEvents(query));
    for (auto& record : page) {
      query.afterId = record.id;
      bool dataIsJson = true;
      Event e = toEvent(std::move(record), &dataIsJson);
      if (!verifier.add(e, dataIsJson)) return verifier.result();
    }
    if (page.size() < query.limit) break;
  }
  return verifier.result();
}

}  // namespace moat::audit
