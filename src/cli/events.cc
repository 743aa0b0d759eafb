// moat events: moatd's audit log, listed or followed live.
#include "cli/events.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/exit_codes.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kEventsUsage =
    R"(usage: moat events [--env ID] [--type PREFIX] [--since ID] [--follow] [--json]

moatd's audit log: every side effect and decision (environments created and
destroyed, commands started and ended, files written and read, API keys,
refused tokens), oldest first.

  --env ID          only the events of this environment
  --type PREFIX     only the types that start with PREFIX ("exec.", "file.written")
  --since ID        only the events after this id
  --follow, -f      keep printing new events as they happen (until interrupted);
                    resumes after the last event seen if the connection drops
  --json            one JSON object per line (moatd's form, with the hashes)

Lines: time, id, type, environment, actor, what happened. Needs the master
token, or a key with the 'audit' scope (which sees only its environments).
)";

std::string str(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  const json& v = j[key];
  return v.is_string() ? v.get<std::string>() : v.is_null() ? "" : v.dump();
}

std::string argvText(const json& data) {
  std::string out;
  if (!data.contains("argv") || !data["argv"].is_array()) return out;
  for (const auto& a : data["argv"]) {
    std::string s = a.is_string() ? a.get<std::string>() : a.dump();
    bool plain = !s.empty() && s.find_first_of(" \t\n'\"\\$`") == std::string::npos;
    if (!out.empty()) out += ' ';
    out += plain ? s : json(s).dump();
  }
  return out;
}

// What happened, in a few words, by type.
std::string eventSummary(const json& event) {
  const std::string type = str(event, "type");
  const json data = event.contains("data") ? event["data"] : json::object();
  std::string out;
  if (type == "environment.created") {
    out = "template " + str(data, "template");
    if (data.contains("spec")) out += ", " + str(data["spec"], "ram_mb") + " MB";
    out += ", ttl " + str(data, "ttl_s") + " s";
    if (data.value("warm", false)) out += " (warm)";
  } else if (type == "environment.destroyed") {
    out = str(data, "reason");
  } else if (type == "environment.ttl_set") {
    out = "ttl " + str(data, "ttl_s") + " s";
  } else if (type == "exec.started" || type == "process.started") {
    out = argvText(data);
  } else if (type == "exec.ended" || type == "process.ended") {
    std::string state = str(data, "state");
    if (state == "exited") {
      out = "exit " + str(data, "exit_code") + " in " + str(data, "duration_ms") + " ms";
    } else if (state == "failed") {
      out = "exit " + str(data, "exit_code") + " (could not start)";
    } else {
      out = state + ": " + str(data, "reason");
    }
    out += ": " + argvText(data);
  } else if (type == "file.written") {
    out = str(data, "path") + " (" + str(data, "size") + " bytes, sha256 " + str(data, "sha256").substr(0, 12) + ")";
  } else if (type == "file.read") {
    out = str(data, "path");
    if (data.contains("op")) out += " (" + str(data, "op") + ")";
    if (data.contains("size")) out += " (" + str(data, "size") + " bytes)";
  } else if (type == "file.moved") {
    out = str(data, "from") + " -> " + str(data, "to");
  } else if (type == "file.removed" || type == "dir.created") {
    out = str(data, "path");
  } else if (type == "auth.failed") {
    out = str(data, "reason") + ": " + str(data, "method") + " " + str(data, "path");
    if (data.contains("key")) out += " (key " + str(data, "key") + ")";
    if (data.contains("remote")) out += " from " + str(data, "remote");
  } else if (type == "auth.denied") {
    out = str(data, "method") + " " + str(data, "path") + ": " + str(data, "reason");
  } else if (type == "key.created") {
    out = str(data, "key") + " " + str(data, "name") + " scopes " + str(data, "scopes");
  } else if (type == "key.revoked") {
    out = str(data, "key");
  } else if (type == "audit.checkpoint") {
    out = "pruned " + str(data, "pruned_count") + " events through " + str(data, "pruned_through");
  } else {
    out = data.dump(-1, ' ', false, json::error_handler_t::replace);
    if (out.size() > 160) out = out.substr(0, 157) + "...";
  }
  if (data.contains("error") && type != "environment.failed") out += " error: " + str(data, "error");
  if (type == "environment.failed") out = "create failed: " + str(data, "error");
  return out;
}

void print(const json& event, const std::string& line, bool asJson) {
  if (asJson) {
    std::printf("%s\n", line.c_str());
  } else {
    std::string env = str(event, "environment");
    std::printf("%s %6s %-21s %-12s %-12s %s\n", str(event, "time").c_str(), str(event, "id").c_str(),
                str(event, "type").c_str(), env.empty() ? "-" : env.c_str(), str(event, "actor").c_str(),
                eventSummary(event).c_str());
  }
}

// Follows the stream; on a dropped connection, reconnects after the last
// event seen, so nothing is printed twice or skipped.
int follow(Client& client, EventsQuery query, bool asJson) {
  bool connected = false;
  bool warned = false;
  for (;;) {
    SseParser parser;
    bool stopped = false;
    auto reply = client.stream(eventsTarget(query, true), [&](const std::string& bytes) {
      connected = true;
      return parser.feed(bytes, [&](const SseEvent& e) {
        json event = json::parse(e.data, nullptr, false);
        if (!event.is_object()) return true;
        print(event, e.data, asJson);
        if (std::fflush(stdout) != 0) {
          stopped = true;  // stdout is gone (a closed pipe)
          return false;
        }
        query.since = event.value("id", query.since);
        return true;
      });
    });
    if (stopped) return 0;
    if (reply.ok() && reply->status != 200) return complain(kExitEnvironment, describeError(reply.value()));
    if (!reply.ok() && !connected) return reportFailure("events", reply.error());
    if (!warned) {
      std::fprintf(stderr, "moat events: the stream from moatd ended%s; reconnecting\n",
                   reply.ok() ? "" : (" (" + reply.error().message() + ")").c_str());
      warned = true;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace

std::string eventsTarget(const EventsQuery& query, bool follow) {
  std::string target = "/v1/events?since=" + std::to_string(query.since);
  if (!query.environment.empty()) target += "&environment=" + urlEncode(query.environment);
  if (!query.typePrefix.empty()) target += "&type=" + urlEncode(query.typePrefix);
  if (follow) target += "&follow=1";
  return target;
}

Status readEvents(Client& client, EventsQuery query,
                  const std::function<bool(const json& event, const std::string& line)>& onEvent) {
  for (;;) {
    MOAT_ASSIGN(HttpReply reply, client.request("GET", eventsTarget(query, false)));
    if (reply.status != 200) return Error::make(Code::kApi, describeError(reply));
    size_t seen = 0;
    bool stop = false;
    SseParser parser;
    parser.feed(reply.body, [&](const SseEvent& e) {
      json event = json::parse(e.data, nullptr, false);
      if (!event.is_object() || !event.contains("id")) return true;
      ++seen;
      query.since = event["id"].get<uint64_t>();
      stop = !onEvent(event, e.data);
      return !stop;
    });
    if (stop || seen == 0) return {};
  }
}

int eventsCommand(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  EventsQuery query;
  bool follow = false;
  bool asJson = false;
  FlagReader flags(args);
  while (!flags.done()) {
    Status s = flags.next();
    if (!s.ok()) return reportFailure("events", s.error());
    bool matched = false;
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok()) return reportFailure("events", s.error());
    if (matched) continue;
    const std::string name = flags.name();
    if (name == "-h" || name == "--help") {
      std::fputs(kEventsUsage, stdout);
      std::fputs(connectionUsage(), stdout);
      return 0;
    }
    if (name == "--env" || name == "--type" || name == "--since") {
      auto v = flags.value();
      if (!v.ok()) return reportFailure("events", v.error());
      if (name == "--env") {
        query.environment = v.value();
      } else if (name == "--type") {
        query.typePrefix = v.value();
      } else {
        auto n = parseWhole("--since", v.value());
        if (!n.ok()) return reportFailure("events", n.error());
        query.since = n.value();
      }
    } else if (name == "--follow" || name == "-f") {
      if (auto s2 = flags.noValue(); !s2.ok()) return reportFailure("events", s2.error());
      follow = true;
    } else if (name == "--json") {
      if (auto s2 = flags.noValue(); !s2.ok()) return reportFailure("events", s2.error());
      asJson = true;
    } else {
      return reportFailure("events", usageError("unknown option " + name));
    }
  }
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("events", client.error());
  if (follow) return moat::cli::follow(client.value(), query, asJson);
  Status s = readEvents(client.value(), query, [&](const json& event, const std::string& line) {
    print(event, line, asJson);
    return true;
  });
  if (!s.ok()) return reportFailure("events", s.error());
  return 0;
}

}  // namespace moat::cli
