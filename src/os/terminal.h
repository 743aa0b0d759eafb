#pragma once

#include <termios.h>

#include <cstdint>

#include "common/result.h"

// The user's terminal, for `moat shell`.
namespace moat::os {

struct WindowSize {
  uint16_t rows = 24;
  uint16_t cols = 80;
};

bool isTerminal(int fd);
// The terminal's size, or 24x80 when fd is not a terminal.
WindowSize windowSize(int fd);

// Puts a terminal in raw mode (no echo, no line editing, no signals from
// keys: ^C reaches the remote side) and restores it when destroyed.
class RawMode {
 public:
  static Result<RawMode> enable(int fd);
  RawMode(RawMode&& other) noexcept;
  RawMode& operator=(RawMode&&) = delete;
  ~RawMode();

 private:
  RawMode(int fd, const termios& saved) : fd_(fd), saved_(saved) {}
  int fd_ = -1;
  termios saved_{};
};

}  // namespace moat::os
