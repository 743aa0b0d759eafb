#include "isolation/namespaces/ready_network.h"

#include <sys/mount.h>

#include "os/file.h"
#include "os/file_lock.h"
#include "os/mount.h"
#include "os/net.h"
#include "os/netlink.h"

namespace moat::isolation::namespaces {
namespace {

// The slot is a mount point, and a mount made in one mount namespace shows
// in others too (propagation, or a copy when a namespace is made): unmounting
// it in one leaves it in the rest. So the namespace is also named in a file
// beside it (the same file in every mount namespace: /run is one file system), set
// by its maker and cleared by its taker, and only the named one is handed
// out. Both are called with the slot's lock held.
//
// The record is written in place at a fixed width, never truncated: on a
// file system mounted with `discard` (/run is not always a tmpfs; here it is
// the root's ext4), every block a truncation frees is discarded at once, and
// that took 0.5-3.5 ms of each `moat run`'s start.
struct Slot {
  static constexpr size_t kRecordWidth = 64;  // an identity ("<dev>:<inode>") and spaces
  std::string mountPoint, record;
  explicit Slot(const std::string& dir) : mountPoint(dir + "/ready"), record(dir + "/ready.id") {}

  // Names `identity` (empty: nothing) as the namespace at the slot.
  Status name(const std::string& identity) const {
    if (identity.size() > kRecordWidth) return Error::make(Code::kInternal, "namespace identity too long");
    return os::overwriteFile(record, identity + std::string(kRecordWidth - identity.size(), ' '), 0600);
  }

  // The namespace at the slot if it is the one the record names.
  std::optional<UniqueFd> named() const {
    auto netns = os::openNetworkNamespace(mountPoint);
    if (!netns.ok()) return std::nullopt;
    auto identity = os::namespaceIdentity(netns->get());
    auto recorded = os::readFile(record, 256);
    if (!identity.ok() || !recorded.ok() || identity->empty()) return std::nullopt;
    std::string named = recorded.value();
    named.erase(named.find_last_not_of(' ') + 1);  // the width's padding (an older record has none)
    if (named != identity.value()) return std::nullopt;
    return std::move(netns.value());
  }
  // Drops whatever is mounted there (nothing to hand out).
  void clear() const { (void)os::unmount(mountPoint, MNT_DETACH); }
};

}  // namespace

Result<UniqueFd> readyNetwork() {
  MOAT_ASSIGN(UniqueFd made, os::newNetworkNamespace());
  MOAT_TRY(os::inNetworkNamespace(made.get(), [] { return os::bringLoopbackUp(); }));
  return made;
}

std::optional<UniqueFd> takeReadyNetwork(const std::string& dir) {
  auto lock = os::FileLock::tryAcquire(dir + "/ready.lock");  // fails too when there is no slot yet
  if (!lock.ok()) return std::nullopt;
  Slot slot(dir);
  auto netns = slot.named();
  if (!netns) {
    slot.clear();  // someone else's (taken in another mount namespace), or not a namespace
    return std::nullopt;
  }
  // Claimed for every mount namespace, then gone from this one: nobody can
  // open it any more, and it ends with the environment that joins it.
  if (!slot.name("").ok()) return std::nullopt;
  slot.clear();
  return netns;
}

Status makeReadyNetwork(const std::string& dir) {
  MOAT_TRY(os::makeDirs(dir, 0700));
  auto lock = os::FileLock::tryAcquire(dir + "/ready.lock");
  if (!lock.ok()) return {};  // another run is at it
  Slot slot(dir);
  if (slot.named()) return {};
  slot.clear();
  MOAT_ASSIGN(UniqueFd made, readyNetwork());
  MOAT_ASSIGN(std::string identity, os::namespaceIdentity(made.get()));
  if (!os::exists(slot.mountPoint)) MOAT_TRY(os::writeFile(slot.mountPoint, "", 0600));
  MOAT_TRY(os::bindMount("/proc/self/fd/" + std::to_string(made.get()), slot.mountPoint));
  return slot.name(identity);
}

}  // namespace moat::isolation::namespaces
