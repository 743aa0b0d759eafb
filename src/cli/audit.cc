// moat audit: check moatd's audit log (verify) and copy it out (export).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/events.h"
#include "cli/exit_codes.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

// `moat audit verify` found the chain broken.
constexpr int kExitBroken = 1;

constexpr const char* kAuditUsage = R"(usage: moat audit verify
       moat audit export --format jsonl [--since ID]

verify   walks the hash chain of moatd's audit log and names the first event
         that does not hold (edited, deleted, out of place). Exit 0 when the
         chain holds, 1 when it is broken, 125 when moatd could not be asked.
         Prints the last event's id and hash: keep them elsewhere, so that a
         rewrite of the whole log (by someone who can write moat.db) shows.
export   prints the events after --since (default: all), oldest first, one
         JSON object per line with their hashes (docs/API.md says how to check
         them without moatd).

Both need the master token.
)";

int auditHelp() {
  std::fputs(kAuditUsage, stdout);
  std::fputs(connectionUsage(), stdout);
  return 0;
}

int verify(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  bool asJson = false;
  FlagReader flags(args);
  while (!flags.done()) {
    Status s = flags.next();
    if (!s.ok()) return reportFailure("audit verify", s.error());
    bool matched = false;
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok()) return reportFailure("audit verify", s.error());
    if (matched) continue;
    if (flags.name() != "--json") return reportFailure("audit verify", usageError("unknown option " + flags.name()));
    asJson = true;
  }
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("audit verify", client.error());
  auto result = call(client.value(), "GET", "/v1/audit/verify", "", 200);
  if (!result.ok()) return reportFailure("audit verify", result.error());
  const json& r = result.value();
  if (!r.is_object() || !r.contains("ok") || !r["ok"].is_boolean()) {
    return complain(kExitEnvironment, "moatd's verify answer has no \"ok\"");
  }
  bool ok = r["ok"].get<bool>();
  if (asJson) {
    std::printf("%s\n", r.dump(2).c_str());
  } else if (ok) {
    std::printf("ok: %llu events checked", static_cast<unsigned long long>(r.value("checked", 0ULL)));
    if (r.contains("last")) {
      std::printf(", last event %llu hash %s", static_cast<unsigned long long>(r["last"].value("id", 0ULL)),
                  r["last"].value("hash", "").c_str());
    }
    std::printf("\n");
  } else {
    const json& broken = r.contains("first_broken") ? r["first_broken"] : json::object();
    std::printf("broken at event %llu: %s\n", static_cast<unsigned long long>(broken.value("id", 0ULL)),
                broken.value("reason", "").c_str());
    std::printf("(%llu events before it hold)\n", static_cast<unsigned long long>(r.value("checked", 0ULL)));
  }
  return ok ? 0 : kExitBroken;
}

int exportEvents(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  EventsQuery query;
  std::string format;
  FlagReader flags(args);
  while (!flags.done()) {
    Status s = flags.next();
    if (!s.ok()) return reportFailure("audit export", s.error());
    bool matched = false;
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok()) return reportFailure("audit export", s.error());
    if (matched) continue;
    if (flags.name() == "--format" || flags.name() == "--since") {
      auto v = flags.value();
      if (!v.ok()) return reportFailure("audit export", v.error());
      if (flags.name() == "--format") {
        format = v.value();
      } else {
        auto n = parseWhole("--since", v.value());
        if (!n.ok()) return reportFailure("audit export", n.error());
        query.since = n.value();
      }
    } else {
      return reportFailure("audit export", usageError("unknown option " + flags.name()));
    }
  }
  if (format.empty()) return reportFailure("audit export", usageError("--format is required (jsonl)"));
  if (format != "jsonl")
    return reportFailure("audit export", usageError("--format: only jsonl is known, got '" + format + "'"));
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("audit export", client.error());
  bool written = true;
  Status s = readEvents(client.value(), query, [&](const json&, const std::string& line) {
    written = std::fwrite(line.data(), 1, line.size(), stdout) == line.size() && std::fputc('\n', stdout) != EOF;
    return written;
  });
  if (!s.ok()) return reportFailure("audit export", s.error());
  if (!written || std::fflush(stdout) != 0) return complain(kExitEnvironment, "writing the export failed");
  return 0;
}

}  // namespace

int auditCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kAuditUsage, stderr);
    return kExitUsage;
  }
  if (args[0] == "-h" || args[0] == "--help") return auditHelp();
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "verify") return verify(rest);
  if (args[0] == "export") return exportEvents(rest);
  std::fprintf(stderr, "moat audit: unknown subcommand '%s'\n%s", args[0].c_str(), kAuditUsage);
  return kExitUsage;
}

}  // namespace moat::cli
