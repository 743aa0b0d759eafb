#include "manager/process_table.h"

namespace moat::manager {

Result<std::shared_ptr<Process>> ProcessTable::add(std::vector<std::string> argv,
                                                   const std::string& kind, bool pty, bool stdinOpen,
                                                   size_t outputCapPerStream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return Error::make("gone", closeReason_);
  // Execs are bounded by their callers' connections and their own output
  // limits; the cap is for what runs on unattended.
  size_t running = 0;
  for (auto& [id, p] : processes_) {
    auto info = p->info();
    running += info.ended() || info.kind == "exec" ? 0 : 1;
  }
  if (kind != "exec" && running >= limits_.maxRunning) {
    return Error::make("capacity", "at capacity: " + std::to_string(limits_.maxRunning) +
                                       " processes run in this environment");
  }
  pruneEnded();
  uint64_t id = nextId_++;
  auto process = std::make_shared<Process>(id, std::move(argv), kind, pty, stdinOpen, outputCapPerStream);
  processes_[id] = process;
  return process;
}

void ProcessTable::pruneEnded() {
  std::vector<uint64_t> ended;
  for (auto& [id, p] : processes_) {
    if (p->info().ended()) ended.push_back(id);  // ids grow: oldest first
  }
  for (size_t i = 0; i + limits_.keepEnded < ended.size(); ++i) processes_.erase(ended[i]);
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
