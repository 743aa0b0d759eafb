#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/namespaces/environment.h"
#include "common/result.h"
#include "common/unique_fd.h"

namespace moat::backend::namespaces {

// Creating an environment clones the calling process, which is only safe
// from a single-threaded one (a clone of a multi-threaded process may find
// malloc's locks held by threads that do not exist in the copy). moatd forks
// this spawner before it starts any thread; the spawner creates and destroys
// environments on request and owns their host-side parts (cgroup, volume,
// lock, pid 1). The control socket of each new environment is handed back,
// so moatd talks to moat-init directly.
//
// The spawner outlives moatd: when moatd goes away (a crash, an upgrade),
// the spawner keeps the environments running and waits on `socketPath` for
// the next moatd, which re-attaches to them. Only shutdown() ends it (after
// destroying what it owns); if the spawner itself dies, every environment's
// pid 1 gets SIGKILL (parent-death signal).
class Spawner {
 public:
  // Connects to the spawner serving socketPath, or forks a new one. Call
  // before any thread exists.
  static Result<std::unique_ptr<Spawner>> connectOrStart(const std::string& socketPath);
  ~Spawner();  // detaches: the spawner and its environments keep running

  struct Created {
    std::string id;
    UniqueFd control;  // the guest protocol connection to moat-init
  };
  // Thread-safe; requests are served one at a time.
  Result<Created> create(const EnvironmentSpec& spec);
  Status destroy(const std::string& id);
  // A new control connection to a running environment.
  Result<UniqueFd> attach(const std::string& id);
  // The environment's network namespace (for its egress link).
  Result<UniqueFd> networkNamespace(const std::string& id);
  // A read-only snapshot of the environment's writable layer, `name` in the
  // storage pool; the host uid its files' root maps to.
  Result<uint32_t> snapshot(const std::string& id, const std::string& name);
  // Stops (resumes) every process of the environment but its pid 1.
  Status pause(const std::string& id);
  Status resume(const std::string& id);
  // What the environment's cgroup counts now.
  Result<isolation::cgroup::Usage> usage(const std::string& id);
  // Ids of the environments the spawner owns.
  Result<std::vector<std::string>> list();
  // Destroys every environment and ends the spawner.
  Status shutdown();

 private:
  Spawner() = default;
  Result<std::string> call(const std::string& request, UniqueFd* receivedFd);

  std::mutex mutex_;
  UniqueFd channel_;
};

// The spawner's side (runs in the forked child; never returns).
[[noreturn]] void runSpawner(int channel, int listenFd);

}  // namespace moat::backend::namespaces
