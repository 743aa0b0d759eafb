// moat exec: one command in an environment kept by moatd.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "cli/process_follow.h"
#include "common/path.h"
#include "os/file.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kExecUsage = R"(usage: moat exec ENV [options] [--] COMMAND [ARG...]

Runs COMMAND in environment ENV (see moat env) as if it ran here: its stdout
and stderr reach ours as it produces them. ^C, a hang-up and TERM are sent
on to it; a second ^C kills it; a third leaves without waiting. Options end
at `--` or at the first argument after ENV that does not start with `-`.

Exit status: the command's (128+N if signal N killed it); 124 timeout;
126 cannot run; 127 not found; 125 moatd or the environment failed (one line
on stderr: moat: <message> (<code>)); 2 bad usage.

options:
  --timeout S       kill the command after S seconds (default: none)
  -i, --interactive send our stdin to the command as it comes (default: none)
  -e NAME=VALUE     set a variable (-e NAME copies the host's value); repeatable
  -w, --workdir DIR working directory inside, default /workspace
  --json            wait for the command to end, then print moatd's whole
                    answer (POST .../exec) instead of the output
)";

struct ExecOptions {
  ConnectionOptions connection;
  std::string environment;
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  std::string workdir;
  double timeoutSeconds = 0;
  bool interactive = false;
  bool json = false;
  bool help = false;
};

Result<ExecOptions> parseExecOptions(const std::vector<std::string>& args) {
  ExecOptions o;
  FlagReader flags(args);
  while (!flags.done()) {
    if (flags.current() == "--") {
      flags.skip();
      std::vector<std::string> rest = flags.rest();
      if (o.environment.empty() && !rest.empty()) {
        o.environment = rest[0];
        rest.erase(rest.begin());
      }
      o.command = rest;
      break;
    }
    if (!flags.currentIsFlag()) {
      if (!o.environment.empty()) {  // the command starts here
        o.command = flags.rest();
        break;
      }
      o.environment = flags.current();
      flags.skip();
      continue;
    }
    MOAT_TRY(flags.next());
    const std::string& name = flags.name();
    bool matched = true;
    if (name == "-h" || name == "--help") {
      MOAT_TRY(flags.noValue());
      o.help = true;
      return o;
    } else if (name == "-i" || name == "--interactive") {
      MOAT_TRY(flags.noValue());
      o.interactive = true;
    } else if (name == "--json") {
      MOAT_TRY(flags.noValue());
      o.json = true;
    } else if (name == "--timeout") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(o.timeoutSeconds, parseNumber(name, v));
      if (!(o.timeoutSeconds >= 0.001 && o.timeoutSeconds <= 86400)) {
        return usageError("--timeout: " + v + " is out of range (0.001 to 86400 seconds)");
      }
    } else if (name == "-e" || name == "--env") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_TRY(parseVariable(name, v, o.env));
    } else if (name == "-w" || name == "--workdir") {
      MOAT_ASSIGN(std::string v, flags.value());
      if (v.empty() || v[0] != '/') return usageError("-w: working directory must be absolute: " + v);
      o.workdir = moat::normalizePath(v);
    } else {
      MOAT_TRY(readConnectionFlag(flags, o.connection, matched));
    }
    if (!matched) return unknownOption(name);
  }
  if (o.environment.empty()) return usageError("missing environment id (usage: moat exec ENV [options] -- COMMAND...)");
  if (o.command.empty()) return usageError("missing command (usage: moat exec ENV [options] -- COMMAND...)");
  return o;
}

Result<std::string> readStdin() {
  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(0, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::fromErrno("reading stdin");
    if (n == 0) return data;
    data.append(buf, static_cast<size_t>(n));
  }
}

// moatd's API carries text: arguments, variables and paths must be UTF-8.
Status checkText(const ExecOptions& o) {
  for (size_t i = 0; i < o.command.size(); ++i) {
    if (!isValidUtf8(o.command[i])) {
      return usageError("the command's argument " + std::to_string(i) + " is not valid UTF-8");
    }
  }
  for (const auto& [k, v] : o.env) {
    if (!isValidUtf8(v)) return usageError("-e " + k + ": the value is not valid UTF-8");
  }
  if (!isValidUtf8(o.workdir)) return usageError("-w: the path is not valid UTF-8");
  return {};
}

json commonFields(const ExecOptions& o) {
  json body = {{"cmd", o.command}};
  if (o.timeoutSeconds > 0) {
    body["timeout_ms"] = std::max<int64_t>(1, std::llround(o.timeoutSeconds * 1000));
  }
  if (!o.env.empty()) body["env"] = o.env;
  if (!o.workdir.empty()) body["cwd"] = o.workdir;
  return body;
}

// --json: one POST .../exec, stdin read whole first.
Result<json> execBody(const ExecOptions& o) {
  json body = commonFields(o);
  if (o.interactive) {
    MOAT_ASSIGN(std::string input, readStdin());
    if (isValidUtf8(input)) {
      body["stdin"] = input;
    } else {
      body["stdin"] = base64Encode(input);
      body["encoding"] = "base64";
    }
  }
  return body;
}

// The command as a process moatd keeps, followed live.
json processBody(const ExecOptions& o) {
  json body = commonFields(o);
  body["stdin"] = o.interactive;
  body["lossless"] = true;  // a slow reader of ours holds the command up instead of losing its output
  return body;
}

int exitCodeOf(const json& reply) {
  if (reply.value("timed_out", false)) return kExitTimeout;
  if (!reply.contains("exit_code") || !reply["exit_code"].is_number_integer()) return kExitEnvironment;
  int code = reply["exit_code"].get<int>();
  return code < 0 || code > 255 ? kExitEnvironment : code;
}

// --json: the whole answer of a blocking exec.
int execWhole(Client& client, const std::string& path, const ExecOptions& o) {
  auto body = execBody(o);
  if (!body.ok()) return reportFailure("exec", body.error());
  auto reply = client.request("POST", path + "/exec", body->dump());
  if (!reply.ok()) return reportFailure("exec", reply.error());
  if (reply->status != 200) return complain(kExitEnvironment, describeError(reply.value()));
  json result = json::parse(reply->body, nullptr, false);
  if (!result.is_object()) return complain(kExitEnvironment, "moatd answered with something that is not JSON");
  std::puts(result.dump(2).c_str());
  return exitCodeOf(result);
}

}  // namespace

int execCommand(const std::vector<std::string>& args) {
  auto parsed = parseExecOptions(args);
  if (!parsed.ok()) return reportFailure("exec", parsed.error());
  ExecOptions& o = parsed.value();
  if (o.help) {
    std::fputs(kExecUsage, stdout);
    std::fputs(connectionUsage(), stdout);
    return 0;
  }
  auto path = environmentPath(o.environment);
  if (!path.ok()) return reportFailure("exec", path.error());
  if (Status s = checkText(o); !s.ok()) return reportFailure("exec", s.error());
  auto client = Client::fromOptions(o.connection);
  if (!client.ok()) return reportFailure("exec", client.error());
  if (o.json) return execWhole(client.value(), path.value(), o);

  auto started = call(client.value(), "POST", path.value() + "/processes", processBody(o).dump(), 201);
  if (!started.ok()) return reportFailure("exec", started.error());
  FollowOptions follow;
  follow.environment = o.environment;
  follow.process = started->is_object() && started->contains("id") && started->at("id").is_number_unsigned()
                       ? started->at("id").get<uint64_t>()
                       : 0;
  if (follow.process == 0) return complain(kExitEnvironment, "moatd's answer names no process");
  follow.forwardStdin = o.interactive;
  follow.timeoutSeconds = o.timeoutSeconds;
  return followProcess(client.value(), follow);
}

}  // namespace moat::cli
