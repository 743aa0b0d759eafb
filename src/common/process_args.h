#pragma once

namespace moat {

// Remembers main's argv so that a cloned child which keeps running the same
// image (moat-init in process) can wipe the command line and environment it
// inherited: /proc/1/cmdline inside an environment must not show the host's
// `moat run ...` line with its host paths.
void rememberProcessArgs(int argc, char** argv);
void scrubProcessArgs();

}  // namespace moat
