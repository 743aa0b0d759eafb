#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace moat::test {

// A backend for the manager's unit tests, without root: each environment is
// the real moat-init binary run as an ordinary child process (no
// namespaces, no limits; its exec gate on, as in moatd's environments),
// reattachable like the namespace backend's. Every call is recorded; a
// create can be made to fail, and an environment to vanish as if its host
// side had been lost.
class FakeBackend final : public backend::Backend {
 public:
  struct Call {
    std::string
        op;  // create, destroy, attach, list, usage, networkNamespace, snapshot, deleteSnapshot, snapshots, changes
    std::string id;      // the environment's, or a snapshot's name
    backend::Spec spec;  // create's
  };

  ~FakeBackend() override;

  Result<Created> create(const backend::Spec& spec) override;
  Status destroy(const std::string& id) override;
  Result<UniqueFd> attach(const std::string& id) override;
  Result<std::vector<std::string>> list() override;
  Result<backend::Usage> usage(const std::string& id) override;
  Result<UniqueFd> networkNamespace(const std::string& id) override;
  Result<uint32_t> snapshot(const std::string& id, const std::string& name) override;
  Status deleteSnapshot(const std::string& name) override;
  Result<std::vector<std::string>> snapshots() override;
  // Records the call; no files: nothing changed.
  Result<backend::Changes> changes(const backend::ChangesRequest& request) override;
  // Records the call and cannot pause (as the base backend), after waiting
  // while pauses are held (holdPauses): a pause that takes long.
  Status pause(const std::string& id) override;
  void holdPauses(bool hold);

  std::vector<Call> calls();
  // Calls of one kind, in order.
  std::vector<Call> calls(const std::string& op);
  bool runs(const std::string& id) override;
  bool keepsSnapshot(const std::string& name);
  // The next create fails with this error (and makes nothing).
  void failNextCreate(Code code, const std::string& message);
  // deleteSnapshot fails (as storage that cannot be reached would) while set.
  void failSnapshotDeletes(bool fail);
  // A snapshot volume the backend holds without a snapshot() call (left by
  // a moatd killed while taking or deleting it).
  void holdSnapshot(const std::string& name);
  // What usage() answers for every environment it runs.
  void setUsage(const backend::Usage& usage);
  // Ends the environment's moat-init without being asked (moatd sees its
  // pid 1 go; list() no longer names it).
  void vanish(const std::string& id);

 private:
  struct Env {
    pid_t pid = -1;
    UniqueFd exited;      // a pidfd: readable once moat-init has exited
    UniqueFd rendezvous;  // closed: moat-init ends everything and exits
  };
  void record(const std::string& op, const std::string& id, const backend::Spec& spec = {});
  static void end(Env& env);

  std::mutex mutex_;
  std::vector<Call> calls_;
  std::map<std::string, Env> envs_;
  std::set<std::string> snapshots_;
  std::optional<Error> failCreate_;
  bool failSnapshotDeletes_ = false;
  bool holdPauses_ = false;
  std::condition_variable pauseCv_;
  backend::Usage usage_;
};

}  // namespace moat::test
