#include "init/pty.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>

namespace moat::init {

Result<Pty> openPty(uint16_t rows, uint16_t cols) {
  constexpr int kFlags = O_RDWR | O_NOCTTY | O_CLOEXEC;
  Pty pty;
  // /dev/ptmx is a symlink to pts/ptmx in an environment; a /dev without it
  // still has the devpts instance's own multiplexer.
  for (const char* path : {"/dev/ptmx", "/dev/pts/ptmx"}) {
    pty.master.reset(::open(path, kFlags));
    if (pty.master) break;
  }
  if (!pty.master) return Error::fromErrno("open /dev/ptmx");
  int unlock = 0;
  if (::ioctl(pty.master.get(), TIOCSPTLCK, &unlock) != 0) return Error::fromErrno("unlock pty");
  pty.slave.reset(::ioctl(pty.master.get(), TIOCGPTPEER, kFlags));
  if (!pty.slave) return Error::fromErrno("open pty peer");
  MOAT_TRY(setWindowSize(pty.master.get(), rows, cols));
  return pty;
}

Status setWindowSize(int master, uint16_t rows, uint16_t cols) {
  struct winsize size = {};
  size.ws_row = rows;
  size.ws_col = cols;
  if (::ioctl(master, TIOCSWINSZ, &size) != 0) return Error::fromErrno("set window size");
  return {};
}

char eofCharacter(int master) {
  struct termios t;
  if (::tcgetattr(master, &t) != 0 || t.c_cc[VEOF] == _POSIX_VDISABLE) return '\x04';
  return static_cast<char>(t.c_cc[VEOF]);
}

}  // namespace moat::init
