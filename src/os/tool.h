#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/result.h"

// Runs a helper program (skopeo, umoci, gzip) as a child of a multi-threaded
// process: its own process group, killed with the thread that started it
// (PR_SET_PDEATHSIG), nothing inherited but what the caller names, a
// deadline, and the last lines of what it printed for the error.
namespace moat::os {

struct ToolRun {
  std::vector<std::string> argv;  // argv[0]: an absolute path
  std::vector<std::string> env;   // KEY=VALUE: the whole environment
  std::string cwd = "/";
  std::chrono::steady_clock::time_point deadline;
  uint64_t maxFileBytes = 0;  // RLIMIT_FSIZE (no file it writes grows beyond); 0: none
  int stdinFd = -1;           // -1: /dev/null
  int stdoutFd = -1;          // -1: stdout goes where stderr does (the tail)
  // >= 0: a Landlock ruleset (landlockFileRuleset) the child restricts
  // itself to, with no_new_privs, before the exec.
  int landlockRuleset = -1;
  int passFd = -1;  // >= 0: the program gets it as its descriptor 3 (and no other)
  // Called about every 200 ms while it runs: an error kills it and is returned.
  std::function<Status()> check;
};

// Ok when it exits 0. Otherwise an error naming the program and saying how
// it ended (status, signal, past the deadline: code "timeout"), with the
// last lines of its stderr (at most ~2 KiB).
Status runTool(const ToolRun& run);

// The last `maxBytes` of text, cut at a line start where possible.
std::string tailOf(const std::string& text, size_t maxBytes);

}  // namespace moat::os
