// moat snapshot: snapshots of environments' files, restores and forks
// (docs/API.md, "Snapshots").
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kSnapshotUsage =
    R"(usage: moat snapshot create ID [--name NAME]   snapshot an environment's files; prints the snapshot id
       moat snapshot ls [ID]                     the snapshots (of one environment)
       moat snapshot restore ID SNAPSHOT         put the environment's files back as the snapshot has them
                                                 (every process in it ends)
       moat snapshot fork ID [--task-id T] [--label K=V]... [--ttl S] [--memory] [--count N]
                                                 a new environment with a copy of ID's files and
                                                 settings; prints its id (--count: N of them from one
                                                 moment, an id a line; --memory: its processes too,
                                                 running on where they were: microvm environments)
       moat snapshot rm SNAPSHOT...              delete snapshots

  --json   print moatd's JSON instead (create, ls, restore, fork)

A snapshot holds files, not processes; it outlives its environment until
removed. `moat env create --snapshot SNAPSHOT` starts a new environment from
one. Keys need the 'snapshots' scope (fork: 'create').

)";

struct SnapshotOptions {
  ConnectionOptions connection;
  std::vector<std::string> positional;
  bool asJson = false;
  bool help = false;
  std::string name;
  nlohmann::json fork = nlohmann::json::object();
};

Status parseSnapshotArgs(const std::vector<std::string>& args, const std::string& sub, SnapshotOptions& out) {
  FlagReader flags(args);
  std::map<std::string, std::string> labels;
  while (!flags.done()) {
    if (!flags.currentIsFlag()) {
      out.positional.push_back(flags.current());
      flags.skip();
      continue;
    }
    MOAT_TRY(flags.next());
    const std::string& name = flags.name();
    bool matched = false;
    MOAT_TRY(readConnectionFlag(flags, out.connection, matched));
    if (matched) continue;
    if (name == "-h" || name == "--help") {
      out.help = true;
    } else if (name == "--json") {
      MOAT_TRY(flags.noValue());
      out.asJson = true;
    } else if (name == "--name" && sub == "create") {
      MOAT_ASSIGN(out.name, flags.value());
    } else if (name == "--task-id" && sub == "fork") {
      MOAT_ASSIGN(out.fork["task_id"], flags.value());
    } else if (name == "--label" && sub == "fork") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_TRY(parseLabel(name, v, labels));
      out.fork["labels"] = labels;
    } else if (name == "--ttl" && sub == "fork") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(out.fork["ttl_s"], parseWhole(name, v));
    } else if (name == "--memory" && sub == "fork") {
      MOAT_TRY(flags.noValue());
      out.fork["memory"] = true;
    } else if (name == "--count" && sub == "fork") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(out.fork["count"], parseWhole(name, v));
    } else {
      return usageError("unknown option " + name + " for 'moat snapshot " + sub + "'");
    }
  }
  return {};
}

// A snapshot id as a path segment: what moatd would refuse anyway is
// refused here, before anything is sent.
Result<std::string> snapshotPath(const std::string& id) {
  if (id.size() != 17 || id.compare(0, 5, "snap-") != 0 ||
      id.find_first_not_of("0123456789abcdef", 5) != std::string::npos) {
    return usageError("'" + id + "' is not a snapshot id (snap- and 12 hex digits)");
  }
  return "/v1/snapshots/" + id;
}

void printSnapshots(const json& list) {
  std::printf("%-17s  %-12s  %-24s  %s\n", "ID", "ENVIRONMENT", "CREATED", "NAME");
  for (const auto& s : list) {
    std::printf("%-17s  %-12s  %-24s  %s\n", s.value("id", "").c_str(), s.value("environment_id", "").c_str(),
                s.value("created_at", "").c_str(), s.value("name", "").c_str());
  }
}

}  // namespace

int snapshotCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kSnapshotUsage, stderr);
    return kExitUsage;
  }
  const std::string sub = args[0];
  if (sub == "-h" || sub == "--help" || sub == "help") {
    std::fputs(kSnapshotUsage, stdout);
    std::fputs(connectionUsage(), stdout);
    return 0;
  }
  const std::string what = "snapshot " + sub;
  const std::map<std::string, std::pair<size_t, size_t>> arity = {
      {"create", {1, 1}}, {"ls", {0, 1}},    {"list", {0, 1}},     {"restore", {2, 2}},
      {"fork", {1, 1}},   {"rm", {1, 1000}}, {"remove", {1, 1000}}};
  auto known = arity.find(sub);
  if (known == arity.end()) {
    std::fprintf(stderr,
                 "moat snapshot: unknown command '%s' (create, ls, restore, fork or rm; see moat snapshot --help)\n",
                 sub.c_str());
    return kExitUsage;
  }
  SnapshotOptions o;
  Status s = parseSnapshotArgs(std::vector<std::string>(args.begin() + 1, args.end()), sub, o);
  if (s.ok() && !o.help && (o.positional.size() < known->second.first || o.positional.size() > known->second.second)) {
    s = usageError("wrong number of arguments (see moat snapshot --help)");
  }
  if (!s.ok()) return reportFailure(what, s.error());
  if (o.help) {
    std::fputs(kSnapshotUsage, stdout);
    return 0;
  }
  auto client = Client::fromOptions(o.connection);
  if (!client.ok()) return reportFailure(what, client.error());

  if (sub == "rm" || sub == "remove") return deleteEach(client.value(), what, o.positional, snapshotPath);
  if (sub == "ls" || sub == "list") {
    std::string target = "/v1/snapshots";
    if (!o.positional.empty()) {
      auto env = environmentPath(o.positional[0]);
      if (!env.ok()) return reportFailure(what, env.error());
      target = env.value() + "/snapshots";
    }
    auto listed = call(client.value(), "GET", target, "", 200);
    if (!listed.ok()) return reportFailure(what, listed.error());
    json list = listed->value("snapshots", json::array());
    if (o.asJson) {
      std::puts(list.dump(2).c_str());
    } else {
      printSnapshots(list);
    }
    return 0;
  }
  auto env = environmentPath(o.positional[0]);
  if (!env.ok()) return reportFailure(what, env.error());
  Result<json> answer = json();
  if (sub == "create") {
    json body = json::object();
    if (!o.name.empty()) body["name"] = o.name;
    answer = call(client.value(), "POST", env.value() + "/snapshots", body.dump(), 201);
  } else if (sub == "restore") {
    if (auto p = snapshotPath(o.positional[1]); !p.ok()) return reportFailure(what, p.error());
    answer = call(client.value(), "POST", env.value() + "/restore", json{{"snapshot", o.positional[1]}}.dump(), 200);
  } else {
    answer = call(client.value(), "POST", env.value() + "/fork", o.fork.dump(), 201);
  }
  if (!answer.ok()) return reportFailure(what, answer.error());
  if (o.asJson) {
    std::puts(answer->dump(2).c_str());
  } else if (answer->contains("environments")) {
    for (const auto& made : (*answer)["environments"]) std::puts(made.value("id", "").c_str());
  } else {
    std::puts(answer->value("id", "").c_str());
  }
  return 0;
}

}  // namespace moat::cli
