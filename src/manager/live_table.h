#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gate/permissions.h"
#include "manager/init_connection.h"
#include "manager/process_table.h"

namespace moat::manager {

// An expiry that never comes (a pause that stops the time to live).
inline constexpr int64_t kNoExpiry = INT64_MAX;

// What moatd holds of an environment that runs here.
struct LiveEnvironment {
  std::shared_ptr<InitConnection> connection;
  std::map<std::string, std::string> env;
  uint64_t ramMb = 0;
  std::shared_ptr<ProcessTable> processes;
  int64_t expiresAtMs = 0;                                            // the store's, kept here for the reaper
  std::shared_ptr<const std::vector<gate::Permissions>> permissions;  // replaced whole, never edited
  std::string owner;                                                  // never changes
  // Its template's defaults for commands (TemplateDefaults).
  std::string cwd = "/workspace";
  uint32_t uid = 0;
  uint32_t gid = 0;
  bool paused = false;   // its processes are stopped (pause.cc)
  bool microVm = false;  // its moat-init is a guest's: it pauses them, and counts its tasks
};

// The environments that run here and those whose create is with the
// backend, under one lock of its own. Lookups hand out copies; each change
// is one whole step (a create ending, a destroy taking its entry), so no
// caller holds the lock across a call elsewhere.
class LiveTable {
 public:
  // A create is with the backend: a destroy meanwhile is recorded
  // (requestDestroy), not done.
  void beginCreate(const std::string& id);
  // The create ended without the environment running (and any destroy
  // asked meanwhile is forgotten).
  void abandonCreate(const std::string& id);
  // Who asked to destroy it while it was being created; empty: nobody.
  std::string destroyRequestedBy(const std::string& id) const;
  // It runs (a create ended, a claim, a re-attach, a restore's new pid 1):
  // found from now on.
  void put(const std::string& id, LiveEnvironment live);
  // Removes it, if it runs here.
  std::optional<LiveEnvironment> take(const std::string& id);

  enum class Destroy { kAbsent, kRequested, kTaken };
  // For a destroy: while being created, the request is recorded for the
  // create to honour (kRequested); if it runs, its entry is taken (kTaken,
  // into `taken`).
  Destroy takeForDestroy(const std::string& id, const std::string& actor, LiveEnvironment& taken);

  std::optional<LiveEnvironment> find(const std::string& id) const;
  bool runs(const std::string& id) const;
  bool runsOrIsBeingCreated(const std::string& id) const;
  // Its connection to moat-init is open (a restore may have replaced one
  // that closed).
  bool connected(const std::string& id) const;
  // Changes a running one's entry in place; false when it does not run.
  bool update(const std::string& id, const std::function<void(LiveEnvironment&)>& change);
  void setExpiry(const std::string& id, int64_t expiresAtMs);

  std::vector<std::string> ids() const;
  std::vector<std::pair<std::string, std::shared_ptr<InitConnection>>> connections() const;
  std::map<std::string, LiveEnvironment> takeAll();
  // Those whose time to live ended by `nowMs`. Scans only once one is due
  // (a scan per reaper tick cost ~2% of a core with 1,000 environments);
  // expired ones count towards the next expiry too, so one still there
  // (its destroy failed) is found again.
  std::vector<std::string> expired(int64_t nowMs);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, LiveEnvironment> live_;
  std::set<std::string> creating_;
  std::map<std::string, std::string> destroyRequested_;  // while creating: id -> actor
  int64_t nextExpiryMs_ = 0;                             // nothing here expires before
};

}  // namespace moat::manager
