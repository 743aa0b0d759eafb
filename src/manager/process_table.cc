#include "manager/process_table.h"

#include <algorithm>

namespace moat::manager {

Result<std::shared_ptr<Process>> ProcessTable::add(std::vector<std::string> argv, const std::string& kind, bool pty,
                                                   bool stdinOpen, size_t outputCapPerStream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return Error::make(Code::kGone, closeReason_);
  // Execs are bounded by their callers' connections and their own output
  // limits; the cap is for what runs on unattended.
  size_t running = 0;
  for (auto& [id, p] : processes_) {
    auto info = p->info();
    running += info.ended() || info.kind == "exec" ? 0 : 1;
  }
  if (kind != "exec" && running >= limits_.maxRunning) {
    return Error::make(Code::kCapacity,
                       "at capacity: " + std::to_string(limits_.maxRunning) + " processes run in this environment");
  }
  pruneEnded();
  uint64_t id = nextId_++;
  auto process = std::make_shared<Process>(id, std::move(argv), kind, pty, stdinOpen, outputCapPerStream);
  processes_[id] = process;
  return process;
}

void ProcessTable::pruneEnded() {
  // Those a follower read to the end (a `moat exec`, say) go first: nobody
  // needs their output again as much as that of one nobody read.
  std::vector<uint64_t> delivered, unread;
  for (auto& [id, p] : processes_) {
    if (p->info().ended()) (p->delivered() ? delivered : unread).push_back(id);  // ids grow: oldest first
  }
  size_t excess =
      delivered.size() + unread.size() > limits_.keepEnded ? delivered.size() + unread.size() - limits_.keepEnded : 0;
  for (const auto* ids : {&delivered, &unread}) {
    for (size_t i = 0; i < ids->size() && excess > 0; ++i, --excess) processes_.erase((*ids)[i]);
  }
}

void ProcessTable::adopt(std::shared_ptr<Process> process) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = process->id();
  nextId_ = std::max(nextId_, id + 1);
  processes_[id] = std::move(process);
}

std::shared_ptr<Process> ProcessTable::find(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = processes_.find(id);
  return it == processes_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Process>> ProcessTable::all() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<Process>> out;
  for (auto& [id, p] : processes_) out.push_back(p);
  return out;
}

void ProcessTable::remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  processes_.erase(id);
}

void ProcessTable::close(const std::string& reason) {
  std::map<uint64_t, std::shared_ptr<Process>> processes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) {
      closed_ = true;
      closeReason_ = reason;
    }
    processes = processes_;
  }
  for (auto& [id, p] : processes) p->abandon(reason);
}

}  // namespace moat::manager
