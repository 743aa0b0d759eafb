#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "init/protocol.h"

namespace moat::init {

// One command on its way to exec: everything its child needs, built on
// moat-init's loop, so that the vfork and the wait for the exec can run on
// a launcher thread (see Launcher) while the loop goes on serving.
struct Launch {
  SpawnRequest request;                 // owns the strings argv and envp point into
  std::vector<std::string> candidates;  // paths to try, in PATH order
  std::vector<bool> claimed;            // by the exec gate (Launcher::claimLaunchExec), one per candidate
  std::vector<char*> argv;
  std::vector<char*> envp;
  bool switchIds = false;
  bool controllingTty = false;  // stdio[0] is a pty slave: make it the session's terminal
  // The child's ends (become its 0, 1 and 2; a pty's slave serves as all
  // three), closed once it has exec'd. Only the child may hold them: a pty
  // master reads EIO, and a pipe EOF, once the last of them is closed.
  // Without a stdin pipe, the child reads moat-init's shared /dev/null.
  UniqueFd childIn, childOut, childErr;
  int nullIn = -1;
  // A cgroup directory the child starts in (clone3 CLONE_INTO_CGROUP: a
  // microVM guest's commands'); -1: moat-init's own (a plain vfork).
  int cgroupFd = -1;

  // The outcome, filled by runLaunch: the child's pid, or the errno and
  // stage of what failed (pid -1). The vforked child shares this memory and
  // writes a failure here before it exits.
  pid_t pid = -1;
  int err = 0;
  const char* stage = "";
  // The child's pid, stored by the child itself before its first exec: the
  // exec gate lets that exec go on by itself (the client judged it).
  std::atomic<pid_t> childPid{0};
};

// moat-init's ends of a new command's streams. With a pty, stdoutFd is the
// terminal's master and stdinFd a second descriptor of it; stderrFd is empty.
struct LaunchEnds {
  UniqueFd stdinFd, stdoutFd, stderrFd;
};

// Opens the pipes (or the terminal) and builds the exec plan; devNull is an
// open /dev/null (read) the child gets as stdin when it has no stdin pipe.
// Errors carry the stage reported in SpawnFailed as their context.
Result<std::unique_ptr<Launch>> prepareLaunch(SpawnRequest request, int devNull, LaunchEnds& ends);

// vfork + exec; returns once the child has exec'd or failed (then reaped).
// Safe on any thread: the child only makes system calls, and switches ids
// with raw ones (glibc's would change every thread of moat-init).
void runLaunch(Launch& launch);

}  // namespace moat::init
