// moat agent: agent runs moatd drives (docs/AGENTS.md): run one and follow
// its steps, list, show, stop, read a transcript.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "cli/network_flags.h"
#include "os/file.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kAgentUsage = R"(usage: moat agent COMMAND [options]

Agent runs moatd drives itself: the model loop on the host, the model's tool
calls in an environment of the run's own, each through the gate (docs/AGENTS.md).

commands:
  run [options] INSTRUCTION...
                     start a run and follow it: the model's text, each tool call
                     and its result, approvals waited on; Ctrl-C stops the run
      --provider K      anthropic or openai (OpenAI's format: also Ollama, vLLM,
                        llama.cpp); default: anthropic if $ANTHROPIC_API_KEY is
                        set, else openai
      --model M         the model (required)
      --base-url URL    the provider's base URL as its SDK takes it, e.g.
                        http://127.0.0.1:11434/v1 for Ollama
      --api-key-env V   the variable holding the provider's key, read here and
                        sent to moatd for this run only (default
                        ANTHROPIC_API_KEY or OPENAI_API_KEY, except with
                        --base-url; none set: no key)
      --max-iterations N
                        model turns at most (default 30)
      --timeout S       the run's wall-clock bound in seconds (default 3600)
      --token-budget N  input and output tokens in all (default: no bound)
      --permissions J   the gate's permissions, JSON or @FILE (docs/GATE.md)
      --label K=V       a label; repeatable
      --keep            keep the environment after the run
      --detach          print the run's id and return at once
  fleet TASKS.jsonl [--parallel N] [--snapshot S] [run options]
                     each line's task ({"instruction": ..., "id"?, "labels"?,
                     "max_iterations"?, "permissions"?, ...}; "-": stdin) in a
                     run and environment of its own (forked from snapshot S when
                     given), N at once (default 4); prints one JSON line of
                     result per task, progress on stderr; Ctrl-C stops them all
)"
                                    "%s"
                                    R"(  ls                 the runs (ID, STATE, ITER, MODEL, ENVIRONMENT, CREATED)
  get ID             one run, as key: value lines
  stop ID            end a run now
  transcript ID      every step of a run

  --json             print moatd's JSON instead (run: the ended run; ls, get, transcript)

exit status of run: 0 completed, 1 failed, 3 max_iterations, 4 stopped;
of fleet: 0 when every task completed, 4 when stopped, 1 otherwise
)";

int agentHelp() {
  std::printf(kAgentUsage, kNetworkFlagsUsage);
  std::fputs(connectionUsage(), stdout);
  return 0;
}

std::atomic<bool> interrupted{false};
void onInterrupt(int) { interrupted = true; }

int exitFor(const std::string& state) {
  if (state == "completed") return 0;
  if (state == "max_iterations") return 3;
  if (state == "stopped") return 4;
  return 1;
}

// What a model or a program said, safe for a terminal: control characters
// (escape sequences) shown as '?', newlines kept unless `oneLine`.
std::string printable(std::string s, bool oneLine) {
  for (char& c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n' && oneLine)
      c = ' ';
    else if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f)
      c = '?';
  }
  return s;
}

// One line of a value for a person: text as it is, anything else as JSON,
// cut at `limit` bytes.
std::string brief(const json& value, size_t limit = 200) {
  std::string s =
      value.is_string() ? value.get<std::string>() : value.dump(-1, ' ', false, json::error_handler_t::replace);
  s = printable(s, true);
  return s.size() > limit ? s.substr(0, limit) + "..." : s;
}

void printStep(const json& step) {
  const std::string kind = step.value("kind", "");
  if (kind == "model") {
    std::string text = printable(step.value("text", ""), false);
    if (!text.empty()) std::printf("%s\n", text.c_str());
    for (const auto& call : step.value("tool_calls", json::array())) {
      std::printf("> %s %s\n", call.value("name", "").c_str(), brief(call.value("arguments", json::object())).c_str());
    }
  } else if (kind == "tool_result") {
    std::printf("%s %s\n", step.value("is_error", false) ? "< error:" : "<", brief(step.value("content", "")).c_str());
  } else if (kind == "retry") {
    std::printf("(retrying: %s)\n", step.value("reason", "").c_str());
  } else if (kind == "end") {
    std::string reason = step.value("reason", "");
    std::printf("[%s after %d iteration(s)%s]\n", step.value("state", "").c_str(), step.value("iterations", 0),
                reason.empty() ? "" : (": " + reason).c_str());
  }
  std::fflush(stdout);
}

// The flags that make a run's request, shared by `run` and `fleet`.
class RunFlags {
 public:
  // Reads the flag under the cursor if it is one of ours.
  Result<bool> read(FlagReader& flags) {
    const std::string& name = flags.name();
    MOAT_ASSIGN(bool ours, network_.read(flags));
    if (ours) return true;
    if (name == "--provider") {
      MOAT_ASSIGN(std::string v, flags.value());
      if (v != "anthropic" && v != "openai") return usageError("--provider: anthropic or openai, not '" + v + "'");
      provider_["kind"] = v;
    } else if (name == "--model") {
      MOAT_ASSIGN(provider_["model"], flags.value());
    } else if (name == "--base-url") {
      MOAT_ASSIGN(provider_["base_url"], flags.value());
    } else if (name == "--api-key-env") {
      MOAT_ASSIGN(keyVariable_, flags.value());
    } else if (name == "--max-iterations" || name == "--timeout" || name == "--token-budget") {
      MOAT_ASSIGN(std::string v, flags.value());
      const char* field = name == "--timeout"        ? "timeout_s"
                          : name == "--token-budget" ? "token_budget"
                                                     : "max_iterations";
      MOAT_ASSIGN(body_[field], parseWhole(name, v));
    } else if (name == "--permissions") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(body_["permissions"], parsePermissionsFlag(name, v));
    } else if (name == "--label") {
      MOAT_ASSIGN(std::string v, flags.value());
      std::map<std::string, std::string> labels = body_.value("labels", std::map<std::string, std::string>{});
      MOAT_TRY(parseLabel(name, v, labels));
      body_["labels"] = labels;
    } else if (name == "--keep") {
      MOAT_TRY(flags.noValue());
      body_["keep_environment"] = true;
    } else {
      return false;
    }
    return true;
  }

  // The request without its instruction: the provider's kind and key
  // settled (the key read from this process's environment).
  Result<json> body() const {
    if (!provider_.contains("model")) return usageError("--model: which model (e.g. --model claude-sonnet-5)");
    json provider = provider_;
    if (!provider.contains("kind")) {
      const char* anthropic = std::getenv("ANTHROPIC_API_KEY");
      provider["kind"] = anthropic && *anthropic ? "anthropic" : "openai";
    }
    // The default variable's key goes to the provider's own server only:
    // another --base-url gets a key when --api-key-env names one.
    std::string variable = keyVariable_;
    if (variable.empty() && !provider.contains("base_url")) {
      variable = provider["kind"] == "anthropic" ? "ANTHROPIC_API_KEY" : "OPENAI_API_KEY";
    }
    const char* key = variable.empty() ? nullptr : std::getenv(variable.c_str());
    if (key && *key) provider["api_key"] = key;
    json body = body_;
    body["provider"] = provider;
    MOAT_ASSIGN(auto policy, network_.policy());
    if (policy) body["network"] = *policy;
    return body;
  }

 private:
  json provider_ = json::object();
  json body_ = json::object();
  std::string keyVariable_;
  NetworkFlags network_;
};

int run(const std::vector<std::string>& args) {
  RunFlags runFlags;
  bool detach = false;
  Parsed parsed;
  Status s = parseArgs(args, parsed, [&](FlagReader& flags, bool& matched) -> Status {
    MOAT_ASSIGN(matched, runFlags.read(flags));
    if (!matched && flags.name() == "--detach") {
      MOAT_TRY(flags.noValue());
      matched = detach = true;
    }
    return {};
  });
  if (s.ok() && !parsed.help && parsed.positional.empty())
    s = usageError("missing the instruction (usage: moat agent run [options] INSTRUCTION...)");
  json body;
  if (s.ok() && !parsed.help) {
    auto made = runFlags.body();
    if (!made.ok()) s = made.error();
    if (made.ok()) body = made.value();
  }
  if (!s.ok()) return reportFailure("agent run", s.error());
  if (parsed.help) return agentHelp();
  std::string instruction;
  for (const auto& word : parsed.positional) instruction += (instruction.empty() ? "" : " ") + word;
  body["instruction"] = instruction;

  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) return reportFailure("agent run", client.error());
  auto started = call(client.value(), "POST", "/v1/agents", body.dump(), 201);
  if (!started.ok()) return reportFailure("agent run", started.error());
  const std::string id = started->value("id", "");
  if (detach) {
    std::puts(id.c_str());
    return 0;
  }
  if (!parsed.json) {
    std::fprintf(stderr, "moat agent: run %s in environment %s (moat agent stop %s ends it)\n", id.c_str(),
                 started->value("environment", "").c_str(), id.c_str());
  }
  struct sigaction action = {};
  action.sa_handler = onInterrupt;
  ::sigaction(SIGINT, &action, nullptr);
  const std::string path = "/v1/agents/" + id;
  uint64_t seen = 0;
  bool toldWaiting = false, stopSent = false;
  json last = started.value();
  while (true) {
    if (interrupted && !stopSent) {
      stopSent = true;
      std::fprintf(stderr, "moat agent: stopping run %s\n", id.c_str());
      auto stopped = call(client.value(), "POST", path + "/stop", "", 200);
      if (!stopped.ok()) return reportFailure("agent run", stopped.error());
    }
    auto steps = call(client.value(), "GET", path + "/transcript?after=" + std::to_string(seen) + "&wait=1", "", 200);
    if (!steps.ok()) return reportFailure("agent run", steps.error());
    for (const auto& step : steps->value("steps", json::array())) {
      seen = std::max<uint64_t>(seen, step.value("seq", 0));
      if (!parsed.json) printStep(step);
    }
    auto now = call(client.value(), "GET", path, "", 200);
    if (!now.ok()) return reportFailure("agent run", now.error());
    last = now.value();
    const std::string state = last.value("state", "");
    if (state == "waiting_approval" && !toldWaiting && !parsed.json) {
      std::fprintf(stderr, "moat agent: waiting for a person's approval (moat approvals ls)\n");
    }
    toldWaiting = state == "waiting_approval";
    if (state != "running" && state != "waiting_approval" && last.contains("ended_at")) {
      // The steps up to the end are all there once it has ended.
      auto rest = call(client.value(), "GET", path + "/transcript?after=" + std::to_string(seen), "", 200);
      if (rest.ok() && !parsed.json) {
        for (const auto& step : rest->value("steps", json::array())) printStep(step);
      }
      if (parsed.json) std::puts(last.dump(2).c_str());
      return exitFor(state);
    }
  }
}

// One task of a fleet: a line of the tasks file.
struct Task {
  std::string name;
  json body;
  std::string run;  // once started
};

Result<std::vector<Task>> readTasks(const std::string& file, const json& base) {
  // "-" is standard input, whatever it is (a pipe, a file).
  MOAT_ASSIGN(std::string text, os::readFile(file == "-" ? "/dev/stdin" : file, std::numeric_limits<size_t>::max()));
  std::vector<Task> tasks;
  size_t lineNo = 0, start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++lineNo;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file + ":" + std::to_string(lineNo);
    json j = json::parse(line, nullptr, false);
    if (!j.is_object()) return usageError(where + ": not a JSON object");
    if (!j.contains("instruction") || !j["instruction"].is_string()) {
      return usageError(where + ": needs \"instruction\" (a string)");
    }
    Task task;
    task.name = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>() : "task-" + std::to_string(lineNo);
    task.body = base;
    for (auto it = j.begin(); it != j.end(); ++it) {
      static const std::set<std::string> kTaskFields = {"id",        "instruction", "labels",  "max_iterations",
                                                        "timeout_s", "permissions", "network", "keep_environment",
                                                        "snapshot",  "spec"};
      if (!kTaskFields.count(it.key())) return usageError(where + ": unknown field \"" + it.key() + "\"");
      if (it.key() == "id") continue;
      if (it.key() == "labels" && it->is_object()) {
        for (auto l = it->begin(); l != it->end(); ++l) task.body["labels"][l.key()] = *l;
        continue;
      }
      task.body[it.key()] = *it;
    }
    task.body["labels"]["moat-fleet-task"] = task.name;
    tasks.push_back(std::move(task));
  }
  if (tasks.empty()) return usageError(file + ": no tasks");
  return tasks;
}

int fleet(const std::vector<std::string>& args) {
  RunFlags runFlags;
  uint64_t parallel = 4;
  std::string snapshot;
  Parsed parsed;
  Status s = parseArgs(args, parsed, [&](FlagReader& flags, bool& matched) -> Status {
    MOAT_ASSIGN(matched, runFlags.read(flags));
    if (matched) return {};
    if (flags.name() == "--parallel") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(parallel, parseWhole("--parallel", v));
      if (parallel < 1 || parallel > 256) return usageError("--parallel: 1 to 256, not " + v);
      matched = true;
    } else if (flags.name() == "--snapshot") {
      MOAT_ASSIGN(snapshot, flags.value());
      matched = true;
    }
    return {};
  });
  if (s.ok() && !parsed.help && parsed.positional.size() != 1) {
    s = usageError("usage: moat agent fleet TASKS.jsonl [--parallel N] [--snapshot S] [run options]");
  }
  json base;
  if (s.ok() && !parsed.help) {
    auto made = runFlags.body();
    if (!made.ok()) s = made.error();
    if (made.ok()) base = made.value();
    if (!snapshot.empty()) base["snapshot"] = snapshot;
  }
  std::vector<Task> tasks;
  if (s.ok() && !parsed.help) {
    auto read = readTasks(parsed.positional[0], base);
    if (!read.ok()) s = read.error();
    if (read.ok()) tasks = std::move(read.value());
  }
  if (!s.ok()) return reportFailure("agent fleet", s.error());
  if (parsed.help) return agentHelp();
  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) return reportFailure("agent fleet", client.error());
  struct sigaction action = {};
  action.sa_handler = onInterrupt;
  ::sigaction(SIGINT, &action, nullptr);

  size_t next = 0, done = 0, completed = 0;
  std::vector<size_t> active;
  auto finish = [&](Task& task, json line) {
    ++done;
    line["task"] = task.name;
    if (line.value("state", "") == "completed") ++completed;
    std::puts(line.dump().c_str());
    std::fflush(stdout);
    // A task that did not complete says why on the progress line too.
    std::string why =
        line.contains("error") && line["error"].is_string() ? ": " + line["error"].get<std::string>() : "";
    std::fprintf(stderr, "[%zu/%zu] %s %s%s\n", done, tasks.size(), printable(task.name, true).c_str(),
                 line.value("state", "").c_str(), printable(why, true).c_str());
  };
  bool stopping = false;
  while (done < tasks.size()) {
    if (interrupted && !stopping) {
      stopping = true;
      std::fprintf(stderr, "moat agent fleet: stopping %zu run(s); %zu task(s) not started\n", active.size(),
                   tasks.size() - next);
      for (size_t i : active) (void)call(client.value(), "POST", "/v1/agents/" + tasks[i].run + "/stop", "", 200);
      while (next < tasks.size()) finish(tasks[next++], {{"state", "not_started"}});
    }
    bool full = false;
    while (!stopping && !full && active.size() < parallel && next < tasks.size()) {
      Task& task = tasks[next];
      auto started = client->request("POST", "/v1/agents", task.body.dump());
      if (!started.ok()) return reportFailure("agent fleet", started.error());
      if (started->status == 429) {
        full = true;  // moatd is at its limit: the next round tries again
        break;
      }
      ++next;
      json answer = json::parse(started->body, nullptr, false);
      if (started->status != 201) {
        finish(task, {{"state", "refused"}, {"error", describeError(started.value())}});
        continue;
      }
      task.run = answer.value("id", "");
      active.push_back(next - 1);
    }
    if (active.empty() && next >= tasks.size()) break;
    // Wait for a step of the oldest run (or a second), then see who ended.
    if (!active.empty()) {
      (void)call(client.value(), "GET", "/v1/agents/" + tasks[active[0]].run + "/transcript?after=4294967295&wait=1",
                 "", 200);
    }
    for (auto it = active.begin(); it != active.end();) {
      auto now = call(client.value(), "GET", "/v1/agents/" + tasks[*it].run, "", 200);
      if (!now.ok()) return reportFailure("agent fleet", now.error());
      const std::string state = now->value("state", "");
      if (state == "running" || state == "waiting_approval" || !now->contains("ended_at")) {
        ++it;
        continue;
      }
      json line = {{"run", tasks[*it].run},
                   {"state", state},
                   {"environment", now->value("environment", "")},
                   {"iterations", now->value("iterations", 0)},
                   {"usage", now->value("usage", json::object())}};
      if (now->contains("result")) line["result"] = (*now)["result"];
      if (now->contains("error")) line["error"] = (*now)["error"];
      finish(tasks[*it], line);
      it = active.erase(it);
    }
  }
  return stopping ? 4 : completed == tasks.size() ? 0 : 1;
}

// `moat agent SUB ID`: a GET or POST of the run's path plus `suffix`.
std::optional<json> one(const std::vector<std::string>& args, const std::string& sub, const std::string& method,
                        const std::string& suffix, Parsed& parsed, int& code) {
  OneResource what;
  what.command = "agent " + sub;
  what.missing = what.several = "usage: moat agent " + sub + " ID";
  what.pathOf = [&suffix](const std::string& id) -> Result<std::string> {
    if (id.size() != 12 || id.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return usageError("'" + id + "' is not a run id (12 hex digits)");
    }
    return "/v1/agents/" + id + suffix;
  };
  what.method = method;
  what.help = agentHelp;
  return callOne(args, what, parsed, code);
}

void printRun(const json& r) {
  for (const char* key :
       {"id", "state", "environment", "iterations", "max_iterations", "created_at", "ended_at", "error", "result"}) {
    if (r.contains(key)) std::printf("%s: %s\n", key, brief(r[key], 4096).c_str());
  }
  if (r.contains("provider")) {
    std::printf("provider: %s %s %s\n", r["provider"].value("kind", "").c_str(),
                r["provider"].value("model", "").c_str(), r["provider"].value("base_url", "").c_str());
  }
  if (r.contains("usage")) {
    std::printf("usage: %s input, %s output tokens\n", r["usage"].value("input_tokens", json(0)).dump().c_str(),
                r["usage"].value("output_tokens", json(0)).dump().c_str());
  }
}

int listAgents(const std::vector<std::string>& args) {
  Parsed parsed;
  Status s = parseArgs(args, parsed, nullptr);
  if (s.ok() && !parsed.positional.empty()) s = usageError("unexpected argument '" + parsed.positional[0] + "'");
  if (!s.ok()) return reportFailure("agent ls", s.error());
  if (parsed.help) return agentHelp();
  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) return reportFailure("agent ls", client.error());
  auto runs = call(client.value(), "GET", "/v1/agents", "", 200);
  if (!runs.ok()) return reportFailure("agent ls", runs.error());
  json all = runs->value("agents", json::array());
  if (parsed.json) {
    std::puts(all.dump(2).c_str());
    return 0;
  }
  std::printf("%-12s  %-16s  %-5s  %-24s  %-12s  %s\n", "ID", "STATE", "ITER", "MODEL", "ENVIRONMENT", "CREATED");
  for (const auto& r : all) {
    std::printf("%-12s  %-16s  %-5s  %-24s  %-12s  %s\n", r.value("id", "").c_str(), r.value("state", "").c_str(),
                r.value("iterations", json(0)).dump().c_str(), r["provider"].value("model", "").c_str(),
                r.value("environment", "").c_str(), r.value("created_at", "").c_str());
  }
  return 0;
}

}  // namespace

int agentCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::printf(kAgentUsage, kNetworkFlagsUsage);
    return kExitUsage;
  }
  const std::string& sub = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "run") return run(rest);
  if (sub == "fleet") return fleet(rest);
  if (sub == "ls" || sub == "list") return listAgents(rest);
  Parsed parsed;
  int code = 0;
  if (sub == "get" || sub == "stop") {
    auto r = one(rest, sub, sub == "get" ? "GET" : "POST", sub == "get" ? "" : "/stop", parsed, code);
    if (r) printRun(*r);
    return code;
  }
  if (sub == "transcript") {
    auto r = one(rest, sub, "GET", "/transcript", parsed, code);
    if (r) {
      for (const auto& step : r->value("steps", json::array())) printStep(step);
    }
    return code;
  }
  if (sub == "-h" || sub == "--help" || sub == "help") return agentHelp();
  std::fprintf(stderr,
               "moat agent: unknown command '%s' (run, fleet, ls, get, stop or transcript; see moat agent --help)\n",
               sub.c_str());
  return kExitUsage;
}

}  // namespace moat::cli
