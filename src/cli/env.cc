// moat env: environments kept by moatd (create, ls, get, rm).
#include <cstdio>
#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "cli/network_flags.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kEnvUsage = R"(usage: moat env COMMAND [options]

Environments kept by moatd, which live until removed or their TTL ends.

commands:
  create [options]   create one; prints its id (or the JSON with --json)
      --task-id ID      a caller's id to find it by
      --template T      'host' (default), a template's name (moat template ls)
                        or a root file system directory
      --snapshot SNAP   start from a snapshot's files (moat snapshot --help)
      --cpus N          CPU time per second (fractional), default 1
      --memory MB       memory limit, default 1024
      --storage GB      writable storage limit (fractional), default 4
      --pids N          process/thread limit, default 1024
      --isolation I     namespaces or microvm (a kernel of its own; docs/MICROVM.md),
                        default moatd's (--isolation)
      --ttl S           destroyed after S seconds, default 3600
      --ttl-while-paused stops|runs
                        whether a pause stops that time (default) or not
      --on-expiry destroy|pause|checkpoint
                        what the end of that time does (default destroy); pause keeps
                        it paused until a resume gives it S seconds again (docs/PAUSE.md);
                        checkpoint does so with its memory on disk (microVMs)
      --label K=V       a label; repeatable
      -e NAME=VALUE     a variable for every command (-e NAME copies the host's); repeatable
      --permissions J   the gate's permissions, JSON or @FILE (docs/GATE.md), e.g.
                        '{"run_command": "ask", "write_file": [{"path": "/workspace/**", "action": "allow"}, {"action": "deny"}]}'
      --network P       none (default), open, or a policy as JSON or @FILE (docs/EGRESS.md)
      --allow HOST      allow a host (glob, host:port, address or range); repeatable
      --deny HOST       refuse a host even in open mode; repeatable
      --secret NAME@HOST[,HOST...]
                        a secret from the variable NAME: the environment sees a placeholder,
                        the proxy sends the value to those hosts only; repeatable
      --secret-header NAME=HEADER
                        a header the proxy sets with it, e.g. 'Authorization: Bearer {value}'
  ls [options]       list the environments that are not gone
      --label K=V       only those with this label; repeatable
      --task-id ID      only those of this task
      --state S         only those in state S (creating, running, paused, destroying, failed, gone)
  get ID             one environment, as key: value lines
  stats ID           what it uses now: CPU time, memory, processes, beside its limits
  network ID [options]
                     show the network policy, or change it with --network, --allow, --deny
  ttl ID S           the environment now expires S seconds from now (longer or
                     shorter than before; prints its new expiry)
  pause ID...        stop every process of each where it is (docs/PAUSE.md): commands and
                     file changes wait for the resume; file reads still answer
      --to-disk         and save its memory to disk, releasing it (a checkpoint: microVMs;
                        the resume brings it back where it was)
  resume ID...       let them go on
  rm ID...           destroy environments (done when the command returns)

  --json             print moatd's JSON instead (create, ls, get, stats)

)";

int envHelp() {
  std::fputs(kEnvUsage, stdout);
  std::fputs(connectionUsage(), stdout);
  return 0;
}

std::string text(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v.get<double>());
    return buf;
  }
  if (v.is_null()) return "";
  return v.dump();
}

std::string labelsText(const json& env) {
  std::string out;
  if (!env.contains("labels") || !env["labels"].is_object()) return out;
  for (auto it = env["labels"].begin(); it != env["labels"].end(); ++it) {
    if (!out.empty()) out += ",";
    out += it.key() + "=" + (it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  }
  return out;
}

// moatd's timestamps are "YYYY-MM-DDTHH:MM:SS.mmmZ"; -1 if not one.
int64_t parseTimestamp(const std::string& s) {
  std::tm tm{};
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec) != 6) {
    return -1;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(::timegm(&tm));
}

std::string span(int64_t seconds) {
  if (seconds < 60) return std::to_string(seconds) + "s";
  if (seconds < 3600) return std::to_string(seconds / 60) + "m";
  if (seconds < 86400) return std::to_string(seconds / 3600) + "h";
  return std::to_string(seconds / 86400) + "d";
}

// "5m ago", "in 55m": what a person scanning the table wants.
std::string relative(const std::string& timestamp) {
  int64_t t = parseTimestamp(timestamp);
  if (t < 0) return timestamp.empty() ? "-" : timestamp;
  int64_t now = static_cast<int64_t>(std::time(nullptr));
  return t <= now ? span(now - t) + " ago" : "in " + span(t - now);
}

bool live(const std::string& state) { return state == "creating" || state == "running" || state == "paused"; }

void printTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    std::puts(line.c_str());
  }
}

Status noPositional(const Parsed& parsed) {
  if (!parsed.positional.empty()) return usageError("unexpected argument '" + parsed.positional[0] + "'");
  return {};
}

// moatd names a spec's fields; the caller typed this command's flags.
Error inFlagTerms(Error e) {
  static const std::pair<const char*, const char*> kFields[] = {
      {"spec.ram_mb", "--memory (MB)"},           {"spec.cpus", "--cpus"},
      {"spec.storage_gb", "--storage (GB)"},      {"spec.pids", "--pids"},
      {"spec.isolation", "--isolation"},          {"ttl_s", "--ttl"},
      {"ttl_while_paused", "--ttl-while-paused"}, {"on_expiry", "--on-expiry"}};
  for (const auto& [field, flag] : kFields) {
    const std::string prefix = std::string(field) + ":";
    if (e.context.rfind(prefix, 0) == 0) {
      e.context = std::string(flag) + e.context.substr(prefix.size() - 1);
      break;
    }
  }
  return e;
}

int create(const std::vector<std::string>& args) {
  json body = json::object();
  json spec = json::object();
  std::map<std::string, std::string> labels, env;
  NetworkFlags network;
  SecretFlags secrets;
  Parsed parsed;
  Status s = parseArgs(args, parsed, [&](FlagReader& flags, bool& matched) -> Status {
    matched = true;
    const std::string& name = flags.name();
    MOAT_ASSIGN(bool ours, network.read(flags));
    if (!ours) {
      MOAT_ASSIGN(ours, secrets.read(flags));
    }
    if (ours) return {};
    if (name == "--task-id") {
      MOAT_ASSIGN(body["task_id"], flags.value());
    } else if (name == "--template") {
      MOAT_ASSIGN(body["template"], flags.value());
    } else if (name == "--snapshot") {
      MOAT_ASSIGN(body["snapshot"], flags.value());
    } else if (name == "--cpus") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(spec["cpus"], parseNumber(name, v));
    } else if (name == "--memory") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(spec["ram_mb"], parseWhole(name, v));
    } else if (name == "--storage") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(spec["storage_gb"], parseNumber(name, v));
    } else if (name == "--isolation") {
      // moatd says which it knows (spec.isolation).
      MOAT_ASSIGN(spec["isolation"], flags.value());
    } else if (name == "--permissions") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(body["permissions"], parsePermissionsFlag(name, v));
    } else if (name == "--pids") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(spec["pids"], parseWhole(name, v));
    } else if (name == "--ttl") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(body["ttl_s"], parseWhole(name, v));
    } else if (name == "--ttl-while-paused") {
      MOAT_ASSIGN(body["ttl_while_paused"], flags.value());  // moatd says which it knows
    } else if (name == "--on-expiry") {
      MOAT_ASSIGN(body["on_expiry"], flags.value());  // moatd says which it knows
    } else if (name == "--label") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_TRY(parseLabel(name, v, labels));
    } else if (name == "-e" || name == "--env") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_TRY(parseVariable(name, v, env));
    } else {
      matched = false;
    }
    return {};
  });
  if (s.ok()) s = noPositional(parsed);
  if (s.ok()) {
    auto policy = network.policy();
    if (!policy.ok())
      s = policy.error();
    else if (policy.value())
      body["network"] = *policy.value();
  }
  if (s.ok()) {
    auto list = secrets.secrets();
    if (!list.ok())
      s = list.error();
    else if (list.value())
      body["secrets"] = *list.value();
  }
  if (!s.ok()) return reportFailure("env create", s.error());
  if (parsed.help) return envHelp();
  if (!spec.empty()) body["spec"] = spec;
  if (!labels.empty()) body["labels"] = labels;
  if (!env.empty()) body["env"] = env;

  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) return reportFailure("env create", client.error());
  std::string request;
  try {
    request = body.dump();
  } catch (const json::exception&) {
    return reportFailure("env create", usageError("values must be valid UTF-8 (moatd's API is JSON)"));
  }
  auto created = call(client.value(), "POST", "/v1/environments", request, 201);
  if (!created.ok()) return reportFailure("env create", inFlagTerms(created.error()));
  if (parsed.json) {
    std::puts(created->dump(2).c_str());
  } else {
    std::puts(text(created.value(), "id").c_str());
  }
  return 0;
}

int listEnvironments(const std::vector<std::string>& args) {
  std::vector<std::string> query;
  Parsed parsed;
  Status s = parseArgs(args, parsed, [&](FlagReader& flags, bool& matched) -> Status {
    matched = true;
    const std::string& name = flags.name();
    if (name == "--label") {
      MOAT_ASSIGN(std::string v, flags.value());
      std::map<std::string, std::string> one;
      MOAT_TRY(parseLabel(name, v, one));
      query.push_back("label=" + urlEncode(v));
    } else if (name == "--task-id") {
      MOAT_ASSIGN(std::string v, flags.value());
      query.push_back("task_id=" + urlEncode(v));
    } else if (name == "--state") {
      // An environment's state is a word; the state directory is absolute.
      MOAT_ASSIGN(std::string v, flags.value());
      if (v.empty()) return usageError("--state needs a value");
      if (v[0] == '/') {
        parsed.connection.stateDir = v;
      } else {
        query.push_back("state=" + urlEncode(v));
      }
    } else {
      matched = false;
    }
    return {};
  });
  if (s.ok()) s = noPositional(parsed);
  if (!s.ok()) return reportFailure("env ls", s.error());
  if (parsed.help) return envHelp();

  std::string target = "/v1/environments";
  for (size_t i = 0; i < query.size(); ++i) target += (i == 0 ? "?" : "&") + query[i];
  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) return reportFailure("env ls", client.error());
  auto listed = call(client.value(), "GET", target, "", 200);
  if (!listed.ok()) return reportFailure("env ls", listed.error());
  json environments = listed->contains("environments") ? (*listed)["environments"] : json::array();
  if (parsed.json) {
    std::puts(environments.dump(2).c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"ID", "STATE", "TASK", "CPUS", "MEM", "CREATED", "EXPIRES", "LABELS"}};
  for (const auto& e : environments) {
    const json& spec = e.contains("spec") ? e["spec"] : json::object();
    std::string task = text(e, "task_id");
    std::string labels = labelsText(e);
    std::string state = text(e, "state");
    std::string mem = text(spec, "ram_mb");
    rows.push_back({text(e, "id"), state, task.empty() ? "-" : task, text(spec, "cpus"), mem.empty() ? "-" : mem + "M",
                    relative(text(e, "created_at")), live(state) ? relative(text(e, "expires_at")) : "-",
                    labels.empty() ? "-" : labels});
  }
  printTable(rows);
  return 0;
}

// `moat env SUB ID`: a GET of the environment's path plus `suffix`.
std::optional<json> getOne(const std::vector<std::string>& args, const std::string& sub, const std::string& suffix,
                           Parsed& parsed, int& code) {
  OneResource what;
  what.command = "env " + sub;
  what.missing = "missing environment id (usage: moat env " + sub + " ID)";
  what.several = "takes one environment id";
  what.pathOf = [&suffix](const std::string& id) -> Result<std::string> {
    MOAT_ASSIGN(std::string path, environmentPath(id));
    return path + suffix;
  };
  what.help = envHelp;
  return callOne(args, what, parsed, code);
}

int get(const std::vector<std::string>& args) {
  Parsed parsed;
  int code = 0;
  auto env = getOne(args, "get", "", parsed, code);
  if (!env) return code;
  const json& e = *env;
  const json& spec = e.contains("spec") ? e["spec"] : json::object();
  std::vector<std::pair<std::string, std::string>> lines = {
      {"id", text(e, "id")},
      {"state", text(e, "state")},
  };
  if (e.contains("reason")) lines.emplace_back("reason", text(e, "reason"));
  for (const char* key : {"task_id", "template"}) lines.emplace_back(key, text(e, key));
  for (const char* key : {"cpus", "ram_mb", "storage_gb", "pids", "isolation"})
    lines.emplace_back(key, text(spec, key));
  if (e.contains("accel")) lines.emplace_back("accel", text(e, "accel"));
  for (const char* key : {"created_at", "expires_at"}) lines.emplace_back(key, text(e, key));
  lines.emplace_back("labels", labelsText(e));
  for (const auto& [k, v] : lines) std::printf("%s: %s\n", k.c_str(), v.c_str());
  return 0;
}

std::string mebibytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

int stats(const std::vector<std::string>& args) {
  Parsed parsed;
  int code = 0;
  auto got = getOne(args, "stats", "/stats", parsed, code);
  if (!got) return code;
  const json& u = *got;
  auto whole = [&](const char* key) -> uint64_t {
    return u.contains(key) && u[key].is_number_unsigned() ? u[key].get<uint64_t>() : 0;
  };
  char cpu[64] = "not counted on this host";
  if (u.contains("cpu_usec") && u["cpu_usec"].is_number()) {
    std::snprintf(cpu, sizeof cpu, "%.3f s", static_cast<double>(whole("cpu_usec")) / 1e6);
  }
  auto share = [&](const char* used, const char* limitKey) {
    const uint64_t n = whole(used), limit = whole(limitKey);
    return mebibytes(n) + " of " + mebibytes(limit) + " (" +
           std::to_string(limit ? static_cast<int>(100.0 * static_cast<double>(n) / static_cast<double>(limit) + 0.5)
                                : 0) +
           "%)";
  };
  auto counted = [&](const char* key) { return u.contains(key) && u[key].is_number(); };
  std::printf("cpu time: %s (limit %s CPU)\n", cpu, text(u, "cpus").c_str());
  std::printf("memory: %s\n", share("memory_bytes", "memory_limit_bytes").c_str());
  std::printf("pids: %llu of %llu\n", static_cast<unsigned long long>(whole("pids")),
              static_cast<unsigned long long>(whole("pids_limit")));
  std::printf("oom kills: %llu\n", static_cast<unsigned long long>(whole("oom_kills")));
  std::printf("storage: %s\n", counted("storage_bytes") ? share("storage_bytes", "storage_limit_bytes").c_str()
                                                        : "not counted on this host");
  if (counted("network_sent_bytes")) {
    std::printf("network: %s sent, %s received\n", mebibytes(whole("network_sent_bytes")).c_str(),
                mebibytes(whole("network_received_bytes")).c_str());
  } else {
    std::printf("network: not counted (moatd --no-egress, or its counters could not be read)\n");
  }
  return 0;
}

// rm, pause, resume: `method` on each environment's path + `suffix`;
// prints each id done. `toDisk`: pause's --to-disk is taken.
int eachEnvironment(const std::vector<std::string>& args, const std::string& command, const char* method,
                    const std::string& suffix, int expected, bool toDisk = false) {
  const std::string what = "env " + command;
  Parsed parsed;
  std::string body;
  Status s = parseArgs(args, parsed, [&](FlagReader& flags, bool& matched) -> Status {
    matched = toDisk && flags.name() == "--to-disk";
    if (!matched) return {};
    MOAT_TRY(flags.noValue());
    body = json{{"memory", "disk"}}.dump();
    return {};
  });
  if (s.ok() && !parsed.help && parsed.positional.empty()) {
    s = usageError("missing environment id (usage: moat env " + command + " ID...)");
  }
  if (s.ok() && parsed.json) s = usageError("--json: not for " + command);
  std::vector<std::string> paths;
  for (size_t i = 0; s.ok() && i < parsed.positional.size(); ++i) {
    auto path = environmentPath(parsed.positional[i]);
    if (!path.ok()) s = path.error();
    if (path.ok()) paths.push_back(path.value() + suffix);
  }
  if (!s.ok()) return reportFailure(what.c_str(), s.error());
  if (parsed.help) return envHelp();
  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) return reportFailure(what.c_str(), client.error());
  int code = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    auto done = call(client.value(), method, paths[i], body, expected);
    if (!done.ok()) {
      // moatd's messages name the environment.
      code = reportFailure(what.c_str(), done.error());
      // moatd itself is unreachable: the other ids would say the same.
      if (done.error().code != Code::kApi) return code;
      continue;
    }
    std::puts(parsed.positional[i].c_str());
  }
  return code;
}

int networkOf(const std::vector<std::string>& args) {
  NetworkFlags network;
  Parsed parsed;
  Status s = parseArgs(args, parsed, [&](FlagReader& flags, bool& matched) -> Status {
    MOAT_ASSIGN(matched, network.read(flags));
    return {};
  });
  if (s.ok() && !parsed.help && parsed.positional.size() != 1) {
    s = usageError("usage: moat env network ID [--network P] [--allow HOST]... [--deny HOST]...");
  }
  std::optional<json> policy;
  if (s.ok()) {
    auto p = network.policy();
    if (!p.ok())
      s = p.error();
    else
      policy = p.value();
  }
  std::string path;
  if (s.ok() && !parsed.help) {
    auto p = environmentPath(parsed.positional[0]);
    if (!p.ok())
      s = p.error();
    else
      path = p.value() + "/network";
  }
  if (!s.ok()) return reportFailure("env network", s.error());
  if (parsed.help) return envHelp();
  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) return reportFailure("env network", client.error());
  auto answer = policy ? call(client.value(), "PUT", path, json{{"network", *policy}}.dump(), 200)
                       : call(client.value(), "GET", path, "", 200);
  if (!answer.ok()) return reportFailure("env network", answer.error());
  std::puts(answer->dump(2).c_str());
  return 0;
}

int ttl(const std::vector<std::string>& args) {
  Parsed parsed;
  Status s = parseArgs(args, parsed, nullptr);
  if (s.ok() && !parsed.help && parsed.positional.size() != 2) s = usageError("usage: moat env ttl ID SECONDS");
  std::string path;
  uint64_t seconds = 0;
  if (s.ok() && !parsed.help) {
    auto p = environmentPath(parsed.positional[0]);
    auto n = parseWhole("SECONDS", parsed.positional[1]);
    if (!p.ok()) {
      s = p.error();
    } else if (!n.ok()) {
      s = n.error();
    } else {
      path = p.value() + "/timeout";
      seconds = n.value();
    }
  }
  if (!s.ok()) return reportFailure("env ttl", s.error());
  if (parsed.help) return envHelp();
  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) return reportFailure("env ttl", client.error());
  auto answer = call(client.value(), "POST", path, json{{"ttl_s", seconds}}.dump(), 200);
  if (!answer.ok()) return reportFailure("env ttl", inFlagTerms(answer.error()));
  if (parsed.json) {
    std::puts(answer->dump(2).c_str());
  } else {
    std::puts(text(answer.value(), "expires_at").c_str());
  }
  return 0;
}

}  // namespace

int envCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kEnvUsage, stderr);
    return kExitUsage;
  }
  const std::string& sub = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "create") return create(rest);
  if (sub == "ls" || sub == "list") return listEnvironments(rest);
  if (sub == "get" || sub == "inspect") return get(rest);
  if (sub == "stats") return stats(rest);
  if (sub == "rm" || sub == "remove") return eachEnvironment(rest, "rm", "DELETE", "", 204);
  if (sub == "pause") return eachEnvironment(rest, "pause", "POST", "/pause", 200, true);
  if (sub == "resume") return eachEnvironment(rest, "resume", "POST", "/resume", 200);
  if (sub == "network") return networkOf(rest);
  if (sub == "ttl" || sub == "timeout") return ttl(rest);
  if (sub == "-h" || sub == "--help" || sub == "help") return envHelp();
  std::fprintf(stderr,
               "moat env: unknown command '%s' (create, ls, get, stats, network, ttl, pause, resume or rm; see moat "
               "env --help)\n",
               sub.c_str());
  return kExitUsage;
}

}  // namespace moat::cli
