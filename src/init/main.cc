// moat-init: pid 1 of every environment. Serves the guest protocol on fd 3
// (or --control-fd N when run outside an environment, as the tests do).
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "init/supervisor.h"

#if defined(__SANITIZE_ADDRESS__)
// pid 1 ignores the signals it has no handler for, which is what keeps the
// environment's processes from killing it. The sanitizer's handlers for
// SIGSEGV and friends would undo that in sanitizer builds.
extern "C" const char* __asan_default_options() {
  return "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:handle_abort=0";
}
#endif

int main(int argc, char** argv) {
  int controlFd = 3;
  int rendezvousFd = -1;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--control-fd") == 0) controlFd = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rendezvous-fd") == 0) rendezvousFd = std::atoi(argv[i + 1]);
  }
  // Not dumpable: processes of the environment cannot ptrace pid 1 or open
  // its /proc entries (fds, exe, memory).
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  moat::init::Supervisor supervisor(controlFd, ::getpid() == 1, rendezvousFd);
  return supervisor.run();
}
