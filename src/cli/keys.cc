// moat keys: scoped API keys (master token only).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "common/unique_fd.h"
#include "os/file.h"
#include "os/process.h"
#include "os/tree.h"
#include "os/users.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kKeysUsage =
    R"(usage: moat keys create --scope S [--scope S]... [--name NAME] [--for-user USER] [--json]
       moat keys ls [--json]
       moat keys rm ID...

Scoped API keys for agents, so they never need the master token. Scopes:
create, read, exec, files, destroy, timeout, approve, permissions, audit,
snapshots. A key sees and touches only the
environments it created. `create` prints the token once (keep it: only its
hash is stored). Needs the master token.

--for-user USER (root): the token is not printed but written to USER's
~/.config/moat/token (mode 0600, as USER), where USER's moat and moat mcp
find it; the key is named USER unless --name says otherwise. USER also
needs to be in the group moatd's --socket-group names (the package's: moat)
to reach moatd's socket (docs/INSTALL.md).
)";

// Writes `token` where userTokenPath() finds it for `user` (without
// XDG_CONFIG_HOME), as that user.
Status saveForUser(const os::UserEntry& user, const std::string& token, std::string& where) {
  const std::string dir = user.home + "/.config/moat";
  where = dir + "/token";
  return os::runAsUser(user, [&]() -> Status {
    MOAT_TRY(os::makeDirs(dir, 0700, 0700));
    MOAT_ASSIGN(UniqueFd fd, os::open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    // A new file of mode 0600 in a directory of mode 0700, whatever was
    // there: one that others could read must not get the new token.
    MOAT_TRY(os::chmodDirectory(fd.get(), ".", 0700));
    MOAT_TRY(os::removeAt(fd.get(), "token"));
    return os::createFileAt(fd.get(), "token", 0600, token + "\n");
  });
}

// Whether `user` may connect to the unix socket at `path` (a note when not).
void noteSocketAccess(const os::UserEntry& user, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || user.uid == 0 || (st.st_mode & 0002) != 0) return;
  auto groups = os::supplementaryGroups(user.name);
  bool member = user.gid == st.st_gid || std::find(groups.begin(), groups.end(), st.st_gid) != groups.end();
  if (member && (st.st_mode & 0020) != 0) return;
  std::fprintf(stderr,
               "moat keys create: note: %s cannot connect to %s yet: %s (adduser %s GROUP, where moatd runs with "
               "--socket-group GROUP)\n",
               user.name.c_str(), path.c_str(),
               (st.st_mode & 0020) == 0 ? "moatd serves it to root alone" : "not a member of its group",
               user.name.c_str());
}

int keysCreate(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  json body = {{"scopes", json::array()}};
  bool asJson = false;
  std::string forUser;
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
    } else if (flags.name() == "--for-user") {
      auto v = flags.value();
      if (!v.ok()) return reportFailure("moat keys create", v.error());
      if (v->empty()) return reportFailure("moat keys create", usageError("--for-user needs a user name"));
      forUser = v.value();
    } else {
      return reportFailure("moat keys create", usageError("unknown option " + flags.name()));
    }
  }
  if (body["scopes"].empty()) {
    return reportFailure("moat keys create", usageError("at least one --scope is needed"));
  }
  std::optional<os::UserEntry> user;
  if (!forUser.empty()) {
    if (::geteuid() != 0)
      return complain(kExitUsage, "moat keys create: --for-user needs root (it writes into " + forUser + "'s home as " +
                                      forUser + ")");
    auto found = os::userNamed(forUser);
    if (!found.ok()) return reportFailure("moat keys create", found.error());
    user = found.value();
    if (!body.contains("name")) body["name"] = user->name;
  }
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("moat keys create", client.error());
  auto reply = client->request("POST", "/v1/keys", body.dump());
  // For a user: from the key's arrival to its saving (or its revocation
  // when that fails) and the end of the keys it replaces, an interrupt
  // waits (runAsUser bounds the save), so none is left active that nobody
  // holds. (One interrupted before its answer came, never seen by anyone,
  // goes with the next --for-user of that name.)
  std::optional<os::TerminationSignalsHeld> held;
  if (user) held.emplace();
  if (!reply.ok()) return reportFailure("moat keys create", reply.error());
  if (reply->status != 201) return complain(kExitEnvironment, describeError(reply.value()));
  json key = json::parse(reply->body, nullptr, false);
  if (user) {
    std::string where;
    Status saved = saveForUser(*user, key.value("token", ""), where);
    if (!saved.ok()) {
      // A key nobody holds: revoked again, so no secret is left unaccounted for.
      auto removed = client->request("DELETE", "/v1/keys/" + key.value("id", ""));
      bool gone = removed.ok() && removed->status == 204;
      return complain(kExitEnvironment,
                      "moat keys create: cannot save the key for " + user->name + " in " + where + ": " +
                          saved.error().message() +
                          (gone ? " (the key was revoked)"
                                : " (and revoking the key failed: moat keys rm " + key.value("id", "") + ")"));
    }
    key.erase("token");
    key["saved_to"] = where;
    // The token it replaced in that file is nobody's any more: the earlier
    // keys of that name are revoked (a re-issue after a leak must end it).
    json revoked = json::array();
    auto listed = call(client.value(), "GET", "/v1/keys", "", 200);
    if (listed.ok() && listed->is_object() && (*listed)["keys"].is_array()) {
      for (const auto& old : (*listed)["keys"]) {
        if (!old.is_object() || old.value("name", "") != body["name"] || old.value("revoked", true) ||
            old.value("id", "") == key.value("id", "")) {
          continue;
        }
        auto removed = client->request("DELETE", "/v1/keys/" + old.value("id", ""));
        if (removed.ok() && removed->status == 204) revoked.push_back(old.value("id", ""));
      }
    }
    key["revoked_earlier"] = revoked;
    if (client->endpoint().transport == Endpoint::Transport::kUnix) noteSocketAccess(*user, client->endpoint().path);
    if (!asJson) {
      std::printf("key %s for %s saved to %s\n", key.value("id", "").c_str(), user->name.c_str(), where.c_str());
      for (const auto& id : revoked) {
        std::printf("revoked %s's earlier key %s\n", user->name.c_str(), id.get<std::string>().c_str());
      }
      return 0;
    }
  }
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
