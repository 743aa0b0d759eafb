#include "isolation/namespaces/ready_network.h"

#include <sys/mount.h>

#include "os/file.h"
#include "os/file_lock.h"
#include "os/mount.h"
#include "os/net.h"
#include "os/netlink.h"

namespace moat::isolation::namespaces {

Result<UniqueFd> readyNetwork() {
  MOAT_ASSIGN(UniqueFd made, os::newNetworkNamespace());
  MOAT_TRY(os::inNetworkNamespace(made.get(), [] { return os::bringLoopbackUp(); }));
  return made;
}

std::optional<UniqueFd> takeReadyNetwork(const std::string& dir) {
  if (!os::isDirectory(dir)) return std::nullopt;
  auto lock = os::FileLock::tryAcquire(dir + "/ready.lock");
  if (!lock.ok()) return std::nullopt;
  const std::string slot = dir + "/ready";
  auto netns = os::openNetworkNamespace(slot);
  if (!netns.ok()) return std::nullopt;
  // Only once it is no longer pinned at the slot may it serve: nobody
  // else can then open it.
  if (!os::unmount(slot, MNT_DETACH).ok()) return std::nullopt;
  return std::move(netns.value());
}

Status makeReadyNetwork(const std::string& dir) {
  MOAT_TRY(os::makeDirs(dir, 0700));
  auto lock = os::FileLock::tryAcquire(dir + "/ready.lock");
  if (!lock.ok()) return {};  // another run is at it
  const std::string slot = dir + "/ready";
  if (os::openNetworkNamespace(slot).ok()) return {};
  MOAT_ASSIGN(UniqueFd made, readyNetwork());
  if (!os::exists(slot)) MOAT_TRY(os::writeFile(slot, "", 0600));
  return os::bindMount("/proc/self/fd/" + std::to_string(made.get()), slot);
}

}  // namespace moat::isolation::namespaces
