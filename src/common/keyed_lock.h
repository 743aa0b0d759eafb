#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/scope_exit.h"

namespace moat {

// Locks named by a string (an environment's id, a snapshot's): any number
// of shared holders at once, or one exclusive holder alone; each kind waits
// for the other. Keys no one holds cost nothing. Its own mutex, held only
// for the bookkeeping: a holder may block for as long as it needs.
class KeyedLock {
 public:
  using Held = ScopeExit<std::function<void()>>;  // released when it goes
  // Waits while `key` is held exclusively.
  Held shared(const std::string& key);
  // Waits while `key` is held at all.
  Held exclusive(const std::string& key);
  // `key` held exclusively now, or nothing (no wait) while anyone holds it.
  std::optional<Held> tryExclusive(const std::string& key);
  // Whether anyone holds `key` now (it may change at once).
  bool held(const std::string& key);

 private:
  void release(const std::string& key);

  std::mutex mutex_;
  std::condition_variable released_;
  std::map<std::string, int> holders_;  // > 0: shared holders; -1: held exclusively
};

}  // namespace moat
