#include "backend/namespaces/backend.h"

#include <fcntl.h>

#include "isolation/fs/rootfs.h"
#include "isolation/fs/storage_pool.h"
#include "isolation/fs/template.h"
#include "os/file.h"

namespace moat::backend::namespaces {

Result<Backend::Created> NamespacesBackend::create(const Spec& spec) {
  if (spec.withMemory) {
    return Error::make(Code::kUnsupported, "snapshot " + spec.fromSnapshot +
                                               " holds no memory a namespace "
                                               "environment can go on from");
  }
  EnvironmentSpec full;
  full.stateDir = stateDir_;
  full.id = spec.id;
  full.templateName = spec.templateName;
  full.cpus = spec.cpus;
  full.memoryMb = spec.memoryMb;
  full.pids = spec.pids;
  full.storageGb = spec.storageGb;
  full.fromSnapshot = spec.fromSnapshot;
  full.snapshotHostBase = spec.snapshotHostBase;
  // pid 1 is a fresh exec of moat-init: nothing of moatd's memory in it.
  full.initMode = InitMode::kExec;
  MOAT_ASSIGN(auto made, spawner_.create(full));
  return Created{std::move(made.id), std::move(made.control)};
}

Result<Usage> NamespacesBackend::usage(const std::string& id) {
  auto asked = spawner_.usage(id);
  // A spawner started by an older moatd (it outlives moatd) does not know
  // the request.
  if (!asked.ok() && asked.error().code == Code::kProtocol &&
      asked.error().context.find("unknown spawner request") != std::string::npos) {
    return Error::make(Code::kUnsupported,
                       "this host's spawner predates usage reporting: it answers once moatd and its environments "
                       "have been restarted");
  }
  MOAT_ASSIGN(isolation::cgroup::Usage counted, std::move(asked));
  Usage usage;
  usage.cpuKnown = counted.cpuUsec.has_value();
  usage.cpuUsec = counted.cpuUsec.value_or(0);
  usage.memoryBytes = counted.memoryBytes;
  usage.pids = counted.pids;
  usage.oomKills = counted.oomKills;
  countStorage(stateDir_, id, usage);
  return usage;
}

Status NamespacesBackend::deleteSnapshot(const std::string& name) {
  return isolation::fs::StoragePool::destroySnapshotIn(stateDir_, name);
}

Result<Changes> NamespacesBackend::changes(const ChangesRequest& request) {
  MOAT_ASSIGN(isolation::fs::StoragePool pool, isolation::fs::StoragePool::open(stateDir_));
  MOAT_ASSIGN(isolation::fs::Template tmpl, isolation::fs::resolveTemplate(request.templateName, stateDir_));
  // The layers' tops are moat's own names; below them, compareLayers
  // follows nothing.
  auto openUpper = [](const std::string& volume) {
    return os::open(volume + "/upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  };
  MOAT_ASSIGN(UniqueFd now, openUpper(pool.volumePath(request.id)));
  // What moat wrote into it is not the environment's doing (its hostname
  // is its id).
  isolation::fs::LayerChangeLimits limits = request.limits;
  for (const auto& [name, content] : isolation::fs::environmentFiles(request.id))
    limits.baseline["/etc/" + name] = content;
  limits.baseline["/workspace"] = "/";
  limits.baseline["/tmp"] = "/";
  isolation::fs::LayerView before{-1, tmpl.lower.get()};
  UniqueFd then;
  if (!request.snapshot.empty()) {
    MOAT_ASSIGN(then, openUpper(pool.snapshotPath(request.snapshot)));
    before.upperFd = then.get();
  }
  return isolation::fs::compareLayers(before, isolation::fs::LayerView{now.get(), tmpl.lower.get()}, limits);
}

Result<std::vector<std::string>> NamespacesBackend::snapshots() {
  return isolation::fs::StoragePool::snapshotsIn(stateDir_);
}

}  // namespace moat::backend::namespaces
