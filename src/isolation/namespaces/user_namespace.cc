#include "isolation/namespaces/user_namespace.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <string>

#include "os/file.h"
#include "os/process.h"

namespace moat::isolation::namespaces {

IdMap allocateIdMap() {
  uint16_t slot = 0;
  if (::getrandom(&slot, sizeof slot, 0) != sizeof slot) slot = static_cast<uint16_t>(::getpid());
  IdMap map;
  map.hostBase = 0x40000000u + static_cast<uint32_t>(slot % 16384) * 65536u;
  return map;
}

Result<UniqueFd> createUserNamespace(const IdMap& map) {
  int gate[2];
  if (::pipe2(gate, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  UniqueFd gateRead(gate[0]), gateWrite(gate[1]);

  MOAT_ASSIGN(os::Child child, os::clone3({CLONE_NEWUSER, -1}));
  if (child.pid == 0) {
    // Hold the namespace open until the parent has what it needs.
    gateWrite.reset();
    char byte;
    ssize_t ignored = ::read(gateRead.get(), &byte, 1);
    (void)ignored;
    ::_exit(0);
  }
  gateRead.reset();
  std::string proc = "/proc/" + std::to_string(child.pid);
  std::string line = "0 " + std::to_string(map.hostBase) + " " + std::to_string(map.count) + "\n";
  Status s = os::writeExisting(proc + "/uid_map", line);
  if (s.ok()) s = os::writeExisting(proc + "/gid_map", line);
  Result<UniqueFd> fd = s.ok() ? os::open(proc + "/ns/user", O_RDONLY) : Result<UniqueFd>(s.error());
  gateWrite.reset();
  (void)os::waitPidfd(child.pidfd.get());
  return fd;
}

}  // namespace moat::isolation::namespaces
