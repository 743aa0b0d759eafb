#include "isolation/namespaces/user_namespace.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "os/file.h"
#include "os/process.h"

namespace moat::isolation::namespaces {

std::optional<uint32_t> idMapSlotOf(uint32_t hostBase) {
  if (hostBase < kIdMapWindow || (hostBase - kIdMapWindow) % 65536u != 0) return std::nullopt;
  uint32_t slot = (hostBase - kIdMapWindow) / 65536u;
  if (slot >= kIdMapSlots) return std::nullopt;
  return slot;
}

Result<IdMapLease> leaseIdMap(const std::string& lockDir, std::optional<uint32_t> start) {
  MOAT_TRY(os::makeDirs(lockDir, 0700));
  if (!start) {
    uint16_t random = 0;
    if (::getrandom(&random, sizeof random, 0) != sizeof random) random = static_cast<uint16_t>(::getpid());
    start = random;
  }
  for (uint32_t i = 0; i < kIdMapSlots; ++i) {
    uint32_t slot = (*start + i) % kIdMapSlots;
    auto lock = os::FileLock::tryAcquire(lockDir + "/" + std::to_string(slot));
    if (!lock.ok()) {
      if (lock.error().sysErrno == EWOULDBLOCK) continue;  // another environment's
      return lock.error();
    }
    IdMapLease lease;
    lease.map.hostBase = kIdMapWindow + slot * 65536u;
    lease.lock = std::move(lock.value());
    return lease;
  }
  return Error::make(Code::kCapacity, "every one of the " + std::to_string(kIdMapSlots) +
                                          " host id ranges is held by a live environment");
}

namespace {

// Runs in the light child: hold the namespace open until the parent closes
// its end of the gate.
int holdNamespace(void* arg) {
  const int* gate = static_cast<const int*>(arg);
  ::close(gate[1]);  // the child's copy of the write end, or EOF never comes
  char byte;
  ssize_t ignored = ::read(gate[0], &byte, 1);
  (void)ignored;
  return 0;
}

}  // namespace

Result<UniqueFd> createUserNamespace(const IdMap& map) {
  int gate[2];
  if (::pipe2(gate, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  UniqueFd gateRead(gate[0]), gateWrite(gate[1]);
  int ends[2] = {gateRead.get(), gateWrite.get()};
  MOAT_ASSIGN(os::Child child, os::cloneLight(CLONE_NEWUSER, holdNamespace, ends));
  std::string proc = "/proc/" + std::to_string(child.pid);
  std::string line = "0 " + std::to_string(map.hostBase) + " " + std::to_string(map.count) + "\n";
  Status s = os::writeExisting(proc + "/uid_map", line);
  if (s.ok()) s = os::writeExisting(proc + "/gid_map", line);
  Result<UniqueFd> fd = s.ok() ? os::open(proc + "/ns/user", O_RDONLY) : Result<UniqueFd>(s.error());
  gateWrite.reset();
  (void)os::waitPidfd(child.pidfd.get());
  return fd;
}

Result<ReadyUserNamespace> readyUserNamespace() {
  ReadyUserNamespace ready;
  MOAT_ASSIGN(ready.lease, leaseIdMap());
  MOAT_ASSIGN(ready.ns, createUserNamespace(ready.lease.map));
  return ready;
}

}  // namespace moat::isolation::namespaces
