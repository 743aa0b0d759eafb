#include <malloc.h>

#include <chrono>
#include <cstring>

#include "api/api.h"
#include "api/process_json.h"
#include "api/validation.h"
#include "common/encoding.h"
#include "templates/catalog.h"

// POST /v1/environments/{id}/exec: run a command to its end.
namespace moat::api {

std::optional<ApiError> Api::imageCommand(const std::string& id, std::vector<std::string>& argv) {
  const ApiError required =
      invalid("cmd", "required: a non-empty array of strings (the environment's template has no Entrypoint or Cmd)");
  auto record = environments_.get(id);
  if (!record.ok()) return fromError(record.error());
  if (templates_ == nullptr || !templates::validName(record->templateName)) return required;
  auto defaults = templates_->defaultsFor(record->templateName);
  if (!defaults.ok()) return required;  // gone since: nothing to run by default
  const auto& config = defaults->config;
  argv = config.entrypoint;
  argv.insert(argv.end(), config.cmd.begin(), config.cmd.end());
  if (argv.empty()) return required;
  return std::nullopt;
}

HttpResponse Api::execRoute(const HttpRequest& req, const Principal& principal, const std::string& id) {
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"cmd", "timeout_ms", "env", "cwd", "stdin", "encoding", "output_limit"}, "")) {
    return errorResponse(*e);
  }
  manager::ExecRequest exec;
  exec.actor = principal.owner();
  if (auto e = j.contains("cmd") ? commandLine(j["cmd"], "cmd", exec.argv) : imageCommand(id, exec.argv)) {
    return errorResponse(*e);
  }
  std::string encoding = "utf8";
  if (j.contains("encoding")) {
    if (!j["encoding"].is_string() || (j["encoding"] != "utf8" && j["encoding"] != "base64")) {
      return errorResponse(invalid("encoding", "must be \"utf8\" or \"base64\""));
    }
    encoding = j["encoding"];
  }
  exec.timeoutMs = 0;
  if (j.contains("timeout_ms")) {
    if (auto e = number(j["timeout_ms"], "timeout_ms", 1, 86400000, true, exec.timeoutMs)) return errorResponse(*e);
  }
  exec.outputLimit = 1u << 20;
  if (j.contains("output_limit")) {
    if (auto e = number(j["output_limit"], "output_limit", 0, 16u << 20, true, exec.outputLimit))
      return errorResponse(*e);
  }
  if (j.contains("cwd")) {
    if (auto e = absolutePath(j["cwd"], "cwd", exec.cwd)) return errorResponse(*e);
  }
  if (j.contains("stdin")) {
    if (!j["stdin"].is_string()) return errorResponse(invalid("stdin", "must be a string"));
    exec.withStdin = true;
    exec.stdinData = j["stdin"];
    if (encoding == "base64") {
      auto decoded = base64Decode(exec.stdinData);
      if (!decoded.ok()) return errorResponse(invalid("stdin", "is not valid base64"));
      exec.stdinData = decoded.value();
    }
    exec.stdinEvent = inputJson(exec.stdinData);
  }
  std::map<std::string, std::string> env;
  if (j.contains("env")) {
    if (auto e = stringMap(j["env"], "env", true, env)) return errorResponse(*e);
  }
  gate::Action action;
  action.scope = gate::Scope::kRunCommand;
  action.argv = exec.argv;
  // What the command runs with: the environment's variables, then these.
  action.env = commands_.envOf(id);
  for (const auto& [k, v] : env) action.env[k] = v;
  action.op = "exec";
  if (auto answer = check(req, principal, id, action)) return *answer;
  // Held until the answer is written: the output is in memory until then.
  auto reservation = commands_.reserveExecOutput(exec.actor, exec.outputLimit);
  if (!reservation.ok()) return errorResponse(fromError(reservation.error()));
  auto started = std::chrono::steady_clock::now();
  auto result = commands_.exec(id, exec, env);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  metrics_.observeExec(seconds);
  if (!result.ok()) return errorResponse(fromError(result.error()));
  auto& r = result.value();
  if (!r.started) {
    bool notFound = r.spawnStage == "exec" && r.spawnErrno == ENOENT;
    // Not an HTTP error: the agent reads it like a shell's answer.
    return respond(200, {{"exit_code", notFound ? 127 : 126},
                         {"stdout", ""},
                         {"stderr", std::string(notFound ? "command not found: " : "cannot run: ") + exec.argv[0] +
                                        " (" + r.spawnStage + ": " + std::strerror(r.spawnErrno) + ")\n"},
                         {"timed_out", false},
                         {"duration_ms", 0},
                         {"stdout_truncated", false},
                         {"stderr_truncated", false},
                         {"encoding", "utf8"}});
  }
  bool asBase64 = encoding == "base64" || !travelsAsJsonText(r.out) || !travelsAsJsonText(r.err);
  // Up to 16 MiB a stream: moved, not copied (an initializer list would copy
  // each twice), and each released once it is in the answer. The log held
  // the output in many small pieces, freed by now but kept by malloc: their
  // pages go back before the answer is built (large buffers are mapped on
  // their own and go back when freed; see moatd's main).
  bool large = r.out.size() + r.err.size() >= (1u << 20);
  if (large) ::malloc_trim(0);
  HttpResponse response;
  {
    json answer = json::object();
    answer["exit_code"] = r.signal ? 128 + r.signal : r.exitCode;
    answer["signal"] = r.signal;
    answer["stdout"] = asBase64 ? base64Encode(r.out) : std::move(r.out);
    std::string().swap(r.out);
    answer["stderr"] = asBase64 ? base64Encode(r.err) : std::move(r.err);
    std::string().swap(r.err);
    answer["timed_out"] = r.timedOut;
    answer["duration_ms"] = r.durationUs / 1000;
    answer["stdout_truncated"] = r.outTruncated;
    answer["stderr_truncated"] = r.errTruncated;
    answer["encoding"] = asBase64 ? "base64" : "utf8";
    response = respond(200, answer);
  }
  response.hold = std::move(reservation.value());  // until the answer is written
  if (large) {
    // And once it is written, what was freed meanwhile (the answer's own
    // buffers, other execs' logs in other arenas) goes back as well: the
    // trim above ran before them.
    response.hold = std::shared_ptr<void>(nullptr, [held = std::move(response.hold)](void*) mutable {
      held.reset();
      ::malloc_trim(0);
    });
  }
  return response;
}

}  // namespace moat::api
