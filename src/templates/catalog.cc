#include "templates/catalog.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/hex.h"
#include "common/log.h"
#include "isolation/fs/template.h"
#include "os/file.h"

namespace moat::templates {

bool validName(const std::string& name) { return isolation::fs::isTemplateName(name); }

std::string builtSnapshot(const store::TemplateRecord& record) {
  nlohmann::json config = nlohmann::json::parse(record.config, nullptr, false);
  if (!config.is_object() || !config.contains("snapshot") || !config["snapshot"].is_string()) return "";
  return config["snapshot"];
}

Catalog::Catalog(CatalogConfig config, store::Store& store) : config_(std::move(config)), store_(store) {}

Catalog::~Catalog() { stop(); }

std::string Catalog::imagesDir() const { return isolation::fs::namedTemplatesDir(config_.stateDir); }

void Catalog::stop() {
  std::map<std::string, std::thread> running;
  std::vector<std::thread> finished;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    running.swap(running_);
    finished.swap(finishedThreads_);
  }
  for (auto& [name, t] : running) {
    if (t.joinable()) t.join();
  }
  for (auto& t : finished) {
    if (t.joinable()) t.join();
  }
}

Status Catalog::recover() {
  const std::string dir = imagesDir();
  MOAT_TRY(os::makeDirs(dir, 0700, 0700));
  // Private whatever made it: the trees hold setuid files and device-free
  // but otherwise untrusted content no host user may reach.
  if (::chown(dir.c_str(), 0, 0) != 0) return Error::fromErrno("chown " + dir);
  if (::chmod(dir.c_str(), 0700) != 0) return Error::fromErrno("chmod " + dir);
  MOAT_ASSIGN(auto records, store_.listTemplates());
  std::map<std::string, store::TemplateRecord> byName;
  for (auto& r : records) {
    if (r.state == store::TemplateState::kImporting || r.state == store::TemplateState::kBuilding) {
      const bool building = r.state == store::TemplateState::kBuilding;
      r.state = store::TemplateState::kFailed;
      r.errorCode = "interrupted";
      r.errorMessage = building ? "moatd restarted during the build; its environment and snapshot were removed (delete "
                                  "it and build again)"
                                : "moatd restarted during the import; its partial files were removed (delete it and "
                                  "import again)";
      MOAT_TRY(store_.updateTemplate(r));
    }
    byName[r.name] = r;
  }
  MOAT_ASSIGN(auto names, os::listDir(dir));
  for (const auto& name : names) {
    auto it = byName.find(name);
    if (it == byName.end() || it->second.state != store::TemplateState::kReady) {
      // A partial import, a deletion cut short, or files nobody records.
      Status s = os::removeTree(dir + "/" + name);
      if (!s.ok()) moat::log::warnf("removing %s/%s: %s\n", dir.c_str(), name.c_str(), s.error().message().c_str());
    }
  }
  for (auto& [name, r] : byName) {
    if (r.state == store::TemplateState::kReady && builtSnapshot(r).empty() && !os::isDirectory(dir + "/" + name)) {
      r.state = store::TemplateState::kFailed;
      r.errorCode = "missing";
      r.errorMessage = "its files are gone from " + dir;
      MOAT_TRY(store_.updateTemplate(r));
    }
  }
  return {};
}

std::string snapshotOwner(const std::string& templateName) { return "template:" + templateName; }

namespace {

Status checkName(const std::string& name) {
  if (validName(name)) return {};
  return Error::invalidField(
      "name", "'" + name.substr(0, 80) + "': 1 to 64 of a-z 0-9 . _ : - starting with a letter or digit, not 'host'");
}

}  // namespace

Result<TemplateView> Catalog::start(store::TemplateRecord record, const std::function<Status()>& prepare,
                                    std::function<void(store::TemplateRecord)> thread) {
  std::lock_guard lock(mutex_);
  // Under the lock: stop() takes the threads under it, and none may start after.
  if (stopping_) return Error::make(Code::kUnavailable, "moatd is stopping");
  for (auto& t : finishedThreads_) t.join();
  finishedThreads_.clear();
  if (running_.size() >= config_.maxImports) {
    return Error::make(Code::kCapacity, std::to_string(running_.size()) +
                                            " imports and builds are in progress (at most " +
                                            std::to_string(config_.maxImports) + " at once); try again later");
  }
  record.config = record.config.empty() ? "{}" : record.config;
  record.createdAtMs = nowMs();
  const std::string name = record.name;
  MOAT_ASSIGN(auto existing, store_.getTemplate(name));
  if (existing) {
    return Error::make(Code::kConflict, "template " + name + " exists (" + stateName(existing->state) +
                                            "); delete it first (moat template rm " + name + ")");
  }
  MOAT_TRY(prepare());
  MOAT_TRY(store_.insertTemplate(record));
  progress_[name] = Progress{"starting", 0};
  running_[name] = std::thread([thread = std::move(thread), record] { thread(record); });
  return TemplateView{record, Progress{"starting", 0}};
}

Result<TemplateView> Catalog::import(const std::string& name, const std::string& sourceText, const std::string& owner) {
  MOAT_TRY(checkName(name));
  MOAT_ASSIGN(Source source, parseSource(sourceText));
  store::TemplateRecord record;
  record.name = name;
  record.source = sourceText;
  record.state = store::TemplateState::kImporting;
  record.owner = owner;
  MOAT_ASSIGN(std::string suffix, randomHex(6));
  // Not the name: skopeo and umoci read "oci:PATH:TAG" up to the first colon.
  const std::string workDir = imagesDir() + "/.partial-" + suffix;
  bool made = false;
  auto prepare = [&]() -> Status {
    MOAT_TRY(os::makeDirs(imagesDir(), 0700, 0700));
    if (::mkdir(workDir.c_str(), 0700) != 0) return Error::fromErrno("mkdir " + workDir);
    made = true;
    return {};
  };
  auto started = start(record, prepare, [this, source, workDir](store::TemplateRecord r) { run(r, source, workDir); });
  if (!started.ok() && made) (void)os::removeTree(workDir);
  return started;
}

Result<TemplateView> Catalog::build(const std::string& name, const std::string& base, const std::string& owner,
                                    BuildWork work) {
  MOAT_TRY(checkName(name));
  store::TemplateRecord record;
  record.name = name;
  record.source = "build:" + base;
  record.state = store::TemplateState::kBuilding;
  record.owner = owner;
  return start(
      record, [] { return Status{}; }, [this, work = std::move(work)](store::TemplateRecord r) { runBuild(r, work); });
}

void Catalog::setProgress(const std::string& name, const std::string& stage, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  progress_[name] = Progress{stage, bytes};
}

void Catalog::run(store::TemplateRecord record, Source source, std::string workDir) {
  ImportJob job;
  job.source = source;
  job.workDir = workDir;
  job.limits = config_.limits;
  job.progress = [this, &record](const std::string& stage, uint64_t bytes) { setProgress(record.name, stage, bytes); };
  job.stopping = [this] { return stopping_.load(); };
  auto imported = importImage(job);
  Status placed;
  if (imported.ok()) {
    // In place in one step: the name's directory exists only complete.
    const std::string final = imagesDir() + "/" + record.name;
    if (::rename(imported->rootfs.c_str(), final.c_str()) != 0) {
      placed = Error::fromErrno("move the template into " + final);
    }
  }
  Status removed = os::removeTree(workDir);
  if (!removed.ok()) moat::log::warnf("removing %s: %s\n", workDir.c_str(), removed.error().message().c_str());
  if (imported.ok() && placed.ok()) {
    record.state = store::TemplateState::kReady;
    record.config = configJson(imported->config).dump();
    record.sizeBytes = imported->sizeBytes;
  } else {
    const Error& e = imported.ok() ? placed.error() : imported.error();
    record.state = store::TemplateState::kFailed;
    record.errorCode = stopping_ ? "interrupted" : codeName(e.code);
    record.errorMessage = stopping_ ? "moatd stopped during the import; its partial files were removed" : e.message();
  }
  finish(record);
}

void Catalog::runBuild(store::TemplateRecord record, BuildWork work) {
  auto built = work([this, &record](const std::string& stage) { setProgress(record.name, stage, 0); },
                    [this] { return stopping_.load(); });
  if (built.ok()) {
    nlohmann::json config = configJson(built->config);
    config["snapshot"] = built->snapshot;
    record.state = store::TemplateState::kReady;
    record.config = config.dump();
  } else {
    record.state = store::TemplateState::kFailed;
    record.errorCode = stopping_ ? "interrupted" : codeName(built.error().code);
    record.errorMessage =
        stopping_ ? "moatd stopped during the build: " + built.error().message() : built.error().message();
  }
  finish(record);
}

void Catalog::finish(store::TemplateRecord& record) {
  Status s = store_.updateTemplate(record);
  if (!s.ok()) moat::log::warnf("template %s: %s\n", record.name.c_str(), s.error().message().c_str());
  if (finished_) finished_(record);
  std::lock_guard lock(mutex_);
  progress_.erase(record.name);
  auto it = running_.find(record.name);
  if (it != running_.end()) {
    finishedThreads_.push_back(std::move(it->second));
    running_.erase(it);
  }
}

Result<std::vector<TemplateView>> Catalog::list() {
  MOAT_ASSIGN(auto records, store_.listTemplates());
  std::vector<TemplateView> out;
  std::lock_guard lock(mutex_);
  for (auto& r : records) {
    TemplateView v{std::move(r), std::nullopt};
    if (auto it = progress_.find(v.record.name); it != progress_.end()) v.progress = it->second;
    out.push_back(std::move(v));
  }
  return out;
}

Result<TemplateView> Catalog::get(const std::string& name) {
  MOAT_ASSIGN(auto record, store_.getTemplate(name));
  if (!record) return Error::make(Code::kNotFound, "no template " + name);
  TemplateView v{std::move(*record), std::nullopt};
  std::lock_guard lock(mutex_);
  if (auto it = progress_.find(name); it != progress_.end()) v.progress = it->second;
  return v;
}

Status Catalog::remove(const std::string& name) {
  auto held = use_.exclusive(name);
  MOAT_ASSIGN(auto record, store_.getTemplate(name));
  if (!record) return Error::make(Code::kNotFound, "no template " + name);
  if (record->state == store::TemplateState::kImporting || record->state == store::TemplateState::kBuilding) {
    return Error::make(Code::kConflict,
                       "template " + name + " is " + stateName(record->state) + "; wait for it to end");
  }
  for (const auto& pooled : config_.warmPoolTemplates) {
    if (pooled == name)
      return Error::make(Code::kConflict, "template " + name + " is used by a warm pool (moatd --warm-pool)");
  }
  MOAT_ASSIGN(auto users, store_.templateUsers(name));
  if (!users.empty()) {
    std::string list;
    for (size_t i = 0; i < users.size() && i < 5; ++i) list += (i ? ", " : "") + users[i];
    if (users.size() > 5) list += " and " + std::to_string(users.size() - 5) + " more";
    return Error::make(Code::kConflict, "template " + name + " is in use by " + list);
  }
  // A built template's snapshot goes first: a template record naming a
  // snapshot that is gone would only fail creates.
  const std::string snapshot = builtSnapshot(*record);
  if (!snapshot.empty() && dropSnapshot_) {
    Status dropped = dropSnapshot_(snapshot);
    if (!dropped.ok() && dropped.error().code != Code::kNotFound) return dropped.error();
  }
  // Out of the name first (environments can no longer find it), then gone.
  const std::string dir = imagesDir() + "/" + name;
  if (os::exists(dir)) {
    MOAT_ASSIGN(std::string suffix, randomHex(6));
    const std::string doomed = imagesDir() + "/.deleting-" + suffix;
    if (::rename(dir.c_str(), doomed.c_str()) != 0) return Error::fromErrno("move " + dir + " aside");
    MOAT_TRY(store_.deleteTemplate(name));
    return os::removeTree(doomed);
  }
  return store_.deleteTemplate(name);
}

Result<Defaults> Catalog::defaultsFor(const std::string& name) {
  Defaults d;
  if (!validName(name)) return d;  // host, or a directory
  MOAT_ASSIGN(auto record, store_.getTemplate(name));
  if (!record) return Error::make(Code::kNotFound, "unknown template '" + name + "' (moat template ls lists them)");
  if (record->state != store::TemplateState::kReady) {
    return Error::make(
        Code::kConflict,
        "template " + name + " is " + stateName(record->state) +
            (record->state == store::TemplateState::kFailed ? ": " + record->errorMessage : " (not ready yet)"));
  }
  d.named = true;
  d.config = configFromJson(nlohmann::json::parse(record->config, nullptr, false));
  d.snapshot = builtSnapshot(*record);
  return d;
}

}  // namespace moat::templates
