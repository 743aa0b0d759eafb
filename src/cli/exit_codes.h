#pragma once

// moat's own exit codes (docs/CLI.md). Every other code is the command's:
// its exit status, or 128+N when signal N killed it.
namespace moat::cli {

constexpr int kExitUsage = 2;          // bad flags or values; nothing was created
constexpr int kExitTimeout = 124;      // --timeout hit; the command was killed
constexpr int kExitEnvironment = 125;  // the environment could not be created or failed
constexpr int kExitCannotRun = 126;    // the command exists but cannot run (permissions, cwd)
constexpr int kExitNotFound = 127;     // the command does not exist in the environment

}  // namespace moat::cli
