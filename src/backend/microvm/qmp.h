#pragma once

#include <chrono>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>

#include "common/result.h"

// A client of QEMU's machine protocol (QMP) on a connected socket: the
// few commands moat sends a QEMU it started (docs/MICROVM.md, "Saved
// guests"). Every read waits until one deadline at most: a QEMU that stops
// answering fails the call, it does not hold moatd.
namespace moat::backend::microvm {

class Qmp {
 public:
  Qmp(int socket, std::chrono::steady_clock::time_point deadline) : socket_(socket), deadline_(deadline) {}
  // A session kept open: each use sets how long it may wait.
  void setDeadline(std::chrono::steady_clock::time_point deadline) { deadline_ = deadline; }

  // Reads the greeting and enters command mode (qmp_capabilities).
  Status open();
  // Runs `command` with `arguments` (and `fd` attached, for getfd): its
  // "return", or an error naming QEMU's. Events before it are kept; the
  // answer to an earlier command that timed out is skipped (by its id).
  Result<nlohmann::json> call(const std::string& command, const nlohmann::json& arguments = nullptr, int fd = -1);
  // The "data" of the next event named `name` (those before it dropped).
  Result<nlohmann::json> awaitEvent(const std::string& name);

 private:
  Result<nlohmann::json> nextMessage();

  int socket_;
  std::chrono::steady_clock::time_point deadline_;
  std::string buffer_;
  std::deque<nlohmann::json> events_;  // came before an answer
  int64_t nextId_ = 0;                 // each command's "id": a late answer to an earlier one is told apart
};

}  // namespace moat::backend::microvm
