#include "isolation/caps/capabilities.h"

#include <linux/capability.h>

namespace moat::isolation::caps {

const std::vector<int>& environmentCapabilities() {
  // What a root user needs for ordinary work on its own files: package
  // managers chown, daemons switch users and bind low ports. Absent on
  // purpose: SYS_ADMIN (mount, namespaces), SYS_PTRACE (attach to init; moat-init
  // alone has it, below),
  // NET_ADMIN/NET_RAW (network), MKNOD (device nodes), SYS_MODULE, SYS_RAWIO,
  // SYS_TIME, SYS_BOOT, DAC_READ_SEARCH (open_by_handle_at), BPF, PERFMON...
  static const std::vector<int> keep = {
      CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FOWNER,           CAP_FSETID,     CAP_KILL,    CAP_SETGID,
      CAP_SETUID, CAP_SETPCAP,      CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_SETFCAP, CAP_AUDIT_WRITE,
  };
  return keep;
}

const std::vector<int>& initCapabilities() {
  static const std::vector<int> keep = [] {
    std::vector<int> caps = environmentCapabilities();
    caps.push_back(CAP_SYS_PTRACE);  // dropped by init/launch.cc for every command
    return caps;
  }();
  return keep;
}

}  // namespace moat::isolation::caps
