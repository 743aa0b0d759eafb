#include "api/process_json.h"

#include <string.h>

#include <csignal>
#include <cstring>

#include "api/keys.h"
#include "common/encoding.h"

namespace moat::api {
namespace {

// What a caller sees as the exit code: the shell's convention, 128+N when
// killed; 127 and 126 when the command could not start.
int shellExitCode(const manager::ProcessInfo& info) {
  if (info.state == manager::ProcessState::kFailed) {
    return info.spawnStage == "exec" && info.spawnErrno == ENOENT ? 127 : 126;
  }
  return info.signal ? 128 + info.signal : info.exitCode;
}

// Why a command did not start, the way a shell would say it.
std::string startError(const manager::ProcessInfo& info) {
  bool notFound = info.spawnStage == "exec" && info.spawnErrno == ENOENT;
  return std::string(notFound ? "command not found: " : "cannot run: ") + (info.argv.empty() ? "" : info.argv[0]) +
         " (" + info.spawnStage + ": " + std::strerror(info.spawnErrno) + ")";
}

}  // namespace

json processJson(const manager::ProcessInfo& info) {
  json j = {{"id", info.id},
            {"pid", info.pid},
            {"cmd", info.argv},
            {"kind", info.kind},
            {"pty", info.pty},
            {"state", manager::processStateName(info.state)},
            {"stdin_open", info.stdinOpen},
            {"lossless", info.lossless},
            {"started_at", timestamp(info.startedAtMs)},
            {"stdout_bytes", info.stdoutBytes},
            {"stderr_bytes", info.stderrBytes},
            {"stdout_dropped", info.stdoutDropped},
            {"stderr_dropped", info.stderrDropped},
            {"output_offset", info.outputEnd}};
  if (info.ended()) {
    j["ended_at"] = timestamp(info.endedAtMs);
  }
  if (info.state == manager::ProcessState::kExited || info.state == manager::ProcessState::kFailed) {
    j["exit_code"] = shellExitCode(info);
  }
  if (info.state == manager::ProcessState::kExited) {
    j["signal"] = info.signal;
    j["timed_out"] = info.timedOut;
    j["duration_ms"] = info.durationUs / 1000;
  }
  if (info.state == manager::ProcessState::kFailed) j["error"] = startError(info);
  if (info.state == manager::ProcessState::kLost) j["reason"] = info.reason;
  return j;
}

json outputEventJson(const manager::OutputItem& item, bool forceBase64) {
  if (item.dropped) {
    return {{"type", "dropped"}, {"offset", item.offset}, {"bytes", item.length}};
  }
  bool asBase64 = forceBase64 || !travelsAsJsonText(item.data);
  return {{"type", "output"},
          {"stream", item.stream == manager::OutputStream::kStdout ? "stdout" : "stderr"},
          {"offset", item.offset},
          {"data", asBase64 ? base64Encode(item.data) : item.data},
          {"encoding", asBase64 ? "base64" : "utf8"}};
}

json terminalEventJson(const manager::ProcessInfo& info) {
  if (info.state == manager::ProcessState::kLost) {
    return {{"type", "end"}, {"offset", info.outputEnd}, {"state", "lost"}, {"reason", info.reason}};
  }
  json j = {{"type", "exit"},
            {"offset", info.outputEnd},
            {"state", manager::processStateName(info.state)},
            {"exit_code", shellExitCode(info)}};
  if (info.state == manager::ProcessState::kExited) {
    j["signal"] = info.signal;
    j["timed_out"] = info.timedOut;
  }
  if (info.state == manager::ProcessState::kFailed) j["error"] = startError(info);
  return j;
}

int parseSignal(const json& j) {
  if (j.is_number_integer()) {
    auto n = j.get<int64_t>();
    return n >= 1 && n <= 64 ? static_cast<int>(n) : 0;
  }
  if (!j.is_string()) return 0;
  std::string name = j.get<std::string>();
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  for (int signo = 1; signo < 32; ++signo) {
    const char* abbrev = ::sigabbrev_np(signo);
    if (abbrev && name == abbrev) return signo;
  }
  return 0;
}

json inputJson(const std::string& data) {
  json j = {{"bytes", data.size()}, {"sha256", sha256Hex(data)}};
  if (data.size() <= 256 && travelsAsJsonText(data)) {
    bool printable = true;
    for (unsigned char c : data)
      printable = printable && (c >= 0x20 || c == '\n' || c == '\t' || c == '\r') && c != 0x7f;
    if (printable) j["text"] = data;
  }
  return j;
}

}  // namespace moat::api
