#pragma once

#include <cstdint>

#include "common/result.h"
#include "common/unique_fd.h"

namespace moat::init {

// A new pseudo-terminal pair. Both ends are close-on-exec, and neither
// becomes the caller's controlling terminal.
struct Pty {
  UniqueFd master;
  UniqueFd slave;
};

// Opens a pty from the /dev of the calling process (inside an environment:
// its own devpts instance) and sets its window size. The slave comes from
// the master itself (TIOCGPTPEER), so no path under /dev/pts is looked up.
Result<Pty> openPty(uint16_t rows, uint16_t cols);

// Sets the window size; the kernel sends SIGWINCH to the foreground group
// when it changes.
Status setWindowSize(int master, uint16_t rows, uint16_t cols);

// The terminal's end-of-file character (^D unless the program changed it).
char eofCharacter(int master);

}  // namespace moat::init
