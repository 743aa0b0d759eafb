#include "os/terminal.h"

#include <sys/ioctl.h>
#include <unistd.h>

namespace moat::os {

bool isTerminal(int fd) { return ::isatty(fd) == 1; }

WindowSize windowSize(int fd) {
  struct winsize ws {};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_row == 0 || ws.ws_col == 0) return {};
  return {ws.ws_row, ws.ws_col};
}

Result<RawMode> RawMode::enable(int fd) {
  termios saved;
  if (::tcgetattr(fd, &saved) != 0) return Error::fromErrno("tcgetattr");
  termios raw = saved;
  ::cfmakeraw(&raw);
  if (::tcsetattr(fd, TCSAFLUSH, &raw) != 0) return Error::fromErrno("tcsetattr raw");
  return RawMode(fd, saved);
}

RawMode::RawMode(RawMode&& other) noexcept : fd_(other.fd_), saved_(other.saved_) { other.fd_ = -1; }

RawMode::~RawMode() {
  if (fd_ >= 0) ::tcsetattr(fd_, TCSAFLUSH, &saved_);
}

}  // namespace moat::os
