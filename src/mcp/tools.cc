#include "mcp/tools.h"

#include <algorithm>
#include <chrono>

#include "common/encoding.h"
#include "mcp/output.h"

namespace moat::mcp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxFileRead = 256 * 1024;
constexpr size_t kMaxSearchLines = 200;
constexpr size_t kKeepPerStream = 4 << 20;  // collected before capping; beyond: counted only

// Descriptions are written for a model: what the tool does, when to use it,
// what comes back.
const char* kToolDefinitions = R"json([
{"name": "create_environment",
 "description": "Create a new isolated Linux environment (its own processes, files and network; root inside cannot touch the host). You only need this for a second environment or special settings: tools without environment_id already use this session's own environment. The new environment outlives the session until destroyed or its TTL ends. Returns its id.",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {
   "template": {"type": "string", "description": "'host' (default: the host's /usr read-only, a clean /etc), a template's name (imported from an OCI image) or an absolute root file system directory on the host"},
   "cpus": {"type": "number", "minimum": 0.01, "maximum": 1024, "description": "CPU time per second, default 1"},
   "ram_mb": {"type": "integer", "minimum": 16, "description": "memory limit in MB, default 1024"},
   "storage_gb": {"type": "number", "minimum": 0.01, "description": "writable storage in GB, default 4"},
   "pids": {"type": "integer", "minimum": 4, "description": "process limit, default 1024"},
   "ttl_s": {"type": "integer", "minimum": 1, "maximum": 604800, "description": "destroyed after this many seconds, default 3600"},
   "on_expiry": {"type": "string", "enum": ["destroy", "pause", "checkpoint"], "description": "what the end of ttl_s does: 'destroy' (default), 'pause' (kept, paused, until resume_environment gives it ttl_s again) or 'checkpoint' (the same with its memory saved to disk: microvm only)"},
   "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "your own key=value tags, to find it by later"},
   "network": {"description": "'none' (default: no network), 'open', or {\"mode\": \"allowlist\", \"allow\": [\"pypi.org\", \"*.github.com\"]}", "anyOf": [{"type": "string", "enum": ["none", "open"]}, {"type": "object"}]},
   "permissions": {"type": "object", "description": "what the environment may do without asking a person: {\"run_command\": \"allow\"|\"ask\"|\"deny\"|[rules], \"read_file\": ..., \"write_file\": ..., \"network\": ...}"}}}},
{"name": "list_environments",
 "description": "List the environments you can use (id, state, spec, labels).",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {}}},
{"name": "destroy_environment",
 "description": "Destroy an environment and everything in it (processes, files). Cannot be undone.",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["environment_id"], "properties": {
   "environment_id": {"type": "string", "description": "the environment to destroy"}}}},
{"name": "run_command",
 "description": "Run a command to completion in the environment and return its exit code, stdout and stderr. Give either command (a shell string run by sh -c, so pipes and && work) or argv (an exact argument list). A non-zero exit code is a normal result, not a failure of the tool. Output is capped at 32 KiB per stream (first 8 KiB and last 24 KiB kept). For servers or anything interactive use start_process.",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "command": {"type": "string", "description": "a shell command line, e.g. 'pip install -r requirements.txt && pytest -q'"},
   "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "the program and its arguments, without a shell"},
   "cwd": {"type": "string", "description": "working directory, default /workspace"},
   "timeout_s": {"type": "integer", "minimum": 1, "maximum": 3600, "description": "kill the command after this many seconds, default 120"},
   "stdin": {"type": "string", "description": "text given to the command on its standard input"}}}},
{"name": "start_process",
 "description": "Start a command in the background (a server, a watcher, an interactive program) and return its process_id at once. Follow it with read_process_output, feed it with send_input, stop it with kill_process.",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "command": {"type": "string", "description": "a shell command line"},
   "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "the program and its arguments"},
   "cwd": {"type": "string", "description": "working directory, default /workspace"}}}},
{"name": "read_process_output",
 "description": "Read what a background process wrote since an offset. Returns the output, 'next' (pass it as since next time) and whether the process is still running (with its exit code once it ended). wait_s waits for new output or the end.",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["process_id"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "process_id": {"type": "integer", "minimum": 1, "description": "the id start_process returned"},
   "since": {"type": "integer", "minimum": 0, "description": "offset to read from, default 0"},
   "wait_s": {"type": "number", "minimum": 0, "maximum": 30, "description": "wait up to this long for new output, default 0"}}}},
{"name": "send_input",
 "description": "Write text to a background process's standard input (add \\n to end a line).",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["process_id", "input"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "process_id": {"type": "integer", "minimum": 1, "description": "the id start_process returned"},
   "input": {"type": "string", "description": "the text to write, e.g. \"yes\\n\""},
   "close": {"type": "boolean", "description": "close stdin afterwards (end of input)"}}}},
{"name": "kill_process",
 "description": "Send a signal to a background process and its children (default TERM; KILL cannot be ignored).",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["process_id"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "process_id": {"type": "integer", "minimum": 1, "description": "the id start_process returned"},
   "signal": {"type": "string", "enum": ["TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"], "description": "the signal, default TERM"}}}},
{"name": "read_file",
 "description": "Read a text file in the environment, whole or a range of lines (1-based, inclusive). At most 256 KiB are returned.",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["path"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "path": {"type": "string", "description": "absolute path, or relative to /workspace"},
   "start_line": {"type": "integer", "minimum": 1, "description": "first line to return (1-based), default 1"},
   "end_line": {"type": "integer", "minimum": 1, "description": "last line to return (inclusive), default the end"}}}},
{"name": "write_file",
 "description": "Create or overwrite a file in the environment with the given content (parent directories are created).",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["path", "content"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "path": {"type": "string", "description": "absolute path, or relative to /workspace"},
   "content": {"type": "string", "description": "the whole new content of the file"}}}},
{"name": "edit_file",
 "description": "Replace exact text in a file: old_string must appear exactly once (or use replace_all). Include enough surrounding lines to make it unique. Fails without changing anything if old_string is not found.",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["path", "old_string", "new_string"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "path": {"type": "string", "description": "absolute path, or relative to /workspace"},
   "old_string": {"type": "string", "minLength": 1, "description": "the exact text to replace, whitespace included"},
   "new_string": {"type": "string", "description": "what replaces it"},
   "replace_all": {"type": "boolean", "description": "replace every occurrence"}}}},
{"name": "list_files",
 "description": "List a directory in the environment: names, types and sizes.",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "path": {"type": "string", "description": "default /workspace"}}}},
{"name": "search_files",
 "description": "Search file contents under a directory with a regular expression (grep -E). Returns matching lines as file:line:text, at most 200.",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["pattern"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "pattern": {"type": "string", "minLength": 1, "description": "an extended regular expression (grep -E)"},
   "path": {"type": "string", "description": "directory or file, default /workspace"},
   "glob": {"type": "string", "description": "only files whose name matches, e.g. *.py"}}}},
{"name": "snapshot_environment",
 "description": "Save the environment's files as they are now (a snapshot: fast, no data is copied). Running processes are not saved. Take one before a risky change; restore_environment goes back to it, fork_environment or create_environment-from-snapshot branches from it. Returns the snapshot id.",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "name": {"type": "string", "maxLength": 256, "description": "a label for people, e.g. 'before refactor'"}}}},
{"name": "restore_environment",
 "description": "Put the environment's files back exactly as a snapshot has them (files changed, added or deleted since are undone). Every process in it ends; the environment keeps its id and settings.",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["snapshot_id"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "snapshot_id": {"type": "string", "pattern": "^snap-[0-9a-f]{12}$", "description": "from snapshot_environment"}}}},
{"name": "fork_environment",
 "description": "Create a second environment that starts as a copy of this one's files and settings (and, with memory, its running processes), to try something without touching the original. Returns the new environment's id; pass it as environment_id to other tools.",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {
   "environment_id": {"type": "string", "description": "the one to copy; default: this session's environment"},
   "task_id": {"type": "string", "description": "your name for the fork's task"},
   "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "key=value tags for the fork"},
   "ttl_s": {"type": "integer", "minimum": 1, "maximum": 604800, "description": "destroyed after this many seconds, default 3600"},
   "memory": {"type": "boolean", "description": "copy its running processes too, which go on in the fork where they were (a REPL with its variables, a started server); microvm environments only"}}}},
{"name": "pause_environment",
 "description": "Stop every process in the environment where it is (its memory and files are kept), e.g. to hold a long job while a person looks. While paused, commands and file changes are refused; reading files still works. resume_environment lets them go on.",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "memory": {"type": "string", "enum": ["ram", "disk"], "description": "'ram' (default) keeps its memory; 'disk' saves it to disk and releases it (a checkpoint, microvm environments only; a file read brings it back into RAM, still paused, for a while)"}}}},
{"name": "resume_environment",
 "description": "Let a paused environment's processes go on from where they stopped.",
 "inputSchema": {"type": "object", "additionalProperties": false, "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"}}}},
{"name": "set_network_policy",
 "description": "Change what the environment may reach on the network: 'none' (nothing), 'open' (any public host, recorded), or an allowlist {\"mode\": \"allowlist\", \"allow\": [\"pypi.org\", \"*.pythonhosted.org\"], \"deny\": [...]}. Takes effect for new connections.",
 "inputSchema": {"type": "object", "additionalProperties": false, "required": ["network"], "properties": {
   "environment_id": {"type": "string", "description": "default: this session's environment"},
   "network": {"description": "'none', 'open', or {\"mode\": \"allowlist\", \"allow\": [...], \"deny\": [...]}", "anyOf": [{"type": "string", "enum": ["none", "open"]}, {"type": "object"}]}}}}
])json";

const json& definitions() {
  static const json defs = json::parse(kToolDefinitions);
  return defs;
}

bool typeMatches(const json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "array") return v.is_array();
  if (type == "object") return v.is_object();
  return true;
}

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  return "/workspace/" + path;
}

std::string envPath(const std::string& env) { return "/v1/environments/" + urlEncode(env); }

std::string describeStatus(const json& result) {
  std::string out = "exit code " + std::to_string(result.value("exit_code", -1));
  if (result.value("timed_out", false)) out += " (timed out)";
  return out;
}

std::string section(const std::string& name, const std::string& text, size_t& omitted) {
  Capped c = capOutput(text);
  omitted += c.omitted;
  if (text.empty()) return "";
  return "\n--- " + name + " ---\n" + c.text + (c.text.empty() || c.text.back() == '\n' ? "" : "\n");
}

}  // namespace

std::string checkArguments(const json& args, const json& schema, const std::string& where) {
  auto name = [&](const std::string& key) { return where.empty() ? key : where + "." + key; };
  if (schema.contains("anyOf")) {
    for (const auto& option : schema["anyOf"]) {
      if (checkArguments(args, option, where).empty()) return "";
    }
    return (where.empty() ? "arguments" : where) + ": " + schema.value("description", "does not fit the schema");
  }
  if (schema.contains("type") && !typeMatches(args, schema["type"])) {
    return (where.empty() ? "arguments" : where) + ": must be " + schema["type"].get<std::string>();
  }
  if (schema.contains("enum") &&
      std::find(schema["enum"].begin(), schema["enum"].end(), args) == schema["enum"].end()) {
    return where + ": must be one of " + schema["enum"].dump();
  }
  if (args.is_number()) {
    double v = args.get<double>();
    if (schema.contains("minimum") && v < schema["minimum"].get<double>()) {
      return where + ": at least " + schema["minimum"].dump();
    }
    if (schema.contains("maximum") && v > schema["maximum"].get<double>()) {
      return where + ": at most " + schema["maximum"].dump();
    }
  }
  if (args.is_string() && schema.contains("minLength") && args.get<std::string>().empty()) {
    return where + ": must not be empty";
  }
  if (args.is_array()) {
    if (schema.contains("minItems") && args.size() < schema["minItems"].get<size_t>()) {
      return where + ": needs at least " + schema["minItems"].dump() + " item(s)";
    }
    if (schema.contains("items")) {
      for (size_t i = 0; i < args.size(); ++i) {
        std::string e = checkArguments(args[i], schema["items"], where + "[" + std::to_string(i) + "]");
        if (!e.empty()) return e;
      }
    }
  }
  if (args.is_object()) {
    const json props = schema.value("properties", json::object());
    for (const auto& r : schema.value("required", json::array())) {
      if (!args.contains(r.get<std::string>())) return name(r) + ": required";
    }
    for (auto it = args.begin(); it != args.end(); ++it) {
      if (props.contains(it.key())) {
        std::string e = checkArguments(it.value(), props[it.key()], name(it.key()));
        if (!e.empty()) return e;
      } else if (schema.contains("additionalProperties")) {
        const json& extra = schema["additionalProperties"];
        if (extra.is_boolean() && !extra.get<bool>()) {
          return name(it.key()) + ": unknown argument (known: " + [&] {
            std::string k;
            for (auto p = props.begin(); p != props.end(); ++p) k += (k.empty() ? "" : ", ") + p.key();
            return k;
          }() + ")";
        }
        if (extra.is_object()) {
          std::string e = checkArguments(it.value(), extra, name(it.key()));
          if (!e.empty()) return e;
        }
      }
    }
  }
  return "";
}

json Tools::list() { return definitions(); }

bool Tools::exists(const std::string& name) {
  const json& defs = definitions();
  return std::any_of(defs.begin(), defs.end(), [&](const json& t) { return t["name"] == name; });
}

std::string Tools::describeFailure(const RestResponse& r) {
  if (r.status == 0) return "moatd is not reachable: " + r.body;
  json body = json::parse(r.body, nullptr, false);
  if (body.is_object() && body.contains("error") && body["error"].is_object()) {
    const json& e = body["error"];
    std::string message = e.value("message", "");
    std::string code = e.value("code", "");
    if (code == "denied_by_policy") return "denied by policy: " + message;
    if (e.contains("field") && e["field"].is_string() && !e["field"].get<std::string>().empty() &&
        message.find(e["field"].get<std::string>()) == std::string::npos) {
      message = e["field"].get<std::string>() + ": " + message;
    }
    return message.empty() ? code : message;
  }
  return "moatd answered " + std::to_string(r.status);
}

Tools::Rest Tools::rest(const std::string& method, const std::string& target, const std::string& body) {
  RestResponse r = session_.rest_.call(method, target, body);
  Rest out{r.status, json::parse(r.body, nullptr, false), r.body, ""};
  if (r.status >= 300 || r.status == 0) out.error = describeFailure(r);
  return out;
}

json Tools::call(const std::string& name, const json& args) {
  const json& defs = definitions();
  auto def = std::find_if(defs.begin(), defs.end(), [&](const json& t) { return t["name"] == name; });
  std::string problem = checkArguments(args, (*def)["inputSchema"]);
  if (!problem.empty()) return toolError("invalid arguments: " + problem);
  if (name == "create_environment") return createEnvironment(args);
  if (name == "list_environments") return listEnvironments();
  if (name == "destroy_environment") return destroyEnvironment(args);
  if ((name == "run_command" || name == "start_process") && args.contains("command") == args.contains("argv")) {
    return toolError("invalid arguments: give either command (a shell string) or argv (an array), not both or neither");
  }
  std::string error;
  auto env = session_.environmentFor(args, error);
  if (!env) return toolError(error);
  if (name == "run_command") return runCommand(*env, args);
  if (name == "start_process") return startProcess(*env, args);
  if (name == "read_process_output") return readProcessOutput(*env, args);
  if (name == "send_input") return sendInput(*env, args);
  if (name == "kill_process") return killProcess(*env, args);
  if (name == "read_file") return readFile(*env, args);
  if (name == "write_file") return writeFile(*env, args);
  if (name == "edit_file") return editFile(*env, args);
  if (name == "list_files") return listFiles(*env, args);
  if (name == "search_files") return searchFiles(*env, args);
  if (name == "snapshot_environment") return snapshotEnvironment(*env, args);
  if (name == "restore_environment") return restoreEnvironment(*env, args);
  if (name == "fork_environment") return forkEnvironment(*env, args);
  if (name == "pause_environment" || name == "resume_environment") {
    if (args.contains("memory") && args["memory"] != "ram" && args["memory"] != "disk") {
      return toolError("memory must be \"ram\" or \"disk\"");
    }
    return pauseEnvironment(*env, name == "pause_environment", args.contains("memory") && args["memory"] == "disk");
  }
  return setNetworkPolicy(*env, args);
}

json Tools::createEnvironment(const json& args) {
  json body = json::object(), spec = json::object();
  for (const char* k : {"cpus", "ram_mb", "storage_gb", "pids"}) {
    if (args.contains(k)) spec[k] = args[k];
  }
  for (const char* k : {"template", "ttl_s", "on_expiry", "labels", "network", "permissions"}) {
    if (args.contains(k)) body[k] = args[k];
  }
  if (!spec.empty()) body["spec"] = spec;
  call_.status("creating an environment");
  Rest r = rest("POST", "/v1/environments", body.dump());
  if (r.status != 201) return toolError("could not create the environment: " + r.error);
  return toolResult("created environment " + r.body["id"].get<std::string>() +
                        " (pass it as environment_id; it lives until destroyed or its TTL ends)",
                    {{"environment", r.body}});
}

json Tools::listEnvironments() {
  Rest r = rest("GET", "/v1/environments");
  if (r.status != 200) return toolError(r.error);
  std::string text;
  for (const auto& e : r.body["environments"]) {
    text += e.value("id", "") + "  " + e.value("state", "") + "  " + e["spec"].dump() + "\n";
  }
  return toolResult(text.empty() ? "no environments" : text, {{"environments", r.body["environments"]}});
}

json Tools::destroyEnvironment(const json& args) {
  std::string id = args["environment_id"];
  Rest r = rest("DELETE", envPath(id));
  if (r.status != 204) return toolError(r.error);
  {
    std::lock_guard<std::mutex> lock(session_.mutex_);
    if (session_.defaultEnvironment_ == id) session_.defaultEnvironment_.clear();  // a new one on next use
  }
  return toolResult("destroyed environment " + id, {{"environment_id", id}, {"destroyed", true}});
}

Tools::Collected Tools::collect(const std::string& env, uint64_t process, uint64_t since, Clock::time_point deadline,
                                bool untilEnd) {
  Collected c;
  c.next = since;
  auto pause = std::chrono::milliseconds(2);
  while (true) {
    Rest r =
        rest("GET", envPath(env) + "/processes/" + std::to_string(process) + "/output?since=" + std::to_string(c.next));
    if (r.status != 200) {
      c.failure = r.error;
      return c;
    }
    bool progressed = false;
    const std::string& text = r.text;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      json e = json::parse(text.substr(start, end - start), nullptr, false);
      start = end + 1;
      if (!e.is_object()) continue;
      std::string type = e.value("type", "");
      if (type == "output") {
        std::string data = e.value("data", "");
        if (e.value("encoding", "utf8") == "base64") {
          auto decoded = base64Decode(data);
          data = decoded.ok() ? decoded.value() : "";
        }
        std::string& into = e.value("stream", "stdout") == "stderr" ? c.err : c.out;
        if (into.size() < kKeepPerStream) into += data;
        c.next = e.value("offset", c.next) + data.size();
        progressed = true;
      } else if (type == "dropped") {
        c.next = e.value("offset", c.next) + e.value("bytes", uint64_t{0});
        c.out += "\n[... " + std::to_string(e.value("bytes", uint64_t{0})) + " bytes of output were dropped ...]\n";
        progressed = true;
      } else if (type == "exit" || type == "end") {
        c.ended = true;
        c.terminal = e;
        return c;
      }
    }
    if (progressed && !untilEnd) return c;
    if (call_.cancelled() || Clock::now() >= deadline) return c;
    if (progressed) pause = std::chrono::milliseconds(2);
    if (call_.sleepFor(pause)) return c;
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

json Tools::runCommand(const std::string& env, const json& args) {
  json argv = args.contains("argv") ? args["argv"] : json::array({"sh", "-c", args["command"]});
  int64_t timeoutS = args.value("timeout_s", 120);
  bool withStdin = args.contains("stdin");
  json body = {{"cmd", argv}, {"timeout_ms", timeoutS * 1000}, {"stdin", withStdin}};
  if (args.contains("cwd")) body["cwd"] = absolute(args["cwd"]);
  std::string shown = args.contains("command") ? args["command"].get<std::string>() : argv.dump();
  call_.status("running: " + shown.substr(0, 200));
  Rest started = rest("POST", envPath(env) + "/processes", body.dump());
  if (started.status != 201) return toolError(started.error);
  uint64_t pid = started.body["id"];
  std::string processPath = envPath(env) + "/processes/" + std::to_string(pid);
  if (withStdin) {
    Rest fed = rest("POST", processPath + "/stdin", json{{"data", args["stdin"]}, {"close", true}}.dump());
    if (fed.status != 204) return toolError("could not write stdin: " + fed.error);
  }
  auto startedAt = Clock::now();
  // moatd enforces the timeout; the extra minute only bounds a lost answer.
  Collected c = collect(env, pid, 0, startedAt + std::chrono::seconds(timeoutS + 60), true);
  if (!c.ended) {
    (void)rest("POST", processPath + "/signal", json{{"signal", "KILL"}}.dump());
    if (call_.cancelled()) return toolError("cancelled: the command was killed");
    return toolError(c.failure.empty() ? "the command did not end in time and was killed" : c.failure);
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - startedAt).count();
  const json& t = c.terminal;
  if (t.value("type", "") == "end") return toolError("the command was lost: " + t.value("reason", ""));
  if (t.value("state", "") == "failed") return toolError("the command could not start: " + t.value("error", ""));
  size_t omitted = 0;
  std::string text = describeStatus(t) + section("stdout", c.out, omitted) + section("stderr", c.err, omitted);
  if (omitted) text += "\n(" + std::to_string(omitted) + " bytes of output were left out in the middle)";
  return toolResult(text, {{"exit_code", t.value("exit_code", -1)},
                           {"stdout", capOutput(c.out).text},
                           {"stderr", capOutput(c.err).text},
                           {"timed_out", t.value("timed_out", false)},
                           {"duration_ms", ms},
                           {"truncated", omitted > 0}});
}

json Tools::startProcess(const std::string& env, const json& args) {
  json argv = args.contains("argv") ? args["argv"] : json::array({"sh", "-c", args["command"]});
  json body = {{"cmd", argv}};
  if (args.contains("cwd")) body["cwd"] = absolute(args["cwd"]);
  Rest r = rest("POST", envPath(env) + "/processes", body.dump());
  if (r.status != 201) return toolError(r.error);
  uint64_t pid = r.body["id"];
  return toolResult("started process " + std::to_string(pid) + " in environment " + env +
                        "; read its output with read_process_output",
                    {{"process_id", pid}, {"environment_id", env}});
}

json Tools::readProcessOutput(const std::string& env, const json& args) {
  uint64_t pid = args["process_id"];
  uint64_t since = args.value("since", uint64_t{0});
  double wait = args.value("wait_s", 0.0);
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(wait * 1000));
  Collected c = collect(env, pid, since, deadline, false);
  if (!c.failure.empty()) return toolError(c.failure);
  size_t omitted = 0;
  std::string state = c.ended ? (c.terminal.value("type", "") == "end" ? "lost" : "exited") : "running";
  std::string text = c.ended ? "process " + std::to_string(pid) + " ended: " + describeStatus(c.terminal)
                             : "process " + std::to_string(pid) + " is running";
  text += section("stdout", c.out, omitted) + section("stderr", c.err, omitted);
  text += "\n(next: " + std::to_string(c.next) + ")";
  json s = {{"process_id", pid},
            {"state", state},
            {"stdout", capOutput(c.out).text},
            {"stderr", capOutput(c.err).text},
            {"next", c.next}};
  if (c.ended && c.terminal.contains("exit_code")) s["exit_code"] = c.terminal["exit_code"];
  return toolResult(text, s);
}

json Tools::sendInput(const std::string& env, const json& args) {
  uint64_t pid = args["process_id"];
  json body = {{"data", args["input"]}};
  if (args.contains("close")) body["close"] = args["close"];
  Rest r = rest("POST", envPath(env) + "/processes/" + std::to_string(pid) + "/stdin", body.dump());
  if (r.status != 204) return toolError(r.error);
  return toolResult(
      "sent " + std::to_string(args["input"].get<std::string>().size()) + " bytes to process " + std::to_string(pid),
      {{"process_id", pid}, {"bytes", args["input"].get<std::string>().size()}});
}

json Tools::killProcess(const std::string& env, const json& args) {
  uint64_t pid = args["process_id"];
  std::string signal = args.value("signal", "TERM");
  Rest r =
      rest("POST", envPath(env) + "/processes/" + std::to_string(pid) + "/signal", json{{"signal", signal}}.dump());
  if (r.status != 204) return toolError(r.error);
  return toolResult("sent " + signal + " to process " + std::to_string(pid), {{"process_id", pid}, {"signal", signal}});
}

json Tools::readFile(const std::string& env, const json& args) {
  std::string path = absolute(args["path"]);
  Rest r = rest("GET", envPath(env) + "/files?path=" + urlEncode(path));
  if (r.status != 200) return toolError(r.error);
  const std::string& content = r.text;
  if (!isValidUtf8(content)) {
    return toolError(path + " is not text (" + std::to_string(content.size()) + " bytes of binary data)");
  }
  int64_t first = args.value("start_line", int64_t{1});
  int64_t last = args.value("end_line", int64_t{-1});
  if (last != -1 && last < first) return toolError("invalid arguments: end_line is before start_line");
  std::string out;
  int64_t line = 1;
  size_t start = 0, lines = 0;
  while (start < content.size()) {
    size_t end = content.find('\n', start);
    size_t stop = end == std::string::npos ? content.size() : end + 1;
    if (line >= first && (last == -1 || line <= last)) {
      out.append(content, start, stop - start);
      ++lines;
    }
    if (last != -1 && line > last) break;
    start = stop;
    ++line;
  }
  bool cut = out.size() > kMaxFileRead;
  if (cut) out.resize(kMaxFileRead);
  std::string note = cut ? "\n[... cut at 256 KiB: read further with start_line ...]" : "";
  return toolResult(out + note, {{"path", path}, {"content", out}, {"lines", lines}, {"truncated", cut}});
}

json Tools::writeFile(const std::string& env, const json& args) {
  std::string path = absolute(args["path"]);
  const std::string& content = args["content"].get_ref<const std::string&>();
  Rest r = rest("PUT", envPath(env) + "/files?path=" + urlEncode(path), content);
  if (r.status != 200) return toolError(r.error);
  return toolResult("wrote " + std::to_string(content.size()) + " bytes to " + path,
                    {{"path", path}, {"bytes", content.size()}});
}

json Tools::editFile(const std::string& env, const json& args) {
  std::string path = absolute(args["path"]);
  Rest r = rest("GET", envPath(env) + "/files?path=" + urlEncode(path));
  if (r.status != 200) return toolError(r.error);
  std::string content = r.text;
  const std::string& from = args["old_string"].get_ref<const std::string&>();
  const std::string& to = args["new_string"].get_ref<const std::string&>();
  size_t count = 0;
  for (size_t at = content.find(from); at != std::string::npos; at = content.find(from, at + from.size())) ++count;
  if (count == 0) return toolError("old_string was not found in " + path + "; nothing changed (read the file first)");
  bool all = args.value("replace_all", false);
  if (count > 1 && !all) {
    return toolError("old_string appears " + std::to_string(count) + " times in " + path +
                     "; add surrounding text to make it unique, or set replace_all; nothing changed");
  }
  for (size_t at = content.find(from); at != std::string::npos; at = content.find(from, at + to.size())) {
    content.replace(at, from.size(), to);
    if (!all) break;
  }
  Rest w = rest("PUT", envPath(env) + "/files?path=" + urlEncode(path), content);
  if (w.status != 200) return toolError(w.error);
  return toolResult("replaced " + std::to_string(all ? count : 1) + " occurrence(s) in " + path,
                    {{"path", path}, {"replacements", all ? count : 1}});
}

json Tools::listFiles(const std::string& env, const json& args) {
  std::string path = absolute(args.value("path", "/workspace"));
  Rest r = rest("GET", envPath(env) + "/files/list?path=" + urlEncode(path));
  if (r.status != 200) return toolError(r.error);
  std::string text;
  for (const auto& e : r.body["entries"]) {
    std::string type = e.value("type", "");
    text += e.value("name", "") + (type == "dir" ? "/" : "") +
            (type == "file" ? "  " + std::to_string(e.value("size", uint64_t{0})) + " bytes" : "") + "\n";
  }
  return toolResult(text.empty() ? path + " is empty" : text, {{"path", path}, {"entries", r.body["entries"]}});
}

json Tools::searchFiles(const std::string& env, const json& args) {
  std::string path = absolute(args.value("path", "/workspace"));
  json argv = {"grep", "-rnIE", "--color=never"};
  if (args.contains("glob")) argv.push_back("--include=" + args["glob"].get<std::string>());
  argv.push_back("-e");
  argv.push_back(args["pattern"]);
  argv.push_back("--");
  argv.push_back(path);
  call_.status("searching " + path);
  Rest r = rest("POST", envPath(env) + "/exec", json{{"cmd", argv}, {"timeout_ms", 60000}}.dump());
  if (r.status != 200) return toolError(r.error);
  int code = r.body.value("exit_code", 2);
  if (code == 1) return toolResult("no matches", {{"matches", json::array()}, {"truncated", false}});
  if (code != 0) return toolError("search failed: " + r.body.value("stderr", ""));
  std::string out = r.body.value("stdout", "");
  json matches = json::array();
  std::string text;
  size_t start = 0;
  bool cut = false;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    if (matches.size() == kMaxSearchLines) {
      cut = true;
      break;
    }
    std::string line = out.substr(start, end - start);
    if (line.size() > 500) line = line.substr(0, 500) + "...";
    matches.push_back(line);
    text += line + "\n";
    start = end + 1;
  }
  if (cut) text += "[... more than " + std::to_string(kMaxSearchLines) + " matches: narrow the pattern or path ...]\n";
  return toolResult(text, {{"matches", matches}, {"truncated", cut}});
}

json Tools::pauseEnvironment(const std::string& env, bool pause, bool toDisk) {
  Rest r = rest("POST", envPath(env) + (pause ? "/pause" : "/resume"), toDisk ? R"({"memory":"disk"})" : "");
  if (r.status != 200) return toolError(r.error);
  return toolResult(pause ? "environment " + env + " is paused: its processes are stopped until resume_environment" +
                                (toDisk ? " (its memory is on disk)" : "")
                          : "environment " + env + " runs again",
                    {{"environment_id", env}, {"state", r.body.value("state", "")}});
}

json Tools::setNetworkPolicy(const std::string& env, const json& args) {
  Rest r = rest("PUT", envPath(env) + "/network", json{{"network", args["network"]}}.dump());
  if (r.status != 200) return toolError(r.error);
  return toolResult("network policy of " + env + " is now " + r.body["network"].dump(), r.body);
}

json Tools::snapshotEnvironment(const std::string& env, const json& args) {
  json body = json::object();
  if (args.contains("name")) body["name"] = args["name"];
  Rest r = rest("POST", envPath(env) + "/snapshots", body.dump());
  if (r.status != 201) return toolError(r.error);
  return toolResult("snapshot " + r.body.value("id", "") + " of environment " + env +
                        " (its files now; restore_environment puts them back)",
                    r.body);
}

json Tools::restoreEnvironment(const std::string& env, const json& args) {
  Rest r = rest("POST", envPath(env) + "/restore", json{{"snapshot", args["snapshot_id"]}}.dump());
  if (r.status != 200) return toolError(r.error);
  return toolResult("environment " + env + " now has the files of snapshot " + args["snapshot_id"].get<std::string>() +
                        "; every process in it was ended",
                    r.body);
}

json Tools::forkEnvironment(const std::string& env, const json& args) {
  json body = json::object();
  for (const char* k : {"task_id", "labels", "ttl_s", "memory"}) {
    if (args.contains(k)) body[k] = args[k];
  }
  if (body.contains("memory") && !body["memory"].is_boolean()) return toolError("memory: must be true or false");
  const bool memory = body.value("memory", false);
  Rest r = rest("POST", envPath(env) + "/fork", body.dump());
  if (r.status != 201) return toolError(r.error);
  return toolResult("forked environment " + env + " as " + r.body.value("id", "") +
                        (memory ? " (a copy of its files, settings and running processes, which go on there; pass "
                                  "environment_id to use it)"
                                : " (a copy of its files and settings; pass environment_id to use it)"),
                    r.body);
}

}  // namespace moat::mcp
