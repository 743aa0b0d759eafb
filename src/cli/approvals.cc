// moat approvals: what the gate asks a person (list, approve, deny, watch).
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kUsage = R"(usage: moat approvals [ls] [--state S] [--env ID] [--json]
       moat approvals approve ID [--reason TEXT] [--remember]
       moat approvals deny ID [--reason TEXT] [--remember]
       moat approvals watch [--env ID]

Actions whose permission is "ask" wait for a person (docs/GATE.md).
  ls        approvals, newest first (default: all states; --state pending)
  approve   let the waiting action happen; --remember makes it a rule, so
            exactly this action is allowed from now on
  deny      refuse it; --remember denies exactly this action from now on
  watch     prompts for each new pending approval until input ends:
            y approve, n deny, a approve and remember, d deny and remember,
            s skip
Needs the master token or a key with the 'approve' scope; a key cannot
decide what it asked for itself.
)";

std::string approvalSummary(const json& a) {
  const json& act = a.contains("action") ? a["action"] : json::object();
  std::string what;
  if (act.contains("argv")) {
    for (const auto& arg : act["argv"]) what += (what.empty() ? "" : " ") + arg.get<std::string>();
    // A program a process of the environment starts: which file, run by whom.
    if (act.contains("program")) what += "  [" + act.value("program", "") + "]";
    if (act.contains("parents") && act["parents"].is_array() && !act["parents"].empty()) {
      std::string chain;
      for (const auto& p : act["parents"]) chain += (chain.empty() ? "" : " < ") + p.get<std::string>();
      what += "  from " + chain;
    }
  } else if (act.contains("path")) {
    what = act.value("op", "") + " " + act.value("path", "");
    if (act.contains("size") && a.value("scope", "") == "write_file") {
      what += " (" + std::to_string(act.value("size", 0)) + " bytes)";
    }
  } else if (act.contains("host")) {
    what = act.value("host", "") + (act.contains("port") ? ":" + std::to_string(act.value("port", 0)) : "");
  }
  return what;
}

struct ApprovalsOptions {
  ConnectionOptions connection;
  std::vector<std::string> positional;
  std::string state, env, reason;
  bool remember = false, asJson = false;
};

Result<ApprovalsOptions> parseApprovalsArgs(const std::vector<std::string>& args) {
  ApprovalsOptions o;
  FlagReader flags(args);
  while (!flags.done()) {
    if (!flags.currentIsFlag()) {
      o.positional.push_back(flags.current());
      flags.skip();
      continue;
    }
    MOAT_TRY(flags.next());
    const std::string& name = flags.name();
    if (name == "--state") {
      // An approval's state is a word; the state directory is absolute (as in moat env ls).
      MOAT_ASSIGN(std::string v, flags.value());
      (v.rfind("/", 0) == 0 ? o.connection.stateDir : o.state) = v;
      continue;
    }
    bool matched = false;
    MOAT_TRY(readConnectionFlag(flags, o.connection, matched));
    if (matched) continue;
    if (name == "--env") {
      MOAT_ASSIGN(o.env, flags.value());
    } else if (name == "--reason") {
      MOAT_ASSIGN(o.reason, flags.value());
    } else if (name == "--remember") {
      MOAT_TRY(flags.noValue());
      o.remember = true;
    } else if (name == "--json") {
      MOAT_TRY(flags.noValue());
      o.asJson = true;
    } else {
      return usageError("unknown option " + name);
    }
  }
  return o;
}

Result<json> listApprovals(Client& client, const std::string& state, const std::string& env) {
  std::string target = "/v1/approvals";
  std::string sep = "?";
  if (!state.empty()) {
    target += sep + "state=" + urlEncode(state);
    sep = "&";
  }
  if (!env.empty()) target += sep + "environment=" + urlEncode(env);
  MOAT_ASSIGN(json answer, call(client, "GET", target, "", 200));
  return answer["approvals"];
}

Result<json> decide(Client& client, const std::string& id, bool approve, const std::string& reason, bool remember) {
  if (id.empty() || id.find('/') != std::string::npos) return usageError("'" + id + "' is not an approval id");
  json body = {{"decision", approve ? "approve" : "deny"}, {"remember", remember}};
  if (!reason.empty()) body["reason"] = reason;
  return call(client, "POST", "/v1/approvals/" + urlEncode(id), body.dump(), 200);
}

int listApprovals(Client& client, const ApprovalsOptions& o) {
  auto approvals = listApprovals(client, o.state, o.env);
  if (!approvals.ok()) return reportFailure("approvals", approvals.error());
  if (o.asJson) {
    std::printf("%s\n", approvals->dump(2).c_str());
    return 0;
  }
  std::printf("%-13s %-13s %-12s %-9s %-13s %s\n", "ID", "ENV", "SCOPE", "STATE", "REQUESTER", "ACTION");
  for (const auto& a : approvals.value()) {
    std::printf("%-13s %-13s %-12s %-9s %-13s %s\n", a.value("id", "").c_str(), a.value("environment", "").c_str(),
                a.value("scope", "").c_str(), a.value("state", "").c_str(), a.value("requester", "").c_str(),
                approvalSummary(a).c_str());
  }
  return 0;
}

int watch(Client& client, const ApprovalsOptions& o) {
  // Prompts on the terminal when there is one, so that a pipe can feed answers too.
  FILE* in = stdin;
  std::set<std::string> seen;
  std::printf("moat: watching for approvals (end input to stop)\n");
  std::fflush(stdout);
  for (;;) {
    auto pending = listApprovals(client, "pending", o.env);
    if (!pending.ok()) return reportFailure("approvals watch", pending.error());
    for (auto it = pending->rbegin(); it != pending->rend(); ++it) {  // oldest first
      const json& a = *it;
      std::string id = a.value("id", "");
      if (!seen.insert(id).second) continue;
      std::printf(
          "\n%s wants %s in %s: %s\n  approve? [y]es [n]o [a]lways [d]never [s]kip: ", a.value("requester", "").c_str(),
          a.value("scope", "").c_str(), a.value("environment", "").c_str(), approvalSummary(a).c_str());
      std::fflush(stdout);
      char line[64];
      if (!std::fgets(line, sizeof line, in)) return 0;
      char c = line[0];
      if (c == 's' || c == '\n') continue;
      bool approve = c == 'y' || c == 'a';
      bool remember = c == 'a' || c == 'd';
      if (c != 'y' && c != 'n' && c != 'a' && c != 'd') {
        std::printf("  skipped (answer y, n, a, d or s)\n");
        continue;
      }
      auto decided = decide(client, id, approve, "decided in moat approvals watch", remember);
      if (!decided.ok()) {
        complain(kExitEnvironment, decided.error().message());
        continue;
      }
      std::printf("  %s%s\n", approve ? "approved" : "denied", remember ? " (remembered as a rule)" : "");
      std::fflush(stdout);
    }
    // The pending list is small and local: look again in half a second, or
    // stop now if input ended.
    struct pollfd input = {::fileno(in), POLLIN, 0};
    if (::poll(&input, 1, 500) > 0) {
      int c = std::fgetc(in);
      if (c == EOF) return 0;
      std::ungetc(c, in);
    }
  }
}

}  // namespace

int approvalsCommand(const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
    std::fputs(kUsage, stdout);
    std::fputs(connectionUsage(), stdout);
    return 0;
  }
  std::string sub = args.empty() || args[0].rfind("-", 0) == 0 ? "ls" : args[0];
  std::vector<std::string> rest(args.begin() + (args.empty() || args[0].rfind("-", 0) == 0 ? 0 : 1), args.end());
  auto o = parseApprovalsArgs(rest);
  if (!o.ok()) return reportFailure("approvals", o.error());
  auto client = Client::fromOptions(o->connection);
  if (!client.ok()) return reportFailure("approvals", client.error());
  if (sub == "ls") {
    if (!o->positional.empty()) return reportFailure("approvals", usageError("unexpected " + o->positional[0]));
    return listApprovals(client.value(), o.value());
  }
  if (sub == "approve" || sub == "deny") {
    if (o->positional.size() != 1)
      return reportFailure("approvals", usageError("usage: moat approvals " + sub + " ID"));
    auto decided = decide(client.value(), o->positional[0], sub == "approve", o->reason, o->remember);
    if (!decided.ok()) return reportFailure("approvals " + sub, decided.error());
    std::printf("%s %s\n", decided->value("id", "").c_str(), decided->value("state", "").c_str());
    return 0;
  }
  if (sub == "watch") return watch(client.value(), o.value());
  return reportFailure("approvals", usageError("unknown command '" + sub + "' (ls, approve, deny, watch)"));
}

}  // namespace moat::cli
