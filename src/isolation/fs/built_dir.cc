#include "isolation/fs/built_dir.h"

#include <fcntl.h>
#include <sys/file.h>

#include "common/unique_fd.h"
#include "os/file.h"

namespace moat::isolation::fs {

Result<std::string> ensureBuiltDirectory(const std::string& parent, const std::string& name,
                                         const std::function<Status(const std::string&)>& build) {
  std::string dir = parent + "/" + name;
  // The marker sits beside the directory: inside, an environment would see it.
  std::string complete = parent + "/." + name + ".complete";
  if (os::exists(complete)) return dir;
  MOAT_TRY(os::makeDirs(parent, 0755));
  MOAT_ASSIGN(UniqueFd lock, os::open(parent + "/.lock", O_RDWR | O_CREAT, 0600));
  if (::flock(lock.get(), LOCK_EX) != 0) return Error::fromErrno("lock " + parent);
  if (os::exists(complete)) return dir;  // built meanwhile by another moat
  MOAT_TRY(os::removeTree(dir));
  MOAT_TRY(build(dir));
  MOAT_TRY(os::writeFile(complete, ""));
  return dir;
}

}  // namespace moat::isolation::fs
