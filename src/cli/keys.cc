// moat keys: scoped API keys (master token only).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kKeysUsage = R"(usage: moat keys create --scope S [--scope S]... [--name NAME] [--json]
       moat keys ls [--json]
       moat keys rm ID...

Scoped API keys for agents, so they never need the master token. Scopes:
create, read, exec, files, destroy, timeout, approve, permissions, audit,
snapshots. A key sees and touches only the
environments it created. `create` prints the token once (keep it: only its
hash is stored). Needs the master token.
)";

int keysCreate(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  json body = {{"scopes", json::array()}};
  bool asJson = false;
  FlagReader flags(args);
  while (!flags.done()) {
    Status s = flags.next();
    if (!s.ok()) return reportFailure("moat keys create", s.error());
    bool matched = false;
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok()) return reportFailure("moat keys create", s.error());
    if (matched) continue;
    if (flags.name() == "--scope" || flags.name() == "--name") {
      auto v = flags.value();
      if (!v.ok()) return reportFailure("moat keys create", v.error());
      if (flags.name() == "--scope") {
        body["scopes"].push_back(v.value());
      } else {
        body["name"] = v.value();
      }
    } else if (flags.name() == "--permissions") {
      auto v = flags.value();
      if (!v.ok()) return reportFailure("moat keys create", v.error());
      auto ceiling = parsePermissionsFlag("--permissions", v.value());
      if (!ceiling.ok()) return reportFailure("moat keys create", ceiling.error());
      body["permissions"] = ceiling.value();
    } else if (flags.name() == "--json") {
      asJson = true;
    } else {
      return reportFailure("moat keys create", usageError("unknown option " + flags.name()));
    }
  }
  if (body["scopes"].empty()) {
    return reportFailure("moat keys create", usageError("at least one --scope is needed"));
  }
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("moat keys create", client.error());
  auto reply = client->request("POST", "/v1/keys", body.dump());
  if (!reply.ok()) return reportFailure("moat keys create", reply.error());
  if (reply->status != 201) return complain(kExitEnvironment, describeError(reply.value()));
  json key = json::parse(reply->body, nullptr, false);
  if (asJson) {
    std::printf("%s\n", key.dump(2).c_str());
  } else {
    std::printf("%s\n", key.value("token", "").c_str());
  }
  return 0;
}

int keysList(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  bool asJson = false;
  FlagReader flags(args);
  while (!flags.done()) {
    Status s = flags.next();
    if (!s.ok()) return reportFailure("moat keys ls", s.error());
    bool matched = false;
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok()) return reportFailure("moat keys ls", s.error());
    if (matched) continue;
    if (flags.name() != "--json") return reportFailure("moat keys ls", usageError("unknown option " + flags.name()));
    asJson = true;
  }
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("moat keys ls", client.error());
  auto reply = client->request("GET", "/v1/keys");
  if (!reply.ok()) return reportFailure("moat keys ls", reply.error());
  if (reply->status != 200) return complain(kExitEnvironment, describeError(reply.value()));
  json keys = json::parse(reply->body, nullptr, false);
  if (asJson) {
    std::printf("%s\n", keys["keys"].dump(2).c_str());
    return 0;
  }
  std::printf("%-13s %-20s %-8s %s\n", "ID", "NAME", "STATE", "SCOPES");
  for (const auto& k : keys["keys"]) {
    std::string scopes;
    for (const auto& s : k["scopes"]) scopes += (scopes.empty() ? "" : ",") + s.get<std::string>();
    std::printf("%-13s %-20s %-8s %s\n", k.value("id", "").c_str(), k.value("name", "").c_str(),
                k.value("revoked", false) ? "revoked" : "active", scopes.c_str());
  }
  return 0;
}

int keysRemove(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  std::vector<std::string> ids;
  FlagReader flags(args);
  while (!flags.done()) {
    if (!flags.currentIsFlag()) {
      ids.push_back(flags.current());
      flags.skip();
      continue;
    }
    Status s = flags.next();
    if (!s.ok()) return reportFailure("moat keys rm", s.error());
    bool matched = false;
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok()) return reportFailure("moat keys rm", s.error());
    if (!matched) return reportFailure("moat keys rm", usageError("unknown option " + flags.name()));
  }
  if (ids.empty()) return reportFailure("moat keys rm", usageError("which key? (moat keys rm ID...)"));
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("moat keys rm", client.error());
  int code = 0;
  for (const auto& id : ids) {
    if (id.empty() || id.find('/') != std::string::npos) {
      return reportFailure("moat keys rm", usageError("'" + id + "' is not a key id"));
    }
    auto reply = client->request("DELETE", "/v1/keys/" + urlEncode(id));
    if (!reply.ok()) return reportFailure("moat keys rm", reply.error());
    if (reply->status != 204) {
      code = complain(kExitEnvironment, describeError(reply.value()));
      continue;
    }
    std::printf("%s\n", id.c_str());
  }
  return code;
}

}  // namespace

int keysCommand(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::fputs(kKeysUsage, args.empty() ? stderr : stdout);
    return args.empty() ? kExitUsage : 0;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "create") return keysCreate(rest);
  if (args[0] == "ls" || args[0] == "list") return keysList(rest);
  if (args[0] == "rm" || args[0] == "revoke") return keysRemove(rest);
  std::fprintf(stderr, "moat keys: unknown subcommand '%s'\n%s", args[0].c_str(), kKeysUsage);
  return kExitUsage;
}

}  // namespace moat::cli
