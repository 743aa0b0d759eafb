#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

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
// When moatd goes away (the channel closes), the spawner destroys every
// environment it still owns and exits.
class Spawner {
 public:
  // Forks the spawner. Call before any thread exists.
  static Result<std::unique_ptr<Spawner>> start();
  ~Spawner();

  struct Created {
    std::string id;
    UniqueFd control;  // the guest protocol connection to moat-init
  };
  // Thread-safe; requests are served one at a time.
  Result<Created> create(const EnvironmentSpec& spec);
  Status destroy(const std::string& id);

 private:
  Spawner() = default;
  Result<std::string> call(const std::string& request, UniqueFd* receivedFd);

  std::mutex mutex_;
  UniqueFd channel_;
  pid_t pid_ = -1;
};

// The spawner's side (runs in the forked child; never returns).
[[noreturn]] void runSpawner(int channel);

}  // namespace moat::backend::namespaces
