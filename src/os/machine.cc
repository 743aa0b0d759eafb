#include "os/machine.h"

#include <fcntl.h>
#include <sys/reboot.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"

namespace moat::os {

Status loadKernelModule(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::fromErrno("open " + path);
  if (::syscall(SYS_finit_module, fd.get(), "", 0) != 0 && errno != EEXIST) {
    return Error::fromErrno("load module " + path);
  }
  return {};
}

void powerOff() {
  ::sync();
  ::reboot(RB_POWER_OFF);
}

}  // namespace moat::os
