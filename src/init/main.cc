// moat-init: pid 1 of every environment. Serves the guest protocol on fd 3
// (or --control-fd N when run outside an environment, as the tests do).
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/sanitizer.h"
#include "common/trace.h"
#include "init/guest.h"
#include "init/supervisor.h"
#include "moat_version.h"
#include "os/machine.h"

MOAT_PID1_SANITIZER_OPTIONS()

static bool hasFlag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return true;
  }
  return false;
}

int main(int argc, char** argv) {
  moat::traceStage("moat-init: started");
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    std::puts("moat-init " MOAT_VERSION);
    return 0;
  }
  int controlFd = 3;
  int rendezvousFd = -1;
  int diskFd = -1;  // the volume's qgroup counters: this one and the next
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--control-fd") == 0) controlFd = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rendezvous-fd") == 0) rendezvousFd = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--disk-fds") == 0) diskFd = std::atoi(argv[i + 1]);
  }
  // Not dumpable: processes of the environment cannot ptrace pid 1 or open
  // its /proc entries (fds, exe, memory).
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (hasFlag(argc, argv, "--guest")) {
    // A microVM's pid 1: its root and its control connection are its own to make.
    auto guest = moat::init::prepareGuest();
    if (!guest.ok()) {
      std::fprintf(stderr, "moat-init: %s\n", guest.error().message().c_str());
      moat::os::powerOff();
      return 1;  // the kernel then panics, and reboots: QEMU (-no-reboot) ends
    }
    controlFd = guest->control.release();
    // A host that goes must never block a write (virtio-console waits for
    // its return otherwise): the loop sees the port hang up instead.
    ::fcntl(controlFd, F_SETFL, ::fcntl(controlFd, F_GETFL) | O_NONBLOCK);
    // Every program the guest starts answers to the gate, as in a
    // namespace environment.
    moat::init::Supervisor supervisor(controlFd, true, -1, true);
    // moatd may restart while QEMU and the guest live on: the next one
    // connects again (docs/MICROVM.md, "Lifetime").
    supervisor.keepPortAcrossHosts();
    // Its commands start in their cgroup, which a pause freezes.
    supervisor.runCommandsIn(std::move(*guest->commands));
    supervisor.keepIdentity(std::move(guest->identity));
    supervisor.keepLayers(std::move(guest->upperLayer), std::move(guest->lowerLayer));
    int code = supervisor.run();
    moat::os::powerOff();
    return code;
  }
  bool gateExec = rendezvousFd >= 0;  // moatd's environments: programs answer to the gate
  gateExec = gateExec || hasFlag(argc, argv, "--gate-exec");
  moat::init::Supervisor supervisor(controlFd, ::getpid() == 1, rendezvousFd, gateExec);
  if (diskFd >= 0) {
    // Not inherited by the commands: the counters are moat-init's.
    ::fcntl(diskFd, F_SETFD, FD_CLOEXEC);
    ::fcntl(diskFd + 1, F_SETFD, FD_CLOEXEC);
    supervisor.showDiskLimit(moat::os::QgroupCounters{moat::UniqueFd(diskFd), moat::UniqueFd(diskFd + 1)});
  }
  return supervisor.run();
}
