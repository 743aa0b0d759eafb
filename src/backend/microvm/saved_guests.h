#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <map>
#include <mutex>
#include <string>

#include "backend/microvm/vm.h"
#include "common/dedicated_thread.h"
#include "common/keyed_lock.h"
#include "common/result.h"
#include "common/unique_fd.h"

// Saved guests (docs/MICROVM.md, "Saved guests"): a guest booted once per
// template image and machine with moat-init parked before anything of an
// environment's is made, saved by QEMU's migration into a file, and
// restored by each create instead of a boot. What is kept is bounded, what
// a caller can make moatd save is bounded, and a create never waits for
// another's save: it boots instead.
namespace moat::backend::microvm {

// How many saved guests a moatd keeps by default: one per template image
// and machine (RAM, vCPUs) in use, each about as large as the RAM its boot
// touched.
inline constexpr size_t kMaxSavedGuests = 8;

class SavedGuests {
 public:
  // `dir`: where the states live (root's alone). `keep`: at most that many
  // (the least recently used go; 0: none is ever made). The saving QEMUs
  // run in cgroups named `cgroupPrefix` + "save-" + an id, started on
  // `launcher` (so that they die with moatd).
  SavedGuests(std::string dir, size_t keep, std::chrono::seconds bootWait, std::string cgroupPrefix,
              DedicatedThread& launcher);

  struct Saved {
    std::string name;
    UniqueFd state;  // opened to be read: QEMU's -incoming
  };
  // The saved guest for `vm` (its image, RAM, vCPUs, QEMU and kernel), made
  // now if this is the second create to ask for it; for environment `id`.
  // kUnavailable: this create boots instead (the first to ask, a save under
  // way, an earlier save failed a moment ago), saying why.
  Result<Saved> take(const VmSpec& vm, const std::string& id);
  // A saved guest that did not restore: removed (asked for again, it is
  // made again).
  void forget(const std::string& name);

  // A save that failed is tried again after this long.
  static constexpr std::chrono::minutes kRetryAfter{5};

 private:
  struct Record {
    unsigned asks = 0;
    std::chrono::steady_clock::time_point retryAt{};
  };
  Result<std::string> nameOf(const VmSpec& vm) const;
  Status save(const VmSpec& vm, const std::string& id, const std::string& path);
  void evictFor(const std::string& name);

  const std::string dir_;
  const size_t keep_;
  const std::chrono::seconds bootWait_;
  const std::string cgroupPrefix_;
  DedicatedThread& launcher_;
  KeyedLock names_;   // a saved guest's name: held while it is made, opened or removed
  std::mutex mutex_;  // what follows; a name is taken while it is held only without waiting (tryExclusive)
  std::map<std::string, Record> records_;
  std::list<std::string> order_;  // those on disk, least recently used first
  size_t saving_ = 0;             // saves under way
};

}  // namespace moat::backend::microvm
