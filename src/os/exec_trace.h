#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

// The exec gate's second look: what a process runs once the kernel has
// started the program, before its first instruction. The seccomp listener
// (os/exec_notify.h) judges what an exec asks for, and the kernel reads the
// request again after the answer: a process's other thread, or another
// process writing its memory, can change the request in between. Traced
// (ptrace) from the answer on, the process stops right after its exec,
// where what the kernel actually used is in the new program's memory,
// which nothing else has touched yet.
namespace moat::os {

// Starts tracing `pid` for its exec only (PTRACE_SEIZE, exec events; killed
// if the tracer ends). EPERM: another process traces it already.
Status traceExec(pid_t pid);
// Lets a stopped tracee go on untraced (PTRACE_DETACH).
Status untrace(pid_t pid);

// What waitpid reported for a tracee that stopped.
enum class TraceStop {
  kExec,    // after its exec (PTRACE_EVENT_EXEC)
  kGroup,   // a stop signal under SEIZE (PTRACE_EVENT_STOP)
  kSignal,  // a signal about to be delivered: WSTOPSIG
  kOther,   // another event
};
TraceStop classifyStop(int status);
// Lets a stopped tracee go on as it would have without the tracer: the
// signal delivered, a group stop kept (PTRACE_LISTEN), any other stop ended.
Status resumeStopped(pid_t pid, int status);
// The thread id the process had before its exec (a thread that is not the
// leader takes the leader's id at exec; PTRACE_GETEVENTMSG).
pid_t idBeforeExec(pid_t pid);

// The program that a process stopped after its exec runs with: the name
// the kernel gave it (AT_EXECFN) and its arguments (/proc/PID/cmdline), at
// most `maxBytes` of them.
struct ExecImage {
  std::string execFn;
  std::vector<std::string> argv;
};
Result<ExecImage> readExecImage(pid_t pid, size_t maxBytes);

// A file, as stat tells it apart from every other.
struct FileId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool operator==(const FileId&) const = default;
};

// The file an exec names, as the kernel will run it: the file itself, or,
// for a script ("#!" line), its interpreter with the one argument the line
// may give it. `procPath` is ExecAttempt's; an interpreter is found as the
// kernel finds it, from the process's root or working directory.
struct ExecFile {
  FileId id;
  std::string path;  // the file's name as moat-init sees it (readlink of what it opened)
  bool script = false;
  std::string interpreter;
  bool hasInterpreterArg = false;  // the line gives one (which may be "")
  std::string interpreterArg;
  FileId interpreterId;
};
Result<ExecFile> identifyExecFile(pid_t pid, const std::string& procPath);
// The file a process runs (/proc/PID/exe).
Result<FileId> runningFile(pid_t pid);
// The pid that traces `pid` (TracerPid, as this process's namespace sees
// it), 0 for none, -1 if unknown.
pid_t tracerOf(pid_t pid);

// The argv a script runs with: its interpreter, the line's argument, the
// name the exec gave (AT_EXECFN), then the request's arguments after argv[0].
std::vector<std::string> scriptArgv(const ExecFile& file, const std::string& execFn,
                                    const std::vector<std::string>& argv);

// Whether a process stopped after its exec runs exactly the exec that was
// judged: the file (`running`, /proc/PID/exe) is the one named, or for a
// script its interpreter; the name the kernel gave it is `execFn`; and its
// argv is the request's (a script's as scriptArgv says).
bool sameExec(const std::string& execFn, const std::vector<std::string>& argv, const ExecFile& file,
              const FileId& running, const ExecImage& image);

}  // namespace moat::os
