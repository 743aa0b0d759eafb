#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/keyed_lock.h"
#include "common/result.h"
#include "store/store.h"
#include "templates/image.h"
#include "templates/importer.h"

// moatd's named templates (docs/TEMPLATES.md): each a root file system
// under <state>/templates/images/<name> (root's, mode 0700), recorded in
// the store. Imports run on threads of their own; a request that started
// one is answered at once and the import goes on without it.
namespace moat::templates {

struct CatalogConfig {
  std::string stateDir;
  ImportLimits limits;
  // Templates moatd's warm pools keep environments of: never deleted.
  std::vector<std::string> warmPoolTemplates;
  size_t maxImports = 2;  // at once; more: "capacity"
};

struct Progress {
  std::string stage;
  uint64_t bytes = 0;
};

struct TemplateView {
  store::TemplateRecord record;
  std::optional<Progress> progress;  // while importing or building
};

// What a template gives environments made from it (none for "host" and
// directories).
struct Defaults {
  ImageConfig config;
  bool named = false;
  // A built template (a recipe): its environments are forks of this
  // snapshot (its owner: snapshotOwner(name)), on the base's files.
  std::string snapshot;
};

// A recipe's result (Catalog::build): the snapshot of the environment the
// recipe ran in, and the base's defaults.
struct Built {
  std::string snapshot;
  ImageConfig config;
};
// The owner the store records for a built template's snapshot: no key's,
// so no key may use or delete it through /v1/snapshots.
std::string snapshotOwner(const std::string& templateName);
// What a build does, on the catalog's thread: says how far it is, gives
// up when stopping() says so.
using BuildWork = std::function<Result<Built>(const std::function<void(const std::string& stage)>& progress,
                                              const std::function<bool()>& stopping)>;

class Catalog {
 public:
  Catalog(CatalogConfig config, store::Store& store);
  ~Catalog();  // stop()

  // At start, before serving: the templates directory made private;
  // imports a previous moatd left unfinished fail (their files removed);
  // files no record names are removed.
  Status recover();
  // Imports in progress stop: each ends failed, its partial files removed.
  void stop();
  // The start of a shutdown, before the manager's: builds in progress end
  // failed as interrupted (their commands are cut next); stop() joins them.
  void interrupt() { stopping_ = true; }

  Result<TemplateView> import(const std::string& name, const std::string& sourceText, const std::string& owner);
  // A template from a recipe: `work` runs on a thread of its own (source
  // "build:<base>"); the same name rule, conflict and capacity as import.
  Result<TemplateView> build(const std::string& name, const std::string& base, const std::string& owner,
                             BuildWork work);
  Result<std::vector<TemplateView>> list();
  Result<TemplateView> get(const std::string& name);
  // "conflict" while it imports or anything uses it (an environment not
  // gone, a snapshot, a warm pool).
  Status remove(const std::string& name);

  // For a create: a named template must be ready. The hold keeps it from
  // being deleted until the environment's record is in the store.
  Result<Defaults> defaultsFor(const std::string& name);
  std::shared_ptr<void> hold(const std::string& name) {
    return std::shared_ptr<void>(new KeyedLock::Held(use_.shared(name)));
  }

  // Called on the import's thread when it ends (ready or failed).
  void onFinished(std::function<void(const store::TemplateRecord&)> hook) { finished_ = std::move(hook); }
  // Deletes a built template's snapshot (the manager's); set before serving.
  void onDropSnapshot(std::function<Status(const std::string& snapshotId)> hook) { dropSnapshot_ = std::move(hook); }

  const CatalogConfig& config() const { return config_; }
  std::string imagesDir() const;

 private:
  void run(store::TemplateRecord record, Source source, std::string workDir);
  void runBuild(store::TemplateRecord record, BuildWork work);
  // Records the outcome, then lets the thread go (joined later).
  void finish(store::TemplateRecord& record);
  // The checks and the record of a new import or build; then `thread` runs.
  Result<TemplateView> start(store::TemplateRecord record, const std::function<Status()>& prepare,
                             std::function<void(store::TemplateRecord)> thread);
  void setProgress(const std::string& name, const std::string& stage, uint64_t bytes);

  CatalogConfig config_;
  store::Store& store_;
  KeyedLock use_;  // shared: a create's use; exclusive: a deletion
  std::mutex mutex_;
  std::map<std::string, Progress> progress_;    // under mutex_
  std::map<std::string, std::thread> running_;  // under mutex_
  std::vector<std::thread> finishedThreads_;    // under mutex_: joined by the next import or stop()
  std::atomic<bool> stopping_{false};
  std::function<void(const store::TemplateRecord&)> finished_;
  std::function<Status(const std::string&)> dropSnapshot_;
};

// The snapshot a built template's record names ("" for an imported one).
std::string builtSnapshot(const store::TemplateRecord& record);

// The API's name rule (isolation::fs::isTemplateName).
bool validName(const std::string& name);

}  // namespace moat::templates
