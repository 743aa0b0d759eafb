#pragma once

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace moat {

// Stage timing for performance work: with MOAT_TRACE=1, prints
// "moat-trace <pid> <ms since this process's first trace> <CLOCK_MONOTONIC ms>
// <stage>" to stderr. The absolute column puts the lines of moatd, the spawner
// and the cloned children on one clock (bench/trace.sh merges them).
// Async-signal safe enough for the cloned child (snprintf + write, no
// allocation).
inline bool traceEnabled() {
  static const bool enabled = std::getenv("MOAT_TRACE") != nullptr;
  return enabled;
}

inline void traceStage(const char* stage) {
  if (!traceEnabled()) return;
  static struct timespec start = [] {
    struct timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts;
  }();
  struct timespec now;
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  double ms = (now.tv_sec - start.tv_sec) * 1e3 + (now.tv_nsec - start.tv_nsec) / 1e6;
  double clock = now.tv_sec * 1e3 + now.tv_nsec / 1e6;
  char line[192];
  int n = std::snprintf(line, sizeof line, "moat-trace %d %8.3f %.3f %s\n", ::getpid(), ms, clock, stage);
  if (n > 0) {
    ssize_t ignored = ::write(2, line, static_cast<size_t>(n));
    (void)ignored;
  }
}

}  // namespace moat
