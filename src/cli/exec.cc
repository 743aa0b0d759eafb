// moat exec: one command in an environment kept by moatd.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "os/file.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kExecUsage = R"(usage: moat exec ENV [options] [--] COMMAND [ARG...]

Runs COMMAND in environment ENV (see moat env) and waits for it to end; then
prints its stdout and stderr to ours. Options end at `--` or at the first
argument after ENV that does not start with `-`.

Exit status: the command's (128+N if signal N killed it); 124 timeout;
126 cannot run; 127 not found; 125 moatd or the environment failed (one line
on stderr: moat: <message> (<code>)); 2 bad usage.

options:
  --timeout S       kill the command after S seconds (default: none)
  -i, --interactive send all of stdin to the command (default: no stdin)
  -e NAME=VALUE     set a variable (-e NAME copies the host's value); repeatable
  -w, --workdir DIR working directory inside, default /workspace
  --json            print moatd's whole answer instead of the output
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
      if (v.empty() || v[0] != '/')
        return usageError("-w: working directory must be absolute: " + v);
      o.workdir = os::normalizePath(v);
    } else {
      MOAT_TRY(readConnectionFlag(flags, o.connection, matched));
    }
    if (!matched) return usageError("unknown option " + name);
  }
  if (o.environment.empty())
    return usageError("missing environment id (usage: moat exec ENV [options] -- COMMAND...)");
  if (o.command.empty())
    return usageError("missing command (usage: moat exec ENV [options] -- COMMAND...)");
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

Result<json> requestBody(const ExecOptions& o) {
  MOAT_TRY(checkText(o));
  json body = {{"cmd", o.command}};
  if (o.timeoutSeconds > 0) {
    body["timeout_ms"] = std::max<int64_t>(1, std::llround(o.timeoutSeconds * 1000));
  }
  if (!o.env.empty()) body["env"] = o.env;
  if (!o.workdir.empty()) body["cwd"] = o.workdir;
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

Result<std::string> stream(const json& reply, const char* key, bool base64) {
  if (!reply.contains(key) || !reply[key].is_string()) return std::string();
  std::string data = reply[key].get<std::string>();
  if (!base64) return data;
  auto decoded = base64Decode(data);
  if (!decoded.ok())
    return Error::make("api", std::string("moatd's ") + key + " is not valid base64");
  return decoded.value();
}

int exitCodeOf(const json& reply) {
  if (reply.value("timed_out", false)) return kExitTimeout;
  if (!reply.contains("exit_code") || !reply["exit_code"].is_number_integer())
    return kExitEnvironment;
  int code = reply["exit_code"].get<int>();
  return code < 0 || code > 255 ? kExitEnvironment : code;
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
  auto client = Client::fromOptions(o.connection);
  if (!client.ok()) return reportFailure("exec", client.error());
  auto body = requestBody(o);
  if (!body.ok()) return reportFailure("exec", body.error());

  std::string request;
  try {
    request = body->dump();
  } catch (const json::exception&) {  // checkText covers what can reach here
    return reportFailure("exec", usageError("values must be valid UTF-8 (moatd's API is JSON)"));
  }
  auto reply = client->request("POST", path.value() + "/exec", request);
  if (!reply.ok()) return reportFailure("exec", reply.error());
  if (reply->status != 200) return complain(kExitEnvironment, describeError(reply.value()));
  json result = json::parse(reply->body, nullptr, false);
  if (!result.is_object())
    return complain(kExitEnvironment, "moatd answered with something that is not JSON");
  int code = exitCodeOf(result);
  if (o.json) {
    std::puts(result.dump(2).c_str());
    return code;
  }
  bool base64 = result.value("encoding", "utf8") == "base64";
  auto out = stream(result, "stdout", base64);
  auto err = stream(result, "stderr", base64);
  if (!out.ok()) return complain(kExitEnvironment, out.error().message());
  if (!err.ok()) return complain(kExitEnvironment, err.error().message());
  writeAll(1, out.value());
  writeAll(2, err.value());
  for (const char* s : {"stdout", "stderr"}) {
    if (result.value(std::string(s) + "_truncated", false)) {
      complain(0, std::string(s) + " was cut short at moatd's output limit");
    }
  }
  if (code == kExitTimeout && result.value("timed_out", false)) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", o.timeoutSeconds);
    complain(0, std::string("timeout: killed after ") + secs + "s");
  }
  return code;
}

}  // namespace moat::cli
