#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "os/mount.h"

namespace moat::isolation::fs {

// A root of its own for a program moat runs on the host side (QEMU): an
// empty read-only tmpfs holding only the host paths named, each at its own
// path, read only unless named writable (a device node's mount alone lets
// devices be opened),
// and a proc of the program's own pid namespace that shows its processes
// and nothing else of the host (proc's subset=pid: no /proc/sys, no
// /proc/kcore, no other pids). Made here as detached mounts, before the
// child exists; the child (root, in mount and pid namespaces of its own)
// enters it by os::enterRootInChild(plan()) before it drops root. A
// symlink among the paths (/lib on a merged-/usr host) is made again as
// the same symlink, and what it leads to is bound at its real path.
class HelperRoot {
 public:
  struct Entry {
    std::string path;  // absolute, on the host
    int fd;            // that path opened (O_PATH will do), following links
    bool writable = false;
  };
  // `attachAt`: a directory of the host's that the child attaches the root
  // on before it pivots (its namespace is private: the host sees nothing).
  static Result<HelperRoot> make(const std::vector<Entry>& entries, const std::string& attachAt);

  // For the child; valid while this object lives.
  os::RootPlan plan() const;

 private:
  UniqueFd root_, procAt_;
  std::string attachAt_;
  std::vector<UniqueFd> held_;  // the trees and their targets
  std::vector<os::RootAttach> attach_;
};

}  // namespace moat::isolation::fs
