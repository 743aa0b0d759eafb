// moat port: preview URLs of servers inside environments (docs/PORTS.md).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kPortUsage =
    R"(usage: moat port ENV PORT [--ttl S]      a preview URL of PORT inside ENV: opens in a browser
                                         without the token until it expires (default 1 hour,
                                         at most 7 days), is revoked, or ENV ends
       moat port ls ENV                  ENV's previews (their ids, ports and expiries)
       moat port revoke ENV PREVIEW...   end previews at once

  --json   print moatd's JSON instead

Anyone holding a preview URL reaches that port (and only it) until then: share
it like a password. With the token, /v1/environments/ENV/ports/PORT/... reaches
any port without a preview. Keys need the 'ports' scope.

)";

struct PortOptions : Parsed {
  std::optional<uint64_t> ttl;
};

Status parsePortArgs(const std::vector<std::string>& args, PortOptions& out) {
  return parseArgs(args, out, [&](FlagReader& flags, bool& matched) -> Status {
    matched = flags.name() == "--ttl";
    if (matched) {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(out.ttl, parseWhole(flags.name(), v));
    }
    return {};
  });
}

}  // namespace

int portCommand(const std::vector<std::string>& args) {
  PortOptions o;
  Status s = parsePortArgs(args, o);
  if (!s.ok()) return reportFailure("port", s.error());
  if (o.help || (!o.positional.empty() && o.positional[0] == "help")) {
    std::fputs(kPortUsage, stdout);
    std::fputs(connectionUsage(), stdout);
    return 0;
  }
  const std::string sub = o.positional.empty() ? "" : o.positional[0];
  const bool ls = sub == "ls" || sub == "list";
  const bool revoke = sub == "revoke" || sub == "rm";
  if ((ls && o.positional.size() != 2) || (revoke && o.positional.size() < 3) ||
      (!ls && !revoke && o.positional.size() != 2)) {
    std::fputs(kPortUsage, stderr);
    return kExitUsage;
  }
  if ((ls || revoke) && o.ttl) return reportFailure("port", usageError("--ttl is for 'moat port ENV PORT'"));
  auto env = environmentPath(o.positional[ls || revoke ? 1 : 0]);
  if (!env.ok()) return reportFailure("port", env.error());
  auto client = Client::fromOptions(o.connection);
  if (!client.ok()) return reportFailure("port", client.error());

  if (ls) {
    auto listed = call(client.value(), "GET", env.value() + "/previews", "", 200);
    if (!listed.ok()) return reportFailure("port ls", listed.error());
    json list = listed->value("previews", json::array());
    if (o.json) {
      std::puts(list.dump(2).c_str());
      return 0;
    }
    std::printf("%-14s  %-5s  %-24s  %s\n", "ID", "PORT", "CREATED", "EXPIRES");
    for (const auto& p : list) {
      std::printf("%-14s  %-5d  %-24s  %s\n", p.value("id", "").c_str(), p.value("port", 0),
                  p.value("created_at", "").c_str(), p.value("expires_at", "").c_str());
    }
    return 0;
  }
  if (revoke) {
    int code = 0;
    for (size_t i = 2; i < o.positional.size(); ++i) {
      const std::string& id = o.positional[i];
      if (id.empty() || id.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789") != std::string::npos) {
        code = reportFailure("port revoke", usageError("'" + id + "' is not a preview id (see moat port ls)"));
        continue;
      }
      auto done = call(client.value(), "DELETE", env.value() + "/previews/" + id, "", 204);
      if (!done.ok()) {
        code = reportFailure("port revoke", done.error());
        continue;
      }
      std::puts(id.c_str());
    }
    return code;
  }
  const std::string& portText = o.positional[1];
  if (portText.empty() || portText.size() > 5 || portText.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(portText) < 1 || std::stoi(portText) > 65535) {
    return reportFailure("port", usageError("'" + portText + "' is not a port (1 to 65535)"));
  }
  json body = {{"port", std::stoi(portText)}};
  if (o.ttl) body["ttl_s"] = *o.ttl;
  auto created = call(client.value(), "POST", env.value() + "/previews", body.dump(), 201);
  if (!created.ok()) return reportFailure("port", created.error());
  if (o.json) {
    std::puts(created->dump(2).c_str());
  } else {
    std::puts(created->value("url", "").c_str());
    std::fprintf(stderr, "moat: preview %s of port %s, until %s (moat port revoke %s %s ends it)\n",
                 created->value("id", "").c_str(), portText.c_str(), created->value("expires_at", "").c_str(),
                 o.positional[0].c_str(), created->value("id", "").c_str());
  }
  return 0;
}

}  // namespace moat::cli
