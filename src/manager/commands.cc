// Commands in an environment: background processes, blocking execs and
// file calls, each through its moat-init connection.
#include <signal.h>

#include <algorithm>
#include <chrono>

#include "common/base_environment.h"
#include "common/trace.h"
#include "manager/environment_manager.h"

namespace moat::manager {

namespace {

// A command's end as the audit log records it (exec.ended, process.ended).
nlohmann::json endedData(const ProcessInfo& info) {
  nlohmann::json j = {
      {"process", info.id}, {"argv", info.argv}, {"kind", info.kind}, {"state", processStateName(info.state)}};
  if (info.state == ProcessState::kExited) {
    j["exit_code"] = info.signal ? 128 + info.signal : info.exitCode;
    j["signal"] = info.signal;
    j["timed_out"] = info.timedOut;
    j["duration_ms"] = info.durationUs / 1000;
    j["stdout_bytes"] = info.stdoutBytes;
    j["stderr_bytes"] = info.stderrBytes;
  } else if (info.state == ProcessState::kFailed) {
    j["exit_code"] = info.spawnStage == "exec" && info.spawnErrno == ENOENT ? 127 : 126;
    j["error"] = info.spawnStage + ": " + std::strerror(info.spawnErrno);
  } else {
    j["reason"] = info.reason;
    j["duration_ms"] = info.endedAtMs - info.startedAtMs;
  }
  return j;
}

// The command's environment: the documented base set, the environment's
// own variables, then the request's.
std::vector<std::string> commandEnvironment(const std::string& id, const std::string& cwd,
                                            const std::map<std::string, std::string>& own,
                                            const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> merged = own;
  for (const auto& [k, v] : extra) merged[k] = v;
  std::vector<std::string> env = baseEnvironment(id, cwd);
  for (const auto& [k, v] : merged) {
    std::string prefix = k + "=";
    std::erase_if(env, [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
    env.push_back(prefix + v);
  }
  return env;
}

// Exec keeps everything up to its output limit; moat-init stops forwarding there.
constexpr uint64_t kExecOutputMax = 16u << 20;

}  // namespace

void EnvironmentManager::warmUp(const std::shared_ptr<InitConnection>& connection, const std::string& id) {
  // The first command in a new environment pays for cold lookups through its
  // fresh overlay (the dynamic loader, libc: ~1 ms here). A pool environment
  // pays them before it is claimed, so the claimer's first exec does not.
  auto process = std::make_shared<Process>(0, std::vector<std::string>{"/usr/bin/true"}, "exec", false, false, 4096);
  init::SpawnRequest spawn;
  spawn.argv = {"/usr/bin/true"};
  spawn.env = commandEnvironment(id, "/workspace", {}, {});
  spawn.cwd = "/workspace";
  spawn.timeoutMs = 5000;
  spawn.outputLimit = 4096;
  if (process->start(connection, spawn, "", false).ok()) {
    (void)process->waitEnded(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  }
}

Result<std::shared_ptr<Process>> EnvironmentManager::startProcess(const std::string& id,
                                                                  const ProcessRequest& request) {
  auto starting = starts_.shared(id);  // until moat-init has started it (pause.cc)
  MOAT_ASSIGN(LiveEnvironment live, unpausedLiveOf(id, "start processes"));
  MOAT_ASSIGN(auto process,
              live.processes->add(request.argv, request.kind, request.pty, request.stdinOpen || request.pty,
                                  live.processes->limits().outputCapPerStream));
  init::SpawnRequest spawn;
  spawn.argv = request.argv;
  const std::string cwd = request.cwd.empty() ? live.cwd : request.cwd;
  spawn.env = commandEnvironment(id, cwd, live.env, request.env);
  spawn.uid = live.uid;
  spawn.gid = live.gid;
  if (request.pty &&
      std::none_of(spawn.env.begin(), spawn.env.end(), [](const std::string& e) { return e.rfind("TERM=", 0) == 0; })) {
    spawn.env.push_back("TERM=xterm-256color");
  }
  spawn.cwd = cwd;
  spawn.stdinPipe = request.stdinOpen;
  spawn.pty = request.pty;
  spawn.timeoutMs = request.timeoutMs;
  audit_.record("process.started", id, request.actor,
                {{"process", process->id()},
                 {"argv", request.argv},
                 {"kind", request.kind},
                 {"cwd", cwd},
                 {"pty", request.pty},
                 {"env", request.env}});
  process->onEnded([recorder = &audit_, id, actor = request.actor](const ProcessInfo& info) {
    recorder->record("process.ended", id, actor, endedData(info));
  });
  // A moat-init older than flow control (an environment started before an
  // upgrade) forwards everything: the process is an ordinary one there.
  if (request.lossless && live.connection->peerVersion() >= init::kFlowControlSince) {
    process->makeLossless();
    std::lock_guard<std::mutex> lock(threadsMutex_);
    lossless_.push_back(process);  // the reaper lets it go once nobody follows it
  }
  Status started = process->start(live.connection, spawn, "", false);
  starting.run();
  if (started.ok() && request.pty) (void)process->resize(request.rows, request.cols);
  ++execs_;
  if (!started.ok()) {
    process->abandon(started.error().message());  // its end is recorded
    return started.error();
  }
  return process;
}

void EnvironmentManager::adoptProcess(LiveEnvironment& live, const std::string& id, const std::string& actor,
                                      const std::shared_ptr<Process>& process) {
  const bool exec = process->info().kind == "exec";
  process->onEnded([recorder = &audit_, id, actor, exec](const ProcessInfo& info) {
    recorder->record(exec ? "exec.ended" : "process.ended", id, actor, endedData(info));
  });
  if (process->info().lossless) {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    lossless_.push_back(process);  // the reaper lets it go once nobody follows it
  }
  live.processes->adopt(process);
}

Result<std::vector<std::shared_ptr<Process>>> EnvironmentManager::processes(const std::string& id) {
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  return live.processes->all();
}

Result<std::shared_ptr<Process>> EnvironmentManager::process(const std::string& id, uint64_t processId) {
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  auto process = live.processes->find(processId);
  if (!process) {
    return Error::make(Code::kNotFound, "no process " + std::to_string(processId) + " in environment " + id);
  }
  return process;
}

Result<std::shared_ptr<void>> EnvironmentManager::reserveExecOutput(const std::string& caller, uint64_t outputLimit) {
  const uint64_t limit = outputLimit ? std::min(outputLimit, kExecOutputMax) : kExecOutputMax;
  return execOutput_.reserve(caller, 2 * limit);  // two streams
}

Result<ExecResult> EnvironmentManager::exec(const std::string& id, const ExecRequest& request,
                                            const std::map<std::string, std::string>& env) {
  auto starting = starts_.shared(id);  // until moat-init has started it (pause.cc)
  MOAT_ASSIGN(LiveEnvironment live, unpausedLiveOf(id, "run commands"));
  uint64_t limit = request.outputLimit ? std::min(request.outputLimit, kExecOutputMax) : kExecOutputMax;
  MOAT_ASSIGN(auto process, live.processes->add(request.argv, "exec", false, false, limit));
  ScopeExit forget([&] { live.processes->remove(process->id()); });
  init::SpawnRequest spawn;
  spawn.argv = request.argv;
  const std::string cwd = request.cwd.empty() ? live.cwd : request.cwd;
  spawn.env = commandEnvironment(id, cwd, live.env, env);
  spawn.cwd = cwd;
  spawn.uid = live.uid;
  spawn.gid = live.gid;
  spawn.stdinPipe = request.withStdin;
  spawn.timeoutMs = request.timeoutMs;
  spawn.outputLimit = limit;
  ++execs_;
  audit_.record("exec.started", id, request.actor, [&] {
    nlohmann::json data = {{"process", process->id()}, {"argv", request.argv}, {"cwd", cwd}, {"env", env}};
    if (!request.stdinEvent.is_null()) data["stdin"] = request.stdinEvent;  // what it was given to read
    return data;
  }());
  // Every way out below ends the process; its end is recorded then.
  process->onEnded([recorder = &audit_, id, actor = request.actor](const ProcessInfo& info) {
    recorder->record("exec.ended", id, actor, endedData(info));
  });
  traceStage("moatd: exec");
  Status started = process->start(live.connection, spawn, request.stdinData, request.withStdin);
  starting.run();
  if (!started.ok()) {
    process->abandon(started.error().message());
    return started.error();
  }
  traceStage("moatd: exec sent");
  // moat-init enforces the timeout; the grace covers the kill and the report.
  auto deadline =
      std::chrono::steady_clock::now() + (request.timeoutMs ? std::chrono::milliseconds(request.timeoutMs + 10000)
                                                            : std::chrono::milliseconds(24LL * 3600 * 1000));
  if (!process->waitEnded(deadline)) {
    (void)process->signal(SIGKILL);  // nobody waits for it any more
    process->abandon("moat-init did not report the end of the command in time");
    return Error::make(Code::kTimeout, "moat-init did not report the end of the command in time");
  }
  traceStage("moatd: exec ended");
  ProcessInfo info = process->info();
  ExecResult r;
  if (info.state == ProcessState::kLost) return Error::make(Code::kGone, info.reason);
  if (info.state == ProcessState::kFailed) {
    r.spawnErrno = info.spawnErrno;
    r.spawnStage = info.spawnStage;
    return r;
  }
  r.started = true;
  r.exitCode = info.exitCode;
  r.signal = info.signal;
  r.timedOut = info.timedOut;
  r.durationUs = info.durationUs;
  r.out = process->take(OutputStream::kStdout);
  r.err = process->take(OutputStream::kStderr);
  r.outTruncated = info.stdoutTruncated || info.stdoutDropped > 0;
  r.errTruncated = info.stderrTruncated || info.stderrDropped > 0;
  return r;
}

Result<init::FileResult> EnvironmentManager::file(const std::string& id, const init::FileRequest& request) {
  // Reads, listings and stats answer while paused (moat-init is not); what
  // changes files waits for the resume.
  const bool reads =
      request.op == init::FileOp::kRead || request.op == init::FileOp::kStat || request.op == init::FileOp::kList;
  if (reads) {
    MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
    if (live.paused && live.microVm) return readPausedGuest(id, live, request);  // its memory may be on disk
    return live.connection->file(request);
  }
  auto changing = starts_.shared(id);  // a pause waits for it (pause.cc)
  MOAT_ASSIGN(LiveEnvironment live, unpausedLiveOf(id, "change files"));
  return live.connection->file(request);
}

}  // namespace moat::manager
