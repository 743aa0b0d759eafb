#include "daemon/flags.h"

#include <unistd.h>

#include <optional>

#include "daemon/warm_pool_flag.h"
#include "gate/permissions.h"
#include "os/file.h"

namespace moat::daemon {

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

Error invalid(const std::string& message) { return Error::make(Code::kInvalidArgument, message); }

}  // namespace

const char* daemonUsage() { return kUsage; }

Result<DaemonFlags> parseDaemonFlags(const std::vector<std::string>& args, const std::string& defaultStateDir,
                                     double hostMemoryMb) {
  DaemonFlags f;
  f.stateDir = defaultStateDir;
  static const char* const kWithValue[] = {"--state",
                                           "--listen",
                                           "--warm-pool",
                                           "--max-environments",
                                           "--max-connections",
                                           "--key-rate",
                                           "--approval-timeout",
                                           "--lossless-wait",
                                           "--permissions",
                                           "--audit-retention-days",
                                           "--audit-max-events",
                                           "--egress-hosts",
                                           "--egress-ca-bundle",
                                           "--egress-head-timeout"};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool wantsValue = false;
    for (const char* w : kWithValue) wantsValue = wantsValue || a == w;
    if (wantsValue && i + 1 >= args.size()) return Error::make(Code::kUsage, a + " needs a value");
    if (a == "--state" || a == "--listen") {
      (a == "--state" ? f.stateDir : f.listen) = args[++i];
    } else if (a == "--warm-pool") {
      auto pool = parseWarmPoolFlag(args[++i], hostMemoryMb);
      if (!pool.ok()) return invalid("--warm-pool needs " + pool.error().message());
      f.manager.warmPools.push_back(pool.value());
    } else if (a == "--max-environments") {
      auto n = number(args[++i], 1, 100000);
      if (!n) return invalid("--max-environments needs a number from 1 to 100000");
      f.manager.maxEnvironments = *n;
    } else if (a == "--max-connections") {
      auto n = number(args[++i], 1, 100000);
      if (!n) return invalid("--max-connections needs a number from 1 to 100000");
      f.server.maxConnections = *n;
    } else if (a == "--key-rate") {
      auto n = number(args[++i], 0, 100000);
      if (!n) return invalid("--key-rate needs a number of requests per second from 0 (no limit) to 100000");
      f.keyRate = *n;
    } else if (a == "--approval-timeout") {
      auto n = number(args[++i], 1, 86400);
      if (!n) return invalid("--approval-timeout needs a number of seconds from 1 to 86400");
      f.approvalTimeoutS = static_cast<int64_t>(*n);
    } else if (a == "--lossless-wait") {
      auto n = number(args[++i], 1, 86400);
      if (!n) return invalid("--lossless-wait needs a number of seconds from 1 to 86400");
      f.manager.processLimits.losslessWaitMs = static_cast<int64_t>(*n) * 1000;
    } else if (a == "--permissions") {
      const std::string& path = args[++i];
      auto text = os::readFile(path, 1u << 20);
      if (!text.ok()) return invalid("--permissions: " + text.error().message());
      auto j = nlohmann::json::parse(text.value(), nullptr, false);
      if (j.is_discarded()) return invalid("--permissions: " + path + " is not JSON");
      auto parsed = gate::Permissions::parse(j, gate::Permissions::defaults());
      if (!parsed.ok()) return invalid("--permissions: " + path + ": " + parsed.error().context);
      f.manager.defaultPermissions = parsed.value();
    } else if (a == "--audit-retention-days") {
      auto n = number(args[++i], 0, 36500);
      if (!n) return invalid("--audit-retention-days needs a number from 0 to 36500");
      f.audit.retentionDays = static_cast<int64_t>(*n);
    } else if (a == "--audit-max-events") {
      auto n = number(args[++i], 0, 1000000000);
      if (!n || (*n != 0 && *n < 1000))
        return invalid("--audit-max-events needs 0 or a number from 1000 to 1000000000");
      f.audit.maxEvents = *n;
    } else if (a == "--egress-hosts" || a == "--egress-ca-bundle") {
      const std::string& path = args[++i];
      if (::access(path.c_str(), R_OK) != 0) return invalid(a + ": cannot read " + path);
      (a == "--egress-hosts" ? f.egress.hostsFile : f.egress.upstreamCaBundle) = path;
    } else if (a == "--egress-head-timeout") {
      auto n = number(args[++i], 1, 3600);
      if (!n) return invalid("--egress-head-timeout needs a number of seconds from 1 to 3600");
      f.egress.headTimeout = std::chrono::seconds(*n);
    } else if (a == "--no-egress") {
      f.egressOn = false;
    } else if (a == "-h" || a == "--help") {
      f.help = true;
      return f;
    } else {
      return Error::make(Code::kUsage, "unknown argument " + a);
    }
  }
  return f;
}

}  // namespace moat::daemon
