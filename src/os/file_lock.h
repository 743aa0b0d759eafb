#pragma once

#include <string>

#include "common/result.h"
#include "common/unique_fd.h"

namespace moat::os {

// An exclusive flock on a file that exists only while it is held: taken
// without waiting, the file is removed when the lock is let go. A process
// that dies lets go with it (the kernel drops the flock), so a lock file
// left behind by a crash is free to take again.
class FileLock {
 public:
  FileLock() = default;
  FileLock(FileLock&&) = default;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  // Creates `path` if needed and locks it; an error with EWOULDBLOCK when
  // someone else holds it.
  static Result<FileLock> tryAcquire(const std::string& path);
  bool held() const { return fd_.valid(); }
  const std::string& path() const { return path_; }
  // The locked file's descriptor: a process that inherits a copy holds the
  // lock as long as it keeps it (flock belongs to the open file).
  int fd() const { return fd_.get(); }
  // Lets go of this copy only, keeping the file: the lock stays held by
  // whoever holds another copy of fd() (a process that outlives this one).
  void leaveToOtherHolders() {
    fd_.reset();
    path_.clear();
  }

 private:
  void release();
  std::string path_;
  UniqueFd fd_;
};

}  // namespace moat::os
