#pragma once

#include <sys/types.h>

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

// Whether `image` is the exec that was judged: `execFn` and `argv` as read
// from the request (`complete` false: argv was cut there, so only what was
// read is compared). A script's interpreter comes first in the image's
// argv, followed by the script's name and the request's arguments after
// argv[0].
bool sameExec(const std::string& execFn, const std::vector<std::string>& argv, bool complete,
              const ExecImage& image);

}  // namespace moat::os
