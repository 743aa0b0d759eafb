#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "api/api.h"
#include "api/process_json.h"
#include "api/validation.h"

// GET /v1/environments/{id}/shell: a WebSocket on a terminal in the
// environment. Binary frames carry terminal bytes both ways; text frames
// carry JSON control messages (docs/API.md, "Shell").
namespace moat::api {
namespace {

constexpr auto kPingEvery = std::chrono::seconds(30);
constexpr size_t kReplay = 64u << 10;
constexpr auto kHangUpGrace = std::chrono::seconds(5);  // what a viewer joining a running shell sees first
constexpr auto kInputWait = std::chrono::seconds(5);    // for a terminal program to read earlier input

// Sends the terminal's output to one viewer until the process ends or the
// viewer leaves.
void pumpOutput(const std::shared_ptr<manager::Process>& process, websocket::Connection& socket,
                const std::atomic<bool>& leaving, const std::function<bool()>& stillActive) {
  auto first = process->info();
  uint64_t pos = first.outputEnd > kReplay ? first.outputEnd - kReplay : 0;
  for (;;) {
    auto r = process->read(pos, 64u << 10, true, std::chrono::steady_clock::now() + kPingEvery,
                           [&] { return leaving.load(); });
    if (leaving) return;
    if (!stillActive()) {
      (void)socket.sendText(json{{"type", "error"}, {"message", "the API key of this viewer was revoked"}}.dump());
      socket.close(1008, "the API key was revoked");
      socket.abort();  // its input ends here too, whether or not it answers the close
      return;
    }
    bool sent = true;
    for (const auto& item : r.items) {
      if (!item.dropped) sent = sent && socket.sendBinary(item.data);
    }
    if (r.items.empty() && !r.ended) sent = socket.ping();
    if (!sent) {
      socket.abort();  // the viewer is gone or stuck: end its receive too
      return;
    }
    pos = r.next;
    if (r.ended) {
      (void)socket.sendText(terminalEventJson(process->info()).dump());
      socket.close(1000, "the process ended");
      return;
    }
  }
}

using Note = std::function<void(const std::string& type, json data)>;

// What a viewer types, as events: a burst at a time (up to a line end, once
// 100 ms have passed since the last one, or 4 KiB, or the viewer's leaving),
// so a person's typing is a line an event and a paste or a flood a few.
class TypedInput {
 public:
  TypedInput(uint64_t process, Note note) : process_(process), note_(std::move(note)) {}
  void add(const std::string& data) {
    burst_ += data;
    auto now = std::chrono::steady_clock::now();
    bool lineEnd = data.find_first_of("\r\n") != std::string::npos;
    if (burst_.size() >= kMax || (lineEnd && now - last_ >= kEvery)) flush(now);
  }
  void flush(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    if (burst_.empty()) return;
    json event = inputJson(burst_);
    event["process"] = process_;
    note_("terminal.input", std::move(event));
    burst_.clear();
    last_ = now;
  }

 private:
  static constexpr size_t kMax = 4096;
  static constexpr auto kEvery = std::chrono::milliseconds(100);
  uint64_t process_;
  Note note_;
  std::string burst_;
  std::chrono::steady_clock::time_point last_{};
};

void handleControl(const std::shared_ptr<manager::Process>& process, websocket::Connection& socket,
                   const std::string& text, const Note& note) {
  auto reply = [&](const std::string& message) {
    (void)socket.sendText(json{{"type", "error"}, {"message", message}}.dump());
  };
  json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return reply("control messages are JSON objects with a \"type\"");
  }
  std::string type = j["type"];
  if (type == "resize") {
    uint16_t rows = 0, cols = 0;
    if (!j.contains("rows") || !j.contains("cols")) return reply("resize needs rows and cols");
    if (auto e = number(j["rows"], "rows", 1, 1000, true, rows)) return reply(e->message);
    if (auto e = number(j["cols"], "cols", 1, 1000, true, cols)) return reply(e->message);
    Status s = process->resize(rows, cols);
    if (!s.ok()) reply(s.error().message());
    return;
  }
  if (type == "signal") {
    int signo = j.contains("signal") ? parseSignal(j["signal"]) : 0;
    if (signo == 0) return reply("unknown signal");
    Status s = process->signal(signo);
    if (!s.ok()) return reply(s.error().message());
    note("process.signal", {{"process", process->id()}, {"signal", signo}, {"via", "terminal"}});
    return;
  }
  reply("unknown control message type \"" + type + "\" (resize, signal)");
}

// stillActive: false once the viewer's key is revoked (checked at each
// output and each ping, every 30 s at most): the viewer is closed.
void runViewer(const std::shared_ptr<manager::Process>& process, websocket::Connection& socket,
               const std::function<bool()>& stillActive, const Note& note) {
  process->attachViewer();
  note("terminal.attached", {{"process", process->id()}});
  TypedInput typed(process->id(), note);
  // First, which process this terminal is: other viewers attach with its id.
  auto info = process->info();
  (void)socket.sendText(json{{"type", "hello"}, {"process", info.id}, {"pid", info.pid}, {"cmd", info.argv}}.dump());
  std::atomic<bool> leaving{false};
  std::thread pump([&] { pumpOutput(process, socket, leaving, stillActive); });
  websocket::Message message;
  bool processEnded = false;
  while (socket.receive(message)) {
    if (message.opcode == websocket::Opcode::kBinary) {
      // Input its program does not read waits (1 MiB of it, then this
      // viewer waits too), but not for long: meanwhile its signals and
      // resizes wait behind it. Beyond that the piece is not delivered, and
      // the viewer is told.
      Status s = process->writeStdin(message.data, false, kInputWait);
      if (!s.ok() && s.error().code == Code::kStdinFull) {
        (void)socket.sendText(
            json{{"type", "error"}, {"message", "input not delivered: " + s.error().message()}}.dump());
        continue;
      }
      if (!s.ok()) {
        // Input that came after the end (a viewer typing ahead, a pipe's
        // last bytes): the pump still sends what the program wrote and
        // its exit, and closes.
        processEnded = process->info().ended();
        break;
      }
      typed.add(message.data);
    } else {
      handleControl(process, socket, message.data, note);
    }
  }
  typed.flush();
  note("terminal.detached", {{"process", process->id()}});
  if (!processEnded) {
    leaving = true;
    process->wake();
  }
  pump.join();
  // Like closing a terminal window: the last viewer to leave hangs it up.
  // A shell still starting may not have its SIGHUP handler yet, or ignores
  // it: it is killed if it is still there after a grace period.
  if (process->detachViewer() == 0 && process->info().kind == "shell") {
    (void)process->signal(SIGHUP);
    if (!process->waitEnded(std::chrono::steady_clock::now() + kHangUpGrace)) (void)process->signal(SIGKILL);
  }
}

}  // namespace

HttpResponse Api::shellRoute(const HttpRequest& req, const Principal& principal, const std::string& id) {
  if (auto e = onlyQuery(req, {"process", "rows", "cols"})) return errorResponse(*e);
  if (!req.websocketUpgrade) {
    HttpResponse refused =
        errorResponse({426, "upgrade_required", "this endpoint is a WebSocket: send a version 13 upgrade", ""});
    refused.headers = {{"Upgrade", "websocket"}, {"Connection", "Upgrade"}};  // RFC 7231 6.5.15
    return refused;
  }
  uint64_t rows = 24, cols = 80, processId = 0;
  if (auto e = queryNumber(req, "rows", 1000, 10, rows)) return errorResponse(*e);
  if (auto e = queryNumber(req, "cols", 1000, 10, cols)) return errorResponse(*e);
  if (auto e = queryNumber(req, "process", 1ULL << 53, 10, processId)) return errorResponse(*e);
  if (rows == 0 || cols == 0) return errorResponse(invalid(rows == 0 ? "rows" : "cols", "out of range (1 to 1000)"));
  std::shared_ptr<manager::Process> process;
  if (processId != 0) {
    // Another viewer of a terminal that already runs.
    auto found = commands_.process(id, processId);
    if (!found.ok()) return errorResponse(fromError(found.error()));
    if (!found.value()->info().pty) {
      return errorResponse(invalid("process", "process " + std::to_string(processId) + " has no terminal"));
    }
    // Typing into a terminal runs commands.
    gate::Action action;
    action.scope = gate::Scope::kRunCommand;
    action.argv = found.value()->info().argv;
    action.env = commands_.envOf(id);
    action.op = "shell";
    if (auto answer = check(req, principal, id, action)) return *answer;
    process = found.value();
  } else {
    manager::ProcessRequest request;
    // Paused, no shell starts: said before the probe below, which would
    // bring a checkpoint back into RAM for a read the gate did not judge.
    if (auto record = environments_.get(id); record.ok() && record->state == store::EnvironmentState::kPaused) {
      return errorResponse(
          {409, "conflict",
           "environment " + id + " is paused: resume it (POST /v1/environments/" + id + "/resume) to open a shell"});
    }
    init::FileRequest probe;
    probe.op = init::FileOp::kStat;
    probe.path = "/bin/bash";
    auto bash = commands_.file(id, probe);
    if (!bash.ok()) return errorResponse(fromError(bash.error()));
    request.argv = {bash->err == 0 ? "/bin/bash" : "/bin/sh"};
    // A shell counts as run_command: its argv is what the rules see.
    gate::Action action;
    action.scope = gate::Scope::kRunCommand;
    action.argv = request.argv;
    action.env = commands_.envOf(id);
    action.op = "shell";
    if (auto answer = check(req, principal, id, action)) return *answer;
    request.pty = true;
    request.rows = static_cast<uint16_t>(rows);
    request.cols = static_cast<uint16_t>(cols);
    request.kind = "shell";
    request.actor = principal.owner();
    auto started = commands_.startProcess(id, request);
    if (!started.ok()) return errorResponse(fromError(started.error()));
    process = started.value();
    if (process->info().state == manager::ProcessState::kFailed) {
      return errorResponse(
          {409, "conflict", processJson(process->info()).value("error", "the shell did not start"), ""});
    }
  }
  HttpResponse response;
  response.status = 101;
  Note note = [audit = &audit_, id, actor = principal.owner()](const std::string& type, json data) {
    audit->record(type, id, actor, std::move(data));
  };
  response.websocket = [process, stillActive = keys_.stillActive(principal), note](websocket::Connection& socket) {
    runViewer(process, socket, stillActive, note);
  };
  return response;
}

}  // namespace moat::api
