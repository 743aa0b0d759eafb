#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "api/api.h"
#include "api/process_json.h"
#include "api/validation.h"
#include "common/encoding.h"
#include "common/scope_exit.h"

// /v1/environments/{id}/processes: commands in the background whose output
// moatd keeps, so that clients attach, detach and read again from an offset.
namespace moat::api {
namespace {

// A follower with nothing new hears this often that the stream is alive
// (and moatd learns whether the client still is).
constexpr auto kOutputHeartbeat = std::chrono::seconds(15);
constexpr size_t kReadPiece = 256u << 10;
// After the first new bytes, a follower that was caught up lets more gather
// this long before it reads and writes: a chatty process then costs each
// follower ~100 wake-ups and writes a second instead of one per line (the
// shell stays immediate). One that is behind reads on at once.
constexpr auto kCoalesce = std::chrono::milliseconds(10);

std::string line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

HttpResponse startProcess(manager::CommandService& manager, const HttpRequest& req, const std::string& id,
                          const std::string& actor,
                          const std::function<std::optional<HttpResponse>(const gate::Action&)>& gate,
                          const std::function<std::optional<ApiError>(std::vector<std::string>&)>& imageCommand) {
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"cmd", "env", "cwd", "timeout_ms", "stdin", "pty", "rows", "cols", "lossless"}, "")) {
    return errorResponse(*e);
  }
  manager::ProcessRequest request;
  request.actor = actor;
  if (auto e = j.contains("cmd") ? commandLine(j["cmd"], "cmd", request.argv) : imageCommand(request.argv)) {
    return errorResponse(*e);
  }
  if (j.contains("env")) {
    if (auto e = stringMap(j["env"], "env", true, request.env)) return errorResponse(*e);
  }
  if (j.contains("cwd")) {
    if (auto e = absolutePath(j["cwd"], "cwd", request.cwd)) return errorResponse(*e);
  }
  if (j.contains("timeout_ms")) {
    if (auto e = number(j["timeout_ms"], "timeout_ms", 1, 7 * 86400000.0, true, request.timeoutMs)) {
      return errorResponse(*e);
    }
  }
  for (const char* flag : {"stdin", "pty", "lossless"}) {
    if (j.contains(flag) && !j[flag].is_boolean()) return errorResponse(invalid(flag, "must be true or false"));
  }
  if (j.contains("stdin")) request.stdinOpen = j["stdin"].get<bool>();
  if (j.contains("pty")) request.pty = j["pty"].get<bool>();
  if (j.contains("lossless")) request.lossless = j["lossless"].get<bool>();
  if ((j.contains("rows") || j.contains("cols")) && !request.pty) {
    return errorResponse(invalid(j.contains("rows") ? "rows" : "cols", "only with \"pty\": true"));
  }
  if (j.contains("rows")) {
    if (auto e = number(j["rows"], "rows", 1, 1000, true, request.rows)) return errorResponse(*e);
  }
  if (j.contains("cols")) {
    if (auto e = number(j["cols"], "cols", 1, 1000, true, request.cols)) return errorResponse(*e);
  }
  gate::Action action;
  action.scope = gate::Scope::kRunCommand;
  action.argv = request.argv;
  action.env = manager.envOf(id);
  for (const auto& [k, v] : request.env) action.env[k] = v;
  action.op = "process";
  if (auto answer = gate(action)) return *answer;
  auto process = manager.startProcess(id, request);
  if (!process.ok()) return errorResponse(fromError(process.error()));
  return respond(201, processJson(process.value()->info()));
}

// stillActive: false once the caller's key is revoked; a follow ends then
// (within a heartbeat, or at the process's next output).
HttpResponse readOutput(const std::shared_ptr<manager::Process>& process, const HttpRequest& req,
                        std::function<bool()> stillActive) {
  if (auto e = onlyQuery(req, {"since", "follow", "encoding"})) return errorResponse(*e);
  uint64_t since = 0;
  if (auto e = queryNumber(req, "since", 1ULL << 62, 10, since)) return errorResponse(*e);
  bool follow = false;
  if (auto e = queryFlag(req, "follow", follow)) return errorResponse(*e);
  bool base64 = false;
  if (auto it = req.query.find("encoding"); it != req.query.end()) {
    if (it->second != "utf8" && it->second != "base64") {
      return errorResponse(invalid("encoding", "must be utf8 or base64"));
    }
    base64 = it->second == "base64";
  }
  if (!follow) {
    // What is there now, and the end if the process ended.
    std::string out;
    uint64_t pos = since;
    for (;;) {
      auto r = process->read(pos, kReadPiece, false, {});
      for (const auto& item : r.items) out += line(outputEventJson(item, base64));
      if (r.ended) out += line(terminalEventJson(process->info()));
      if (r.items.empty() || r.ended) break;
      pos = r.next;
    }
    HttpResponse response;
    response.contentType = "application/x-ndjson";
    response.body = std::move(out);
    return response;
  }
  HttpResponse response;
  response.contentType = "application/x-ndjson";
  response.stream = [process, since, base64, stillActive](const BodyWriter& write) {
    uint64_t pos = since;
    // A lossless process's output waits for its slowest follower.
    uint64_t follower = process->attachFollower(since);
    ScopeExit detach([&] { process->detachFollower(follower); });
    for (;;) {
      auto r = process->read(pos, kReadPiece, true, std::chrono::steady_clock::now() + kOutputHeartbeat);
      if (!r.items.empty() && !r.ended && !r.more) {
        std::this_thread::sleep_for(kCoalesce);  // not a wait on the process: no wake-ups meanwhile
        r = process->read(pos, kReadPiece, false, {});
      }
      if (!stillActive()) {
        (void)write(line({{"type", "error"}, {"message", "the API key of this request was revoked"}}));
        return;
      }
      std::string out;
      for (const auto& item : r.items) out += line(outputEventJson(item, base64));
      if (r.ended) out += line(terminalEventJson(process->info()));
      if (out.empty()) out = line({{"type", "heartbeat"}, {"offset", r.next}});
      if (!write(out)) return;
      if (r.ended) return process->markDelivered();
      pos = r.next;
      process->advanceFollower(follower, pos);
    }
  };
  return response;
}

// Each input is an event: what was written to a process, and each signal.
using Note = std::function<void(const std::string& type, json data)>;

HttpResponse writeStdin(const std::shared_ptr<manager::Process>& process, const HttpRequest& req, const Note& note) {
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"data", "encoding", "close", "wait_ms"}, "")) return errorResponse(*e);
  std::string data;
  if (j.contains("data")) {
    if (!j["data"].is_string()) return errorResponse(invalid("data", "must be a string"));
    data = j["data"];
  }
  if (j.contains("encoding")) {
    if (!j["encoding"].is_string() || (j["encoding"] != "utf8" && j["encoding"] != "base64")) {
      return errorResponse(invalid("encoding", "must be \"utf8\" or \"base64\""));
    }
    if (j["encoding"] == "base64") {
      auto decoded = base64Decode(data);
      if (!decoded.ok()) return errorResponse(invalid("data", "is not valid base64"));
      data = decoded.value();
    }
  }
  bool close = false;
  if (j.contains("close")) {
    if (!j["close"].is_boolean()) return errorResponse(invalid("close", "must be true or false"));
    close = j["close"];
  }
  if (data.empty() && !close) return errorResponse(invalid("data", "required unless \"close\": true"));
  int64_t waitMs = manager::Process::kStdinWait.count();
  if (j.contains("wait_ms")) {
    if (auto e = number(j["wait_ms"], "wait_ms", 0, 300000, true, waitMs)) return errorResponse(*e);
  }
  Status s = process->writeStdin(data, close, std::chrono::milliseconds(waitMs));
  if (!s.ok()) return errorResponse(fromError(s.error()));
  json event = inputJson(data);
  event["process"] = process->id();
  if (close) event["close"] = true;
  note("process.input", std::move(event));
  return noContent();
}

HttpResponse sendSignal(const std::shared_ptr<manager::Process>& process, const HttpRequest& req, const Note& note) {
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"signal"}, "")) return errorResponse(*e);
  if (!j.contains("signal")) return errorResponse(invalid("signal", "required: a name (\"TERM\") or a number"));
  int signo = parseSignal(j["signal"]);
  if (signo == 0) return errorResponse(invalid("signal", "unknown signal (a name like \"TERM\" or a number 1-64)"));
  Status s = process->signal(signo);
  if (!s.ok()) return errorResponse(fromError(s.error()));
  note("process.signal", {{"process", process->id()}, {"signal", signo}});
  return noContent();
}

HttpResponse resize(const std::shared_ptr<manager::Process>& process, const HttpRequest& req) {
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"rows", "cols"}, "")) return errorResponse(*e);
  uint16_t rows = 0, cols = 0;
  if (!j.contains("rows")) return errorResponse(invalid("rows", "required"));
  if (!j.contains("cols")) return errorResponse(invalid("cols", "required"));
  if (auto e = number(j["rows"], "rows", 1, 1000, true, rows)) return errorResponse(*e);
  if (auto e = number(j["cols"], "cols", 1, 1000, true, cols)) return errorResponse(*e);
  Status s = process->resize(rows, cols);
  if (!s.ok()) return errorResponse(fromError(s.error()));
  return noContent();
}

}  // namespace

HttpResponse Api::processesRoute(const HttpRequest& req, const Principal& principal, const std::string& id) {
  std::string pid = pathSegment(req.path, 4);
  std::string action = pathSegment(req.path, 5);
  if (!pathSegment(req.path, 6).empty()) return errorResponse({404, "not_found", "no such endpoint: " + req.path, ""});
  if (pid.empty()) {
    if (req.method == "POST") {
      if (auto e = onlyQuery(req, {})) return errorResponse(*e);
      return startProcess(
          commands_, req, id, principal.owner(),
          [&](const gate::Action& action) { return check(req, principal, id, action); },
          [&](std::vector<std::string>& argv) { return imageCommand(id, argv); });
    }
    if (auto e = onlyQuery(req, {})) return errorResponse(*e);
    auto list = commands_.processes(id);
    if (!list.ok()) return errorResponse(fromError(list.error()));
    json arr = json::array();
    for (const auto& p : list.value()) arr.push_back(processJson(p->info()));
    return respond(200, {{"processes", arr}});
  }
  if (pid.size() > 18 || pid.find_first_not_of("0123456789") != std::string::npos) {
    return errorResponse({404, "not_found", "no process " + pid + " in environment " + id, ""});
  }
  auto process = commands_.process(id, std::stoull(pid));
  if (!process.ok()) return errorResponse(fromError(process.error()));
  if (action.empty()) {
    if (auto e = onlyQuery(req, {})) return errorResponse(*e);
    return respond(200, processJson(process.value()->info()));
  }
  if (action == "output") {
    return readOutput(process.value(), req, keys_.stillActive(principal));
  }
  if (action != "stdin" && action != "signal" && action != "resize") {
    return errorResponse({404, "not_found", "no such endpoint: " + req.path, ""});
  }
  if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  Note note = [&](const std::string& type, json data) { audit_.record(type, id, principal.owner(), std::move(data)); };
  if (action == "stdin") return writeStdin(process.value(), req, note);
  if (action == "signal") return sendSignal(process.value(), req, note);
  return resize(process.value(), req);
}

}  // namespace moat::api
