// moatd: the environments service. See docs/API.md.
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "api/api.h"
#include "api/auth.h"
#include "api/http.h"
#include "api/warm_pool_flag.h"
#include "common/sanitizer.h"
#include "api/keys.h"
#include "audit/log.h"
#include "backend/namespaces/spawner.h"
#include "common/process_args.h"
#include "egress/controller.h"
#include "manager/environment_manager.h"
#include <nlohmann/json.hpp>

#include "gate/approvals.h"
#include "gate/permissions.h"
#include "os/file.h"
#include "os/process.h"
#include "os/security.h"
#include "isolation/seccomp/policy.h"
#include "store/sqlite/sqlite_store.h"

namespace {

constexpr const char* kUsage = R"(usage: moatd [--state DIR] [--listen HOST:PORT] [--warm-pool N[:SPEC]]...
             [--max-environments N] [--max-connections N] [--permissions FILE]
             [--approval-timeout S]
             [--audit-retention-days N] [--audit-max-events N] [--egress-hosts FILE]
             [--egress-ca-bundle FILE] [--egress-head-timeout S] [--no-egress]
             [--key-rate N]

  --state DIR             state directory (default $MOAT_STATE or /var/lib/moat)
  --listen HOST:PORT      TCP address (default 127.0.0.1:7070; port 0 picks one)
  --warm-pool N[:SPEC]    keep N environments ready (default 0): of the default
                          spec, or of SPEC, key=value pairs (template, cpus,
                          ram_mb, storage_gb, pids) joined by commas; repeatable,
                          one pool per (template, spec)
  --max-environments N    at most N environments at once, warm ones included
                          (1 to 100000, default 256); more is 429 capacity
  --max-connections N     at most N client connections at once (1 to 100000,
                          default 512): a newcomer takes the place of the one
                          idle longest; with all N busy it gets 503
  --permissions FILE      default permissions of new environments, as JSON
                          (docs/GATE.md; default: read_file, write_file and
                          run_command allow, network deny)
  --approval-timeout S    how long an action that asks a person waits for the
                          decision before it is denied (1 to 86400, default 120)
  --lossless-wait S       how long a lossless process (moat exec's) that nobody
                          follows any more, or yet, waits for a reader before
                          its output is dropped like any other's (1 to 86400,
                          default 30)
  --audit-retention-days N
                          prune audit events older than N days (default 30;
                          0 keeps them forever); a checkpoint event keeps the
                          chain verifiable
  --audit-max-events N    keep at most N audit events (default 1000000, 0.3 to
                          0.6 GB; 1000 to 1000000000, 0: no cap): beyond it the
                          oldest are pruned the same way, down to 9/10 of N
  --key-rate N            requests per second one API key may send (bursts of
                          2N; default 200; 0: no limit); more wait their turn,
                          up to 2 s, then are 429 capacity with a Retry-After
  --egress-hosts FILE     names the egress proxy resolves itself ("ADDRESS NAME..."
                          lines) before asking the host's resolver
  --egress-ca-bundle FILE CA certificates that upstream servers are verified
                          against (default: the system's)
  --egress-head-timeout S a request head, or a TLS ClientHello and handshake,
                          must reach the egress proxy whole within S seconds
                          (1 to 3600, default 30), however slowly it trickles
  --no-egress             no egress proxy: every environment stays on network
                          mode "none" (docs/EGRESS.md)

Always also serves <state>/moatd.sock. The master token is <state>/master-token.
SIGTERM/SIGINT stop moatd and destroy its environments. SIGUSR1 stops moatd
and leaves them running: the next moatd re-attaches (upgrades). After a crash
or kill -9 they keep running too.
)";

// A decimal number from `lo` to `hi`, or nothing (not digits, or out of range).
std::optional<uint64_t> number(const std::string& v, uint64_t lo, uint64_t hi) {
  if (v.empty() || v.size() > 10 || v.find_first_not_of("0123456789") != std::string::npos) return {};
  const uint64_t n = std::stoull(v);
  if (n < lo || n > hi) return {};
  return n;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "moatd: %s\n", message.c_str());
  return 1;
}

}  // namespace

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  using namespace moat;
  rememberProcessArgs(argc, argv);
  const char* stateEnv = std::getenv("MOAT_STATE");
  std::string stateDir = stateEnv && *stateEnv ? stateEnv : "/var/lib/moat";
  std::string listen = "127.0.0.1:7070";
  int64_t approvalTimeoutS = 120;
  unsigned long keyRate = 200;  // api::ApiOptions::keyRequestsPerSecond
  manager::ManagerConfig config;
  audit::LogOptions auditOptions;
  egress::EgressConfig egressConfig;
  api::ServerLimits serverLimits;
  bool egressOn = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--state" || a == "--listen") && i + 1 < argc) {
      (a == "--state" ? stateDir : listen) = argv[++i];
    } else if (a == "--warm-pool" && i + 1 < argc) {
      auto pool = api::parseWarmPoolFlag(argv[++i], static_cast<double>(os::totalMemoryMb()));
      if (!pool.ok()) return fail("--warm-pool needs " + pool.error().message());
      config.warmPools.push_back(pool.value());
    } else if (a == "--max-environments" && i + 1 < argc) {
      auto n = number(argv[++i], 1, 100000);
      if (!n) return fail("--max-environments needs a number from 1 to 100000");
      config.maxEnvironments = *n;
    } else if (a == "--max-connections" && i + 1 < argc) {
      auto n = number(argv[++i], 1, 100000);
      if (!n) return fail("--max-connections needs a number from 1 to 100000");
      serverLimits.maxConnections = *n;
    } else if (a == "--key-rate" && i + 1 < argc) {
      auto n = number(argv[++i], 0, 100000);
      if (!n) return fail("--key-rate needs a number of requests per second from 0 (no limit) to 100000");
      keyRate = *n;
    } else if (a == "--approval-timeout" && i + 1 < argc) {
      auto n = number(argv[++i], 1, 86400);
      if (!n) return fail("--approval-timeout needs a number of seconds from 1 to 86400");
      approvalTimeoutS = static_cast<int64_t>(*n);
    } else if (a == "--lossless-wait" && i + 1 < argc) {
      auto n = number(argv[++i], 1, 86400);
      if (!n) return fail("--lossless-wait needs a number of seconds from 1 to 86400");
      config.processLimits.losslessWaitMs = static_cast<int64_t>(*n) * 1000;
    } else if (a == "--permissions" && i + 1 < argc) {
      std::string path = argv[++i];
      auto text = os::readFile(path, 1u << 20);
      if (!text.ok()) return fail("--permissions: " + text.error().message());
      auto j = nlohmann::json::parse(text.value(), nullptr, false);
      if (j.is_discarded()) return fail("--permissions: " + path + " is not JSON");
      auto parsed = gate::Permissions::parse(j, gate::Permissions::defaults());
      if (!parsed.ok()) return fail("--permissions: " + path + ": " + parsed.error().context);
      config.defaultPermissions = parsed.value();
    } else if (a == "--audit-retention-days" && i + 1 < argc) {
      auto n = number(argv[++i], 0, 36500);
      if (!n) return fail("--audit-retention-days needs a number from 0 to 36500");
      auditOptions.retentionDays = static_cast<int64_t>(*n);
    } else if (a == "--audit-max-events" && i + 1 < argc) {
      auto n = number(argv[++i], 0, 1000000000);
      if (!n || (*n != 0 && *n < 1000)) {
        return fail("--audit-max-events needs 0 or a number from 1000 to 1000000000");
      }
      auditOptions.maxEvents = *n;
    } else if ((a == "--egress-hosts" || a == "--egress-ca-bundle") && i + 1 < argc) {
      std::string path = argv[++i];
      if (::access(path.c_str(), R_OK) != 0) return fail(a + ": cannot read " + path);
      (a == "--egress-hosts" ? egressConfig.hostsFile : egressConfig.upstreamCaBundle) = path;
    } else if (a == "--egress-head-timeout" && i + 1 < argc) {
      auto n = number(argv[++i], 1, 3600);
      if (!n) return fail("--egress-head-timeout needs a number of seconds from 1 to 3600");
      egressConfig.headTimeout = std::chrono::seconds(*n);
    } else if (a == "--no-egress") {
      egressOn = false;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "moatd: unknown argument %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (::geteuid() != 0) return fail("needs root (it creates namespaces, cgroups and mounts)");
  if (stateDir.empty() || stateDir[0] != '/') return fail("--state must be an absolute path");
  if (auto s = os::makeDirs(stateDir, 0700); !s.ok()) return fail(s.error().message());
  // One moatd per state directory; a second one would fight over the spawner.
  auto lock = os::open(stateDir + "/moatd.lock", O_RDWR | O_CREAT, 0600);
  if (!lock.ok()) return fail(lock.error().message());
  if (::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) {
    return fail("another moatd is serving " + stateDir);
  }

  // An environment holds one descriptor in moatd and three in the spawner:
  // the usual soft limit of 1024 would end at about 340 environments. Both
  // run with the hard limit (the spawner inherits it below); environments
  // start with the limit moatd was given.
  auto files = os::raiseOpenFilesLimit();
  if (!files.ok()) return fail(files.error().message());
  backend::namespaces::setEnvironmentOpenFilesLimit(files.value());
  if (rlim_t hard = files->rlim_max; hard != RLIM_INFINITY && hard < 32 + 3 * config.maxEnvironments) {
    std::fprintf(stderr, "moatd: the open files limit (%llu) leaves room for about %llu environments\n",
                 static_cast<unsigned long long>(hard),
                 static_cast<unsigned long long>(hard > 32 ? (hard - 32) / 3 : 0));
  }

  // Large buffers (an exec's output, its JSON answer: up to tens of MiB)
  // are mapped and unmapped on their own, so moatd's memory goes back down
  // once they are sent. glibc's default raises this threshold to 32 MiB
  // after the first large free, keeping such buffers in the heap for good.
  ::mallopt(M_MMAP_THRESHOLD, 256 << 10);

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
  // environment (one that runs some is a previous moatd's: it stays).
  auto failEarly = [&](const std::string& message) {
    auto owned = spawner.value()->list();
    if (owned.ok() && owned->empty()) (void)spawner.value()->shutdown();
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
  std::unique_ptr<egress::Controller> egress;
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
  {
    manager::EnvironmentManager manager(config, *store.value(), *spawner.value(), auditLog->get());
    manager.setEgress(egress.get());
    // Until serving, a failure must leave the environments as they are.
    if (auto s = manager.recoverAfterRestart(); !s.ok()) {
      manager.detach();
      return fail("re-attaching to the spawner's environments: " + s.error().message());
    }
    api::Keys keys(*store.value());
    gate::ApprovalCenter approvals(*store.value());
    if (auto s = approvals.recover(); !s.ok()) {
      manager.detach();
      return fail("expiring the approvals a previous moatd left pending: " + s.error().message());
    }
    manager.onEnded([&approvals, log = auditLog->get()](const std::string& id, const std::string& reason) {
      approvals.closeEnvironment(id, reason);
      log->closeEnvironment(id);  // what it caused and was only counted is written
    });
    api::ApiOptions apiOptions;
    apiOptions.stateDir = stateDir;
    apiOptions.approvalTimeoutMs = approvalTimeoutS * 1000;
    apiOptions.keyRequestsPerSecond = static_cast<double>(keyRate);
    api::Api api(manager, keys, approvals, token.value(), apiOptions, auditLog->get());
    apiForEgress = &api;
    manager.setExecGate(
        [&api](const std::string& id, const init::ExecCheck& check, manager::InitConnection::ExecAnswer answer) {
          api.execCheck(id, check, std::move(answer));
        },
        [&api](const std::string& id) { return api.execPolicyFor(id); },
        [&api](const std::string& id, const init::ExecReport& report) { api.execReport(id, report); });
    manager.refreshExecPolicies();  // the environments re-attached before the gate was set
    api.endOrphanedMcpEnvironments();
    api::HttpServer server([&api](const api::HttpRequest& r) { return api.handle(r); },
                           [&api](const api::HttpRequest& head) { return api.preflight(head); },
                           serverLimits, [&api] { api.countRefusedConnection(); });
    for (auto s : {server.listenUnix(stateDir + "/moatd.sock"), server.listenTcp(listen)}) {
      if (!s.ok()) {
        manager.detach();
        return fail(s.error().message());
      }
    }
    std::fprintf(stderr, "moatd: serving http://127.0.0.1:%d and unix:%s/moatd.sock (state %s)\n",
                 server.tcpPort(), stateDir.c_str(), stateDir.c_str());
    std::fflush(stderr);
    int sig = 0;
    ::sigwait(&signals, &sig);
    bool keep = sig == SIGUSR1;
    std::fprintf(stderr, "moatd: %s, stopping%s\n", ::strsignal(sig),
                 keep ? " (environments keep running for the next moatd)" : "");
    // A second signal means now.
    std::thread([signals] {
      int again = 0;
      ::sigwait(&signals, &again);
      std::fprintf(stderr, "moatd: %s again, exiting at once\n", ::strsignal(again));
      ::_exit(1);
    }).detach();
    server.beginStop();  // no request starts; those in progress still answer
    api.stopWaiting();  // requests waiting under the key rate limit: 503 now
    api.closeMcpSessions();  // their own environments go with them
    manager.interrupt();  // waiting execs end; nothing new starts
    approvals.shutdown();  // requests waiting for a person end too
    api.waitForExecAsks();  // and programs waiting for one (refused now)
    manager.setExecGate({}, {}, {});  // the API goes before the manager does
    manager.onEnded({});   // the approvals go before the manager does
    auditLog.value()->interrupt();  // event streams end
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
