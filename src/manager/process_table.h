#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"
#include "manager/process.h"

namespace moat::manager {

struct ProcessLimits {
  size_t maxRunning = 32;                // background processes and shells per environment
  size_t keepEnded = 16;                 // ended processes kept for their output
  size_t outputCapPerStream = 1u << 20;  // background processes and shells
  // A lossless process nobody follows for this long goes back to dropping
  // (moatd --lossless-wait).
  int64_t losslessWaitMs = 30000;
};

// The processes of one environment, by moatd's id (1, 2, ...).
class ProcessTable {
 public:
  explicit ProcessTable(ProcessLimits limits) : limits_(limits) {}

  // A new process with the next id, or "capacity" when too many run, or
  // "gone" once the table is closed.
  Result<std::shared_ptr<Process>> add(std::vector<std::string> argv, const std::string& kind, bool pty, bool stdinOpen,
                                       size_t outputCapPerStream);
  // A process made elsewhere with its own id (a memory fork's copy): ids
  // given later come after it.
  void adopt(std::shared_ptr<Process> process);
  std::shared_ptr<Process> find(uint64_t id);
  std::vector<std::shared_ptr<Process>> all();
  void remove(uint64_t id);
  // Ends every process with `reason` (readers hear it at once) and refuses
  // new ones: the environment is going away.
  void close(const std::string& reason);
  const ProcessLimits& limits() const { return limits_; }

 private:
  void pruneEnded();  // with mutex_ held

  ProcessLimits limits_;
  std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<Process>> processes_;
  uint64_t nextId_ = 1;
  bool closed_ = false;
  std::string closeReason_;
};

}  // namespace moat::manager
