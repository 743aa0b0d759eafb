#include "os/tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace moat::os {

Result<UniqueFd> openAt(int dirFd, const std::string& path, int flags, uint64_t resolve, mode_t mode) {
  struct open_how how;
  std::memset(&how, 0, sizeof how);
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  if (flags & (O_CREAT | O_TMPFILE)) how.mode = mode;
  how.resolve = resolve;
  // EAGAIN: a rename somewhere in the file system raced a ".." of the
  // resolution (RESOLVE_IN_ROOT and RESOLVE_BENEATH check for it). Tried
  // again a few times, not for ever: whoever keeps renaming (an environment
  // walking its own links in a loop) must not hold the caller.
  for (int tries = 0;; ++tries) {
    long fd = ::syscall(SYS_openat2, dirFd, path.c_str(), &how, sizeof how);
    if (fd >= 0) return UniqueFd(static_cast<int>(fd));
    if (errno == EINTR || (errno == EAGAIN && tries < 16)) continue;
    return Error::fromErrno("open " + path);
  }
}

Result<struct stat> statFd(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error::fromErrno("fstat");
  return st;
}

Result<struct stat> statAt(int dirFd, const std::string& name) {
  struct stat st;
  if (::fstatat(dirFd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Error::fromErrno("stat " + name);
  return st;
}

Result<std::string> readLinkAt(int dirFd, const std::string& name) {
  char target[PATH_MAX];
  ssize_t n = ::readlinkat(dirFd, name.c_str(), target, sizeof target);
  if (n < 0) return Error::fromErrno("readlink " + name);
  return std::string(target, static_cast<size_t>(n));
}

Result<std::vector<std::string>> listDirFd(int dirFd, size_t maxNames) {
  // fdopendir takes the descriptor over: give it its own, at the start.
  MOAT_ASSIGN(UniqueFd own, openAt(dirFd, ".", O_RDONLY | O_DIRECTORY, kResolveStrict));
  DIR* dir = ::fdopendir(own.get());
  if (dir == nullptr) return Error::fromErrno("opendir");
  (void)own.release();
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (names.size() >= maxNames) {
      ::closedir(dir);
      return Error::make(Code::kTooLarge, "more than " + std::to_string(maxNames) + " names in one directory");
    }
    names.emplace_back(e->d_name);
  }
  const int err = errno;
  ::closedir(dir);
  if (err != 0) return Error::fromErrno("readdir", err);
  std::sort(names.begin(), names.end());
  return names;
}

Result<std::string> xattrFd(int fd, const char* name) {
  char value[256];
  ssize_t n = ::fgetxattr(fd, name, value, sizeof value);
  if (n < 0) {
    if (errno == ENODATA || errno == ENOTSUP) return std::string();
    return Error::fromErrno(std::string("getxattr ") + name);
  }
  return std::string(value, static_cast<size_t>(n));
}

Result<std::string> readExactly(int fd, size_t bytes) {
  std::string out;
  char buf[65536];
  while (out.size() < bytes) {
    ssize_t n = ::read(fd, buf, std::min(sizeof buf, bytes - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::fromErrno("read");
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Result<ReadBytes> readUpTo(int fd, size_t maxBytes) {
  // One byte more than asked says whether there was more.
  MOAT_ASSIGN(std::string data, readExactly(fd, maxBytes + 1));
  ReadBytes out;
  out.truncated = data.size() > maxBytes;
  if (out.truncated) data.resize(maxBytes);
  out.data = std::move(data);
  return out;
}

Result<bool> makeDirAt(int dirFd, const std::string& name, mode_t mode) {
  if (::mkdirat(dirFd, name.c_str(), mode) == 0) return true;
  if (errno == EEXIST) return false;
  return Error::fromErrno("mkdir " + name);
}

Status makeDirectoryAt(int dirFd, const std::string& name, mode_t mode) {
  MOAT_ASSIGN(bool made, makeDirAt(dirFd, name, mode));
  (void)made;
  return {};
}

static Status writeAllTo(int fd, const std::string& data, const std::string& name);

Status createFileAt(int dirFd, const std::string& name, mode_t mode, const std::string& data) {
  int fd = ::openat(dirFd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return Error::fromErrno("create " + name);
  UniqueFd file(fd);
  if (::fchmod(fd, mode) != 0) return Error::fromErrno("chmod " + name);
  return writeAllTo(fd, data, name);
}

Status makeSymlinkAt(int dirFd, const std::string& name, const std::string& target) {
  if (::symlinkat(target.c_str(), dirFd, name.c_str()) != 0) return Error::fromErrno("symlink " + name);
  return {};
}

Status chownFd(int fd, uid_t uid, gid_t gid) {
  if (::fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return Error::fromErrno("chown");
  return {};
}

Status chmodDirectory(int dirFd, const std::string& name, mode_t mode) {
  MOAT_ASSIGN(UniqueFd dir, openAt(dirFd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, kResolveStrict));
  if (::fchmod(dir.get(), mode) != 0) return Error::fromErrno("chmod " + name);
  return {};
}

Status removeAt(int dirFd, const std::string& name) {
  if (::unlinkat(dirFd, name.c_str(), 0) != 0 && errno != ENOENT) return Error::fromErrno("remove " + name);
  return {};
}

static Status writeAllTo(int fd, const std::string& data, const std::string& name) {
  for (size_t off = 0; off < data.size();) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error::fromErrno("write " + name);
    off += static_cast<size_t>(n);
  }
  return {};
}

Status replaceFileAt(int dirFd, const std::string& name, const std::string& data, mode_t mode) {
  // In place when `name` is new or a regular file no other name shares (a
  // temporary file and a rename cost twice as much in an overlay): never
  // through a link (O_NOFOLLOW), a FIFO (O_NONBLOCK, then the type) or
  // a hard link to another file (its count).
  int fd = ::openat(dirFd, name.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
  if (fd >= 0) {
    UniqueFd file(fd);
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1) {
      if (::ftruncate(fd, 0) != 0) return Error::fromErrno("truncate " + name);
      return writeAllTo(fd, data, name);
    }
  } else if (errno != ELOOP && errno != ENXIO && errno != EISDIR) {
    return Error::fromErrno("open " + name);
  }
  unsigned char random[6];
  if (::getrandom(random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) {
    return Error::fromErrno("getrandom");
  }
  std::string tmp = ".moat-" + name + "-";
  for (unsigned char c : random) tmp += "0123456789abcdef"[c & 15];
  int tmpFd = ::openat(dirFd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (tmpFd < 0) return Error::fromErrno("create " + tmp);
  UniqueFd file(tmpFd);
  auto fail = [&](const std::string& what) {
    Error e = Error::fromErrno(what);
    ::unlinkat(dirFd, tmp.c_str(), 0);
    return e;
  };
  if (!writeAllTo(file.get(), data, tmp).ok()) return fail("write " + tmp);
  if (::fchmod(file.get(), mode) != 0) return fail("chmod " + tmp);
  if (::renameat(dirFd, tmp.c_str(), dirFd, name.c_str()) != 0) return fail("rename " + tmp + " to " + name);
  return {};
}

Result<UniqueFd> openHostPath(const std::string& path, const std::string& what, int flags, mode_t mode) {
  if (path.empty() || path[0] != '/') return Error::make(Code::kInvalidArgument, what + " must be an absolute path");
  auto fd = openAt(AT_FDCWD, path, flags, RESOLVE_NO_SYMLINKS, mode);
  if (fd.ok()) return fd;
  if (fd.error().sysErrno == ENOENT) {
    return Error{Code::kNotFound, ENOENT, what + " " + path + " does not exist"};
  }
  if (fd.error().sysErrno != ELOOP) return Error{fd.error().code, fd.error().sysErrno, what + " " + path};
  // (ELOOP: a symlink on the way, or the last component one.)
  // Which component is the link, and where it leads, for the message.
  std::string walked;
  for (size_t i = 1; i <= path.size();) {
    size_t j = std::min(path.find('/', i), path.size());
    walked = path.substr(0, j);
    i = j + 1;
    struct stat st;
    if (::lstat(walked.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = ::readlink(walked.c_str(), target, sizeof target);
      std::string to = n > 0 ? std::string(target, static_cast<size_t>(n)) : "?";
      return Error{Code::kUntrustedPath, ELOOP,
                   what + " " + path + ": " + walked + " is a symlink (to " + to +
                       "); moat follows none there, as an environment given that directory may have made it: "
                       "name the path it leads to"};
    }
  }
  return Error{Code::kUntrustedPath, ELOOP, what + " " + path + " passes through a symlink; name the path it leads to"};
}

}  // namespace moat::os
