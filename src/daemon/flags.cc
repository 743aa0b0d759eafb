#include "daemon/flags.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "backend/microvm/accel.h"
#include "daemon/warm_pool_flag.h"
#include "gate/permissions.h"
#include "os/file.h"
#include "os/users.h"

namespace moat::daemon {

namespace {

constexpr const char* kUsage = R"(usage: moatd [--state DIR] [--listen HOST:PORT] [--warm-pool N[:SPEC]]...
             [--max-environments N] [--max-connections N] [--permissions FILE]
             [--approval-timeout S]
             [--audit-retention-days N] [--audit-max-events N] [--egress-hosts FILE]
             [--egress-ca-bundle FILE] [--egress-head-timeout S] [--no-egress]
             [--key-rate N] [--agent-local-providers] [--agent-key-tokens N]
             [--board-dir DIR | --no-board] [--preview-domain NAME] [--port-timeout S]
             [--template-max-bytes N] [--template-max-files N] [--template-timeout S]
             [--socket-group GROUP] [--log-level L] [--log-format text|json] [--access-log]
             [--isolation namespaces|microvm] [--microvm-accel auto|kvm|tcg]
             [--microvm-boot-wait S] [--microvm-saved-guests N]
       moatd --version | --help

  --state DIR             state directory (default $MOAT_STATE or /var/lib/moat)
  --listen HOST:PORT      TCP address (default 127.0.0.1:7070; port 0 picks one)
  --warm-pool N[:SPEC]    keep N environments ready (default 0): of the default
                          spec, or of SPEC, key=value pairs (template, cpus,
                          ram_mb, storage_gb, pids, isolation) joined by
                          commas; repeatable, one pool per (template, spec)
  --socket-group GROUP    members of GROUP may connect to <state>/moatd.sock
                          (mode 0660; the state directory 0710, its other
                          files root's alone); each still needs an API key
                          of their own (docs/INSTALL.md)
  --log-level L           what moatd writes to stderr: debug, info (the
                          default), warn or error and above
  --log-format F          text (the default: "moatd: ..." lines) or json (one
                          object per line: time, level, msg, and fields)
  --access-log            a line per API request at level info: method, path
                          (no query), status, duration, caller, peer
  --max-environments N    at most N environments at once, warm ones included
                          (1 to 100000, default 256); more is 429 capacity
  --max-connections N     at most N client connections at once (1 to 100000,
                          default 512): a newcomer takes the place of the one
                          idle longest; with all N busy it gets 503. Clients
                          other than root on the unix socket get all but
                          N/16, kept for root;
                          port and preview connections N/2, N/4 per owner
  --permissions FILE      default permissions of new environments, as JSON
                          (docs/GATE.md; default: read_file, write_file and
                          run_command allow, network deny)
  --approval-timeout S    how long an action that asks a person waits for the
                          decision before it is denied (1 to 86400, default 120)
  --lossless-wait S       how long a lossless process (moat exec's) that nobody
                          follows any more, or yet, waits for a reader before
                          its output is dropped like any other's (1 to 86400,
                          default 30)
  --back-to-disk-after S  how long a microVM checkpointed to disk that a file
                          read brought back into RAM stays there, paused,
                          after the last read (1 to 86400, default 60)
  --audit-retention-days N
                          prune audit events older than N days (default 30;
                          0 keeps them forever); a checkpoint event keeps the
                          chain verifiable
  --audit-max-events N    keep at most N audit events (default 1000000, 0.3 to
                          0.6 GB; 1000 to 1000000000, 0: no cap): beyond it the
                          oldest are pruned the same way, down to 9/10 of N
  --template-max-bytes N  an imported image's files may hold at most N bytes
                          (default 8 GiB; 1 MiB to 1 TiB); docs/TEMPLATES.md
  --template-max-files N  ... and at most N files, directories and links
                          (default 1000000; 10 to 100000000)
  --template-timeout S    an import ends failed after S seconds (default 1800)
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
  --agent-local-providers API keys' agent runs may call model providers on
                          moatd's own host and networks (a local Ollama); by
                          default only the master token's may (docs/AGENTS.md)
  --agent-key-tokens N    tokens one API key's agent runs may use per UTC day,
                          in all (default 0: no limit); beyond, its runs stop
                          and new ones are 429 capacity
  --board-dir DIR         the board's page and assets, served at / (default:
                          share/moat/board beside moatd's bin/; docs/BOARD.md)
  --no-board              serve no board (/ is 404)
  --preview-domain NAME   preview URLs are http://<secret>.NAME:<port>/
                          (default preview.localhost; docs/PORTS.md): requests
                          whose Host is under NAME go to a preview, never to
                          the API
  --isolation MODE        what a create that names no spec.isolation gets:
                          namespaces (the default) or microvm (docs/MICROVM.md)
  --microvm-accel A       what microVMs run on: auto (the default: KVM where a
                          probe boot under it works at the start, else TCG),
                          kvm, or tcg (emulated)
  --microvm-boot-wait S   a microVM whose guest has not answered S seconds
                          after QEMU started fails (1 to 3600, default 120)
  --microvm-saved-guests N
                          microVM creates restore a guest saved once per
                          template and machine, N of them kept at most (0 to
                          64, default 8; 0: every create boots; docs/MICROVM.md)
  --port-timeout S        the port proxy waits at most S seconds for a server
                          inside to answer, and ends a request silent that
                          long (1 to 3600, default 60; docs/PORTS.md)

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

Error invalid(const std::string& message) { return Error::make(Code::kInvalidArgument, message); }

// One flag: whether a value follows it, and what it does to the flags (an
// error names the flag and what it needs).
struct Flag {
  const char* name;
  bool takesValue;
  std::function<Status(const std::string& value, DaemonFlags& f, double hostMemoryMb)> apply;
};

// A flag whose value is a number from `lo` to `hi`; `needs` says what it is.
Flag numberFlag(const char* name, uint64_t lo, uint64_t hi, std::string needs,
                std::function<void(DaemonFlags&, uint64_t)> set) {
  return {name, true, [=](const std::string& v, DaemonFlags& f, double) -> Status {
            auto n = number(v, lo, hi);
            if (!n) return invalid(std::string(name) + " needs " + needs);
            set(f, *n);
            return {};
          }};
}

// A flag whose value is a file moatd must be able to read.
Flag readableFileFlag(const char* name, std::function<void(DaemonFlags&, const std::string&)> set) {
  return {name, true, [=](const std::string& path, DaemonFlags& f, double) -> Status {
            if (::access(path.c_str(), R_OK) != 0) return invalid(std::string(name) + ": cannot read " + path);
            set(f, path);
            return {};
          }};
}

Status permissionsFile(const std::string& path, DaemonFlags& f) {
  auto text = os::readFile(path, 1u << 20);
  if (!text.ok()) return invalid("--permissions: " + text.error().message());
  auto j = nlohmann::json::parse(text.value(), nullptr, false);
  if (j.is_discarded()) return invalid("--permissions: " + path + " is not JSON");
  auto parsed = gate::Permissions::parse(j, gate::Permissions::defaults());
  if (!parsed.ok()) return invalid("--permissions: " + path + ": " + parsed.error().context);
  f.manager.defaultPermissions = parsed.value();
  return {};
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> all = {
      {"--state", true,
       [](const std::string& v, DaemonFlags& f, double) -> Status { return f.stateDir = v, Status{}; }},
      {"--listen", true, [](const std::string& v, DaemonFlags& f, double) -> Status { return f.listen = v, Status{}; }},
      {"--warm-pool", true,
       [](const std::string& v, DaemonFlags& f, double hostMemoryMb) -> Status {
         auto pool = parseWarmPoolFlag(v, hostMemoryMb);
         if (!pool.ok()) return invalid("--warm-pool needs " + pool.error().message());
         f.manager.warmPools.push_back(pool.value());
         return {};
       }},
      numberFlag("--max-environments", 1, 100000, "a number from 1 to 100000",
                 [](DaemonFlags& f, uint64_t n) { f.manager.maxEnvironments = n; }),
      numberFlag("--max-connections", 1, 100000, "a number from 1 to 100000",
                 [](DaemonFlags& f, uint64_t n) { f.server.maxConnections = n; }),
      numberFlag("--key-rate", 0, 100000, "a number of requests per second from 0 (no limit) to 100000",
                 [](DaemonFlags& f, uint64_t n) { f.keyRate = n; }),
      numberFlag("--approval-timeout", 1, 86400, "a number of seconds from 1 to 86400",
                 [](DaemonFlags& f, uint64_t n) { f.approvalTimeoutS = static_cast<int64_t>(n); }),
      numberFlag(
          "--lossless-wait", 1, 86400, "a number of seconds from 1 to 86400",
          [](DaemonFlags& f, uint64_t n) { f.manager.processLimits.losslessWaitMs = static_cast<int64_t>(n) * 1000; }),
      numberFlag("--back-to-disk-after", 1, 86400, "a number of seconds from 1 to 86400",
                 [](DaemonFlags& f, uint64_t n) { f.manager.backToDiskAfterMs = static_cast<int64_t>(n) * 1000; }),
      {"--permissions", true, [](const std::string& v, DaemonFlags& f, double) { return permissionsFile(v, f); }},
      numberFlag("--audit-retention-days", 0, 36500, "a number from 0 to 36500",
                 [](DaemonFlags& f, uint64_t n) { f.audit.retentionDays = static_cast<int64_t>(n); }),
      {"--audit-max-events", true,
       [](const std::string& v, DaemonFlags& f, double) -> Status {
         auto n = number(v, 0, 1000000000);
         if (!n || (*n != 0 && *n < 1000))
           return invalid("--audit-max-events needs 0 or a number from 1000 to 1000000000");
         f.audit.maxEvents = *n;
         return {};
       }},
      numberFlag("--template-max-bytes", 1u << 20, 1ull << 40, "a number of bytes from 1048576 to 1099511627776",
                 [](DaemonFlags& f, uint64_t n) { f.templateLimits.maxBytes = n; }),
      numberFlag("--template-max-files", 10, 100000000, "a number from 10 to 100000000",
                 [](DaemonFlags& f, uint64_t n) { f.templateLimits.maxEntries = n; }),
      numberFlag("--template-timeout", 10, 86400, "a number of seconds from 10 to 86400",
                 [](DaemonFlags& f, uint64_t n) { f.templateLimits.timeout = std::chrono::seconds(n); }),
      readableFileFlag("--egress-hosts", [](DaemonFlags& f, const std::string& p) { f.egress.hostsFile = p; }),
      readableFileFlag("--egress-ca-bundle",
                       [](DaemonFlags& f, const std::string& p) { f.egress.upstreamCaBundle = p; }),
      numberFlag("--egress-head-timeout", 1, 3600, "a number of seconds from 1 to 3600",
                 [](DaemonFlags& f, uint64_t n) { f.egress.headTimeout = std::chrono::seconds(n); }),
      {"--no-egress", false,
       [](const std::string&, DaemonFlags& f, double) -> Status { return f.egressOn = false, Status{}; }},
      numberFlag("--agent-key-tokens", 0, 1000000000000ull, "a number of tokens from 0 to 10^12",
                 [](DaemonFlags& f, uint64_t n) { f.agentKeyTokens = n; }),
      {"--board-dir", true,
       [](const std::string& dir, DaemonFlags& f, double) -> Status {
         if (!os::isDirectory(dir)) return invalid("--board-dir: " + dir + " is not a directory");
         f.boardDir = dir;
         return {};
       }},
      {"--socket-group", true,
       [](const std::string& name, DaemonFlags& f, double) -> Status {
         auto gid = os::groupNamed(name);
         if (!gid.ok()) return Error::make(Code::kInvalidArgument, "--socket-group: " + gid.error().message());
         f.socketGroup = gid.value();
         return {};
       }},
      {"--log-level", true,
       [](const std::string& v, DaemonFlags& f, double) -> Status {
         if (!log::levelNamed(v, f.logLevel)) {
           return Error::make(Code::kInvalidArgument, "--log-level: debug, info, warn or error, not " + v);
         }
         return {};
       }},
      {"--log-format", true,
       [](const std::string& v, DaemonFlags& f, double) -> Status {
         if (v != "text" && v != "json")
           return Error::make(Code::kInvalidArgument, "--log-format: text or json, not " + v);
         f.logFormat = v == "json" ? log::Format::kJson : log::Format::kText;
         return {};
       }},
      {"--access-log", false,
       [](const std::string&, DaemonFlags& f, double) -> Status { return f.accessLog = true, Status{}; }},
      {"--no-board", false,
       [](const std::string&, DaemonFlags& f, double) -> Status { return f.board = false, Status{}; }},
      {"--preview-domain", true,
       [](const std::string& name, DaemonFlags& f, double) -> Status {
         // A DNS name of at least two labels, lowercase: never an address or
         // a name the API is reached by alone.
         bool ok = name.size() >= 3 && name.size() <= 200 && name.find('.') != std::string::npos &&
                   name.front() != '.' && name.back() != '.' && name.find("..") == std::string::npos &&
                   name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-") == std::string::npos &&
                   name.find_first_not_of("0123456789.") != std::string::npos;
         if (!ok) return invalid("--preview-domain: " + name + " is not a lowercase DNS name of two labels or more");
         f.previewDomain = name;
         return {};
       }},
      numberFlag("--port-timeout", 1, 3600, "a number of seconds from 1 to 3600",
                 [](DaemonFlags& f, uint64_t n) { f.portTimeoutS = static_cast<int64_t>(n); }),
      {"--isolation", true,
       [](const std::string& v, DaemonFlags& f, double) -> Status {
         auto named = backend::isolationNamed(v);
         if (!named) return invalid("--isolation needs namespaces or microvm, not " + v);
         f.manager.defaultIsolation = *named;
         return {};
       }},
      {"--microvm-accel", true,
       [](const std::string& v, DaemonFlags& f, double) -> Status {
         if (!backend::microvm::accelNamed(v)) return invalid("--microvm-accel needs auto, kvm or tcg, not " + v);
         f.manager.microvmAccel = v;
         return {};
       }},
      numberFlag("--microvm-boot-wait", 1, 3600, "a number of seconds from 1 to 3600",
                 [](DaemonFlags& f, uint64_t n) { f.microvmBootWaitS = static_cast<int64_t>(n); }),
      numberFlag("--microvm-saved-guests", 0, 64, "a number from 0 to 64",
                 [](DaemonFlags& f, uint64_t n) { f.microvmSavedGuests = n; }),
      {"--agent-local-providers", false,
       [](const std::string&, DaemonFlags& f, double) -> Status { return f.agentLocalProviders = true, Status{}; }},
  };
  return all;
}

}  // namespace

const char* daemonUsage() { return kUsage; }

Result<DaemonFlags> parseDaemonFlags(const std::vector<std::string>& args, const std::string& defaultStateDir,
                                     double hostMemoryMb) {
  DaemonFlags f;
  f.stateDir = defaultStateDir;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      f.help = true;
      return f;
    }
    if (a == "--version") {
      f.version = true;
      return f;
    }
    const auto& all = flags();
    auto flag = std::find_if(all.begin(), all.end(), [&](const Flag& candidate) { return a == candidate.name; });
    if (flag == all.end()) return Error::make(Code::kUsage, "unknown argument " + a);
    std::string value;
    if (flag->takesValue) {
      if (i + 1 >= args.size()) return Error::make(Code::kUsage, a + " needs a value");
      value = args[++i];
    }
    MOAT_TRY(flag->apply(value, f, hostMemoryMb));
  }
  // A pool of microVMs (named, or moatd's default) must be one a create
  // could make: refills would fail for good otherwise.
  for (const auto& pool : f.manager.warmPools) {
    if (pool.isolation.value_or(f.manager.defaultIsolation) != backend::Isolation::kMicroVm) continue;
    if (pool.templateName == "host") {
      return invalid(
          "--warm-pool of microVMs needs template=DIR or a template's name (the host's own tree is not "
          "made into an image)");
    }
    const uint64_t ram = pool.ramMb ? pool.ramMb : f.manager.defaultRamMb;
    if (ram < backend::kMicroVmMinMemoryMb) {
      return invalid("--warm-pool of microVMs needs ram_mb of at least " +
                     std::to_string(backend::kMicroVmMinMemoryMb));
    }
  }
  return f;
}

}  // namespace moat::daemon
