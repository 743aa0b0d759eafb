#include "os/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace moat::os {

Result<FileLock> FileLock::tryAcquire(const std::string& path) {
  // The holder removes the file before it lets go: a lock taken on a file
  // that was removed meanwhile is no lock at all, so it is checked to still
  // be the file at `path` (and taken again if not).
  for (int attempt = 0; attempt < 16; ++attempt) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return Error::fromErrno("open " + path);
    UniqueFd owned(fd);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) return Error::fromErrno("lock " + path);
    struct stat opened {
    }, named{};
    if (::fstat(fd, &opened) != 0) return Error::fromErrno("stat " + path);
    if (::stat(path.c_str(), &named) == 0 && named.st_dev == opened.st_dev && named.st_ino == opened.st_ino) {
      FileLock lock;
      lock.path_ = path;
      lock.fd_ = std::move(owned);
      return lock;
    }
  }
  return Error::fromErrno("lock " + path + " (removed under us again and again)", EAGAIN);
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = std::move(other.fd_);
  }
  return *this;
}

FileLock::~FileLock() { release(); }

void FileLock::release() {
  if (!fd_.valid()) return;
  ::unlink(path_.c_str());  // while still held: nobody can have it meanwhile
  fd_.reset();
}

}  // namespace moat::os
