// moatd: the environments service. See docs/API.md.
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "api/api.h"
#include "api/auth.h"
#include "api/http.h"
#include "api/keys.h"
#include "audit/log.h"
#include "backend/microvm/backend.h"
#include "backend/namespaces/backend.h"
#include "backend/namespaces/spawner.h"
#include "backend/router.h"
#include "common/log.h"
#include "common/process_args.h"
#include "common/sanitizer.h"
#include "daemon/flags.h"
#include "egress/controller.h"
#include "gate/approvals.h"
#include "gate/permissions.h"
#include "isolation/seccomp/policy.h"
#include "manager/environment_manager.h"
#include "moat_version.h"
#include "os/file.h"
#include "os/process.h"
#include "os/security.h"
#include "os/tree.h"
#include "store/sqlite/sqlite_store.h"
#include "templates/catalog.h"

namespace {

int fail(const std::string& message) {
  moat::log::errorf("%s\n", message.c_str());
  return 1;
}

// policy/seccomp/moatd.policy on every thread of this process.
moat::Status installOwnSeccompProfile() {
  MOAT_ASSIGN(auto policy, moat::isolation::seccomp::parsePolicy(moat::isolation::seccomp::moatdPolicyText()));
#if MOAT_ASAN
  // A sanitizer build (make sanitize) keeps ptrace: LeakSanitizer stops
  // moatd's threads with it at exit to look for leaks.
  std::erase_if(policy.rules, [](const auto& rule) { return rule.syscall == "ptrace"; });
#endif
  MOAT_ASSIGN(auto program, moat::isolation::seccomp::compile(policy));
  return moat::os::installSeccomp(program.filter, true);
}

// What a named template's image config means for its environments' commands
// (docs/TEMPLATES.md): Env under the creator's own variables, HOME (and
// USER) of the image's user unless Env sets them, WorkingDir, uid and gid.
moat::manager::TemplateDefaults templateDefaults(const moat::templates::Defaults& d) {
  moat::manager::TemplateDefaults out;
  if (!d.named) return out;
  for (const auto& e : d.config.env) {
    auto eq = e.find('=');
    if (eq != std::string::npos) out.env[e.substr(0, eq)] = e.substr(eq + 1);
  }
  if (d.config.uid != 0) {
    if (!d.config.home.empty()) out.env.emplace("HOME", d.config.home);
    std::string user = d.config.user.substr(0, d.config.user.find(':'));
    if (!user.empty() && user.find_first_not_of("0123456789") != std::string::npos) {
      out.env.emplace("USER", user);
      out.env.emplace("LOGNAME", user);
    }
  }
  out.cwd = d.config.workingDir;
  out.uid = d.config.uid;
  out.gid = d.config.gid;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moat;
  rememberProcessArgs(argc, argv);
  const char* stateEnv = std::getenv("MOAT_STATE");
  std::string stateDir = stateEnv && *stateEnv ? stateEnv : "/var/lib/moat";
  auto flags = daemon::parseDaemonFlags(std::vector<std::string>(argv + 1, argv + argc), stateDir,
                                        static_cast<double>(os::totalMemoryMb()));
  if (!flags.ok() && flags.error().code == Code::kUsage) {
    std::fprintf(stderr, "moatd: %s\n%s", flags.error().context.c_str(), daemon::daemonUsage());
    return 2;
  }
  if (!flags.ok()) return fail(flags.error().context);
  log::configure("moatd", flags->logLevel, flags->logFormat);
  if (flags->version) {
    std::puts("moatd " MOAT_VERSION);
    return 0;
  }
  if (flags->help) {
    std::fputs(daemon::daemonUsage(), stdout);
    return 0;
  }
  stateDir = flags->stateDir;
  const std::string listen = flags->listen;
  const int64_t approvalTimeoutS = flags->approvalTimeoutS;
  const unsigned long keyRate = flags->keyRate;
  manager::ManagerConfig config = flags->manager;
  audit::LogOptions auditOptions = flags->audit;
  egress::EgressConfig egressConfig = flags->egress;
  api::ServerLimits serverLimits = flags->server;
  const bool egressOn = flags->egressOn;
  if (::geteuid() != 0) return fail("needs root (it creates namespaces, cgroups and mounts)");
  if (stateDir.empty() || stateDir[0] != '/') return fail("--state must be an absolute path");
  if (auto s = os::makeDirs(stateDir, 0700); !s.ok()) return fail(s.error().message());
  if (flags->socketGroup) {
    // The group passes through to moatd.sock and opens nothing else here:
    // every other file of the state directory is root's alone (0600/0700).
    // Both on the directory itself (a state path that is a link: its target).
    auto dir = os::open(stateDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    Status s = dir.ok() ? os::chownFd(dir->get(), 0, *flags->socketGroup) : Status(dir.error());
    if (s.ok()) s = os::chmodDirectory(dir->get(), ".", 0710);
    if (!s.ok()) return fail("--socket-group: " + s.error().message());
  }
  // One moatd per state directory; a second one would fight over the spawner.
  auto lock = os::open(stateDir + "/moatd.lock", O_RDWR | O_CREAT, 0600);
  if (!lock.ok()) return fail(lock.error().message());
  if (::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) {
    return fail("another moatd is serving " + stateDir);
  }

  // An environment holds one descriptor in moatd and three in the spawner:
  // the usual soft limit of 1024 would end at about 340 environments. Both
  // run with the hard limit (the spawner inherits it below), raised to what
  // --max-environments needs where it is lower (root may, up to the
  // kernel's nr_open); environments start with the limit moatd was given.
  const rlim_t needed = 32 + 4 * static_cast<rlim_t>(config.maxEnvironments);
  auto files = os::raiseOpenFilesLimit(needed);
  if (!files.ok()) return fail(files.error().message());
  backend::namespaces::setEnvironmentOpenFilesLimit(files.value());
  auto now = os::openFilesLimit();
  const rlim_t hard = now.ok() ? now->rlim_max : files->rlim_max;
  if (hard != RLIM_INFINITY && hard < needed) {
    moat::log::warnf("the open files limit (%llu) leaves room for about %llu environments\n",
                     static_cast<unsigned long long>(hard),
                     static_cast<unsigned long long>(hard > 32 ? (hard - 32) / 4 : 0));
  }

  // Large buffers (an exec's output, its JSON answer: up to tens of MiB)
  // are mapped and unmapped on their own, so moatd's memory goes back down
  // once they are sent. glibc's default raises this threshold to 32 MiB
  // after the first large free, keeping such buffers in the heap for good.
  ::mallopt(M_MMAP_THRESHOLD, 256 << 10);

  // /proc inside environments shows their limits through LXCFS: started
  // now, when no moat process has yet, and the warning given here once.
  backend::namespaces::prepareLimitsView();

  // Before any thread: a new spawner is a fork of this process. An earlier
  // moatd's spawner, still running its environments, is reused.
  auto spawner = backend::namespaces::Spawner::connectOrStart(stateDir + "/spawner.sock");
  if (!spawner.ok()) return fail(spawner.error().message());

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // threads inherit; sigwait below
  ::signal(SIGPIPE, SIG_IGN);

  // A failure before serving must not leave a spawner behind that runs no
  // environment, nor the egress namespace (a spawner that runs some is a
  // previous moatd's: it and the namespace its environments use stay).
  std::unique_ptr<egress::Controller> egress;
  // (Declared before the audit log it records to: stopped here, before
  // that goes.)
  auto failEarly = [&](const std::string& message) {
    if (egress) egress->stop();
    auto owned = spawner.value()->list();
    if (owned.ok() && owned->empty()) {
      (void)spawner.value()->shutdown();
      if (egress) (void)egress->removeNamespace();
    }
    return fail(message);
  };
  // moatd's own seccomp profile, on every thread (TSYNC; the spawner,
  // forked above, creates environments and is not under it): see
  // policy/seccomp/moatd.policy and docs/SECURITY.md.
  if (Status confined = installOwnSeccompProfile(); !confined.ok()) {
    return failEarly("moatd's seccomp profile: " + confined.error().message());
  }
  auto token = api::loadOrCreateMasterToken(stateDir);
  if (!token.ok()) return failEarly(token.error().message());
  auto store = store::openSqliteStore(stateDir + "/moat.db");
  if (!store.ok()) return failEarly(store.error().message());
  // Outlives the manager, which records until its last destroy; writes
  // what is queued when it goes.
  auto auditLog = audit::Log::open(*store.value(), auditOptions);
  if (!auditLog.ok()) return failEarly("audit log: " + auditLog.error().message());

  config.stateDir = stateDir;
  bool stopEverything = false;
  // The egress proxy asks the gate (in the API) about hosts off an
  // allowlist; it serves before the API exists, so through a pointer.
  std::atomic<api::Api*> apiForEgress{nullptr};
  if (egressOn) {
    egressConfig.stateDir = stateDir;
    auto started = egress::Controller::start(
        egressConfig, *auditLog->get(),
        [&apiForEgress](const std::string& id, const std::string& host, uint16_t port, bool listed) {
          api::Api* a = apiForEgress.load();
          return a ? a->networkGate(id, host, port, listed) : egress::GateAnswer{false, "moatd is not serving"};
        },
        [&apiForEgress](const std::string& id, const std::string& host, bool listed) {
          api::Api* a = apiForEgress.load();
          return a ? a->networkProbe(id, host, listed) : egress::GateProbeAnswer::kDeny;
        });
    if (!started.ok()) {
      return failEarly("egress: " + started.error().message() +
                       " (moatd --no-egress runs without network access for environments)");
    }
    egress = std::move(started.value());
  }
  // Named templates (docs/TEMPLATES.md): outlive the manager, which asks
  // them for every create.
  templates::CatalogConfig catalogConfig;
  catalogConfig.stateDir = stateDir;
  catalogConfig.limits = flags->templateLimits;
  for (const auto& pool : config.warmPools) catalogConfig.warmPoolTemplates.push_back(pool.templateName);
  templates::Catalog catalog(catalogConfig, *store.value());
  if (auto s = catalog.recover(); !s.ok()) return failEarly("templates: " + s.error().message());
  catalog.onFinished([log = auditLog->get()](const store::TemplateRecord& r) {
    nlohmann::json data = {{"template", r.name}, {"source", r.source}, {"state", store::stateName(r.state)}};
    if (r.state == store::TemplateState::kFailed) data["error"] = r.errorMessage;
    if (r.state == store::TemplateState::kReady) data["size_bytes"] = r.sizeBytes;
    const bool built = r.source.rfind("build:", 0) == 0;
    log->record(
        r.state == store::TemplateState::kReady ? (built ? "template.built" : "template.imported") : "template.failed",
        "", r.owner, std::move(data));
  });
  {
    backend::namespaces::NamespacesBackend namespaces(*spawner.value(), stateDir);
    // MicroVMs (docs/MICROVM.md): what this host lacks for them is said
    // when one is asked for, and by /healthz.
    backend::microvm::MicroVmBackend microvm(stateDir, backend::microvm::probeHost(config.microvmAccel),
                                             std::chrono::seconds(flags->microvmBootWaitS), flags->microvmSavedGuests);
    backend::Router backend(namespaces, &microvm, microvm.host().missing);
    config.microvmMissing = microvm.host().available ? "" : microvm.host().missing;
    if (microvm.host().available) {
      // "auto" chosen: what each microVM's record names.
      config.microvmAccel = microvm.host().kvm ? "kvm" : "tcg";
      moat::log::infof("microVMs run on %s: %s\n", config.microvmAccel.c_str(), microvm.host().accelWhy.c_str());
    }
    if (config.defaultIsolation == backend::Isolation::kMicroVm && !microvm.host().available) {
      return failEarly("--isolation microvm: this host runs no microVMs: " + microvm.host().missing);
    }
    for (const auto& pool : config.warmPools) {
      if (pool.isolation == backend::Isolation::kMicroVm && !microvm.host().available) {
        return failEarly("--warm-pool ...,isolation=microvm: this host runs no microVMs: " + microvm.host().missing);
      }
    }
    manager::EnvironmentManager manager(config, *store.value(), backend, auditLog->get());
    manager.setEgress(egress.get());
    manager.setTemplates({[&catalog](const std::string& name) -> Result<manager::TemplateDefaults> {
                            MOAT_ASSIGN(templates::Defaults d, catalog.defaultsFor(name));
                            manager::TemplateDefaults out = templateDefaults(d);
                            if (!d.snapshot.empty()) {
                              out.snapshot = d.snapshot;
                              out.snapshotOwner = templates::snapshotOwner(name);
                            }
                            return out;
                          },
                          [&catalog](const std::string& name) { return catalog.hold(name); }});
    // Until serving, a failure must leave the environments as they are.
    if (auto s = manager.recoverAfterRestart(); !s.ok()) {
      manager.detach();
      return failEarly("re-attaching to the spawner's environments: " + s.error().message());
    }
    api::Keys keys(*store.value());
    gate::ApprovalCenter approvals(*store.value());
    if (auto s = approvals.recover(); !s.ok()) {
      manager.detach();
      return failEarly("expiring the approvals a previous moatd left pending: " + s.error().message());
    }
    manager.onEnded([&approvals, log = auditLog->get()](const std::string& id, const std::string& reason) {
      approvals.closeEnvironment(id, reason);
      log->closeEnvironment(id);  // what it caused and was only counted is written
    });
    api::ApiOptions apiOptions;
    apiOptions.stateDir = stateDir;
    apiOptions.microvmAvailable = microvm.host().available;
    apiOptions.microvmAccel = config.microvmAccel;
    apiOptions.microvmAccelWhy = microvm.host().accelWhy;
    apiOptions.approvalTimeoutMs = approvalTimeoutS * 1000;
    apiOptions.keyRequestsPerSecond = static_cast<double>(keyRate);
    apiOptions.agentLocalProviders = flags->agentLocalProviders;
    apiOptions.agentKeyTokensPerDay = flags->agentKeyTokens;
    apiOptions.accessLog = flags->accessLog;
    if (flags->board) {
      apiOptions.boardDir = flags->boardDir;
      if (apiOptions.boardDir.empty()) {
        auto bin = os::selfDirectory();
        if (bin.ok()) apiOptions.boardDir = bin.value() + "/../share/moat/board";
      }
    }
    apiOptions.previewDomain = flags->previewDomain;
    apiOptions.portLimits.idle = std::chrono::seconds(flags->portTimeoutS);
    apiOptions.maxPortConnections = std::max<size_t>(1, flags->server.maxConnections / 2);
    apiOptions.maxPortConnectionsPerOwner = std::max<size_t>(1, flags->server.maxConnections / 4);
    api::Api api(manager, keys, approvals, token.value(), apiOptions, auditLog->get());
    api.setTemplates(&catalog);
    catalog.onDropSnapshot([&manager](const std::string& id) { return manager.deleteSnapshot(id, "moatd"); });
    apiForEgress = &api;
    // And an agent run in it stops (reset before the API goes, below).
    manager.onEnded([&approvals, &api, log = auditLog->get()](const std::string& id, const std::string& reason) {
      approvals.closeEnvironment(id, reason);
      log->closeEnvironment(id);
      api.agentEnvironmentEnded(id, reason);
      api.portsEnvironmentEnded(id);  // its previews end with it
    });
    manager.setExecGate(
        [&api](const std::string& id, const init::ExecCheck& check, manager::InitConnection::ExecAnswer answer) {
          api.execCheck(id, check, std::move(answer));
        },
        [&api](const std::string& id) { return api.execPolicyFor(id); },
        [&api](const std::string& id, const init::ExecReport& report) { api.execReport(id, report); });
    manager.refreshExecPolicies();  // the environments re-attached before the gate was set
    api.endOrphanedMcpEnvironments();
    api.endOrphanedTemplateBuilds();
    api.endOrphanedAgentEnvironments();
    api::HttpServer server([&api](const api::HttpRequest& r) { return api.handle(r); },
                           [&api](const api::HttpRequest& head) { return api.preflight(head); }, serverLimits,
                           [&api] { api.countRefusedConnection(); });
    for (auto s : {server.listenUnix(stateDir + "/moatd.sock", flags->socketGroup), server.listenTcp(listen)}) {
      if (!s.ok()) {
        manager.detach();
        apiForEgress = nullptr;
        return failEarly(s.error().message());
      }
    }
    api.setPreviewPort(server.tcpPort());
    // The address it listens on, as given (0.0.0.0 is every address).
    const std::string host = listen.substr(0, listen.rfind(':'));
    moat::log::infof("serving http://%s:%d and unix:%s/moatd.sock (state %s)%s\n", host.c_str(), server.tcpPort(),
                     stateDir.c_str(), stateDir.c_str(),
                     host == "0.0.0.0" || host == "[::]" ? "; every address of this host" : "");
    std::fflush(stderr);
    int sig = 0;
    ::sigwait(&signals, &sig);
    bool keep = sig == SIGUSR1;
    moat::log::infof("%s, stopping%s\n", ::strsignal(sig),
                     keep ? " (environments keep running for the next moatd)" : "");
    // A second signal means now: what the stop started still ends (the
    // spawner destroys every environment it runs, the egress namespace
    // goes), without waiting for answers and streams. After SIGUSR1 the
    // environments stay, as asked.
    std::thread([signals, keep, &spawner, &egress, &microvm] {
      int again = 0;
      ::sigwait(&signals, &again);
      moat::log::warnf("%s again, ending now%s\n", ::strsignal(again),
                       keep ? "" : " (the spawner destroys the environments)");
      std::fflush(stderr);
      if (!keep) {
        microvm.endAll();                   // QEMUs outlive moatd otherwise
        (void)spawner.value()->shutdown();  // after a spawner call in flight
        if (egress) (void)egress->removeNamespace();
      }
      ::_exit(1);
    }).detach();
    server.beginStop();      // no request starts; those in progress still answer
    api.stopWaiting();       // requests waiting under the key rate limit: 503 now
    api.stopAgentRuns();     // agent runs end as stopped (their environments go)
    api.closeMcpSessions();  // their own environments go with them
    catalog.interrupt();     // builds end as interrupted (their execs end next)
    manager.interrupt();     // waiting execs end; nothing new starts
    approvals.shutdown();    // requests waiting for a person end too
    api.waitForExecAsks();   // and programs waiting for one (refused now)
    // Builds have ended their steps by now; joined here, before the hooks
    // below change under them (a build's end destroys its environment,
    // which calls them: moatd crashed when that raced the changes). Imports
    // in progress end failed, their files removed.
    catalog.stop();
    manager.setExecGate({}, {}, {});  // the API goes before the manager does
    manager.onEnded({});              // the approvals go before the manager does
    auditLog.value()->interrupt();    // event streams end
    server.stop();
    apiForEgress = nullptr;
    if (egress) egress->stop();  // no connection outlives the API it asks
    if (keep) {
      manager.detach();
    } else {
      stopEverything = true;
    }
  }  // unless detached, the manager destroys its environments
  if (stopEverything) {
    (void)spawner.value()->shutdown();
    if (egress) (void)egress->removeNamespace();
  }
  return 0;
}
