#pragma once

// MOAT_ASAN: 1 in an AddressSanitizer build (make sanitize). gcc says
// __SANITIZE_ADDRESS__, clang __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define MOAT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOAT_ASAN 1
#endif
#endif
#ifndef MOAT_ASAN
#define MOAT_ASAN 0
#endif

// For a binary that may be pid 1 of an environment (moat-init, moat run):
// pid 1 ignores the signals it has no handler for, which is what keeps the
// environment's processes from killing it. The sanitizer's handlers for
// SIGSEGV and friends would undo that in sanitizer builds.
#if MOAT_ASAN
#define MOAT_PID1_SANITIZER_OPTIONS()                                                      \
  extern "C" const char* __asan_default_options() {                                        \
    return "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:handle_abort=0"; \
  }
#else
#define MOAT_PID1_SANITIZER_OPTIONS()
#endif
