#include "os/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "os/statfs_notify.h"

namespace moat::os {

Result<UniqueFd> open(const std::string& path, int flags, mode_t mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return Error::fromErrno("open " + path);
  return UniqueFd(fd);
}

Result<std::string> readFile(const std::string& path, size_t maxBytes) {
  MOAT_ASSIGN(UniqueFd fd, open(path, O_RDONLY));
  std::string out;
  char buf[8192];
  while (out.size() < maxBytes) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno("read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  if (out.size() > maxBytes) out.resize(maxBytes);
  return out;
}

Result<std::string> readFileTail(const std::string& path, size_t maxBytes) {
  MOAT_ASSIGN(UniqueFd fd, open(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Error::fromErrno("stat " + path);
  const auto size = static_cast<size_t>(st.st_size);
  off_t at = static_cast<off_t>(size > maxBytes ? size - maxBytes : 0);
  std::string out;
  char buf[8192];
  while (out.size() < maxBytes) {
    ssize_t n = ::pread(fd.get(), buf, std::min(sizeof buf, maxBytes - out.size()), at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno("read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    at += n;
  }
  return out;
}

static Status writeAll(int fd, const std::string& data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno("write " + path);
    }
    off += static_cast<size_t>(n);
  }
  return {};
}

Status writeFile(const std::string& path, const std::string& data, mode_t mode) {
  MOAT_ASSIGN(UniqueFd fd, open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, mode));
  return writeAll(fd.get(), data, path);
}

Status overwriteFile(const std::string& path, const std::string& data, mode_t mode) {
  MOAT_ASSIGN(UniqueFd fd, open(path, O_WRONLY | O_CREAT | O_NOFOLLOW, mode));
  return writeAll(fd.get(), data, path);
}

Status writeExisting(const std::string& path, const std::string& data) {
  MOAT_ASSIGN(UniqueFd fd, open(path, O_WRONLY));
  return writeAll(fd.get(), data, path);
}

Status makeDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) == 0) return {};
  if (errno != EEXIST) return Error::fromErrno("mkdir " + path);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Error::fromErrno("mkdir " + path);  // e.g. a dead FUSE mount
  if (!S_ISDIR(st.st_mode)) return Error::fromErrno("mkdir " + path, ENOTDIR);
  return {};
}

Status makeDirs(const std::string& path, mode_t mode, mode_t parentMode) {
  if (path.empty() || path == "/") return {};
  if (parentMode == 0) parentMode = mode;
  // The whole path first: usually it exists, or only its last part is missing.
  if (::mkdir(path.c_str(), mode) == 0) return {};
  if (errno == EEXIST) return makeDir(path, mode);  // fails unless a directory
  if (errno != ENOENT) return Error::fromErrno("mkdir " + path);
  auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) MOAT_TRY(makeDirs(path.substr(0, slash), parentMode, parentMode));
  return makeDir(path, mode);
}

static Status removeTreeAt(int dirFd, const char* name, dev_t dev) {
  struct stat st;
  if (::fstatat(dirFd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return {};
    return Error::fromErrno(std::string("stat ") + name);
  }
  if (S_ISDIR(st.st_mode)) {
    if (st.st_dev != dev) return Error::make(Code::kBusy, std::string("mount point inside tree: ") + name);
    int fd = ::openat(dirFd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return Error::fromErrno(std::string("open ") + name);
    DIR* dir = ::fdopendir(fd);
    if (dir == nullptr) {
      ::close(fd);
      return Error::fromErrno(std::string("fdopendir ") + name);
    }
    Status status;
    while (struct dirent* entry = ::readdir(dir)) {
      if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
      Status s = removeTreeAt(fd, entry->d_name, dev);
      if (!s.ok() && status.ok()) status = s;
    }
    ::closedir(dir);
    if (!status.ok()) return status;
    if (::unlinkat(dirFd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
      return Error::fromErrno(std::string("rmdir ") + name);
    }
    return {};
  }
  if (::unlinkat(dirFd, name, 0) != 0 && errno != ENOENT) {
    return Error::fromErrno(std::string("unlink ") + name);
  }
  return {};
}

Status removeTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return Error::fromErrno("stat " + path);
  }
  return removeTreeAt(AT_FDCWD, path.c_str(), st.st_dev);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool isDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool isSymlink(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

Result<std::string> readLink(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  if (n < 0) return Error::fromErrno("readlink " + path);
  return std::string(buf, static_cast<size_t>(n));
}

Status symlink(const std::string& target, const std::string& linkPath) {
  if (::symlink(target.c_str(), linkPath.c_str()) != 0) {
    return Error::fromErrno("symlink " + linkPath + " -> " + target);
  }
  return {};
}

std::string executableIn(const std::string& name, std::initializer_list<const char*> dirs) {
  for (const char* dir : dirs) {
    std::string path = std::string(dir) + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

Status chown(const std::string& path, uid_t uid, gid_t gid) {
  if (::lchown(path.c_str(), uid, gid) != 0) return Error::fromErrno("chown " + path);
  return {};
}

Result<std::vector<std::string>> listDir(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return Error::fromErrno("opendir " + path);
  std::vector<std::string> names;
  while (struct dirent* entry = ::readdir(dir)) {
    if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
    names.emplace_back(entry->d_name);
  }
  ::closedir(dir);
  return names;
}

namespace {

// What a link would share with the source is what a copy made by root has.
bool linkable(const struct stat& st) {
  if (st.st_uid != 0 || st.st_gid != 0) return false;
  return S_ISLNK(st.st_mode) || (S_ISREG(st.st_mode) && (st.st_mode & (07000 | 022)) == 0);
}

}  // namespace

Status copyTree(const std::string& from, const std::string& to, CopyMode mode, bool worldReadableOnly) {
  struct stat st;
  if (::lstat(from.c_str(), &st) != 0) return Error::fromErrno("stat " + from);
  if (worldReadableOnly &&
      ((S_ISDIR(st.st_mode) && (st.st_mode & 05) != 05) || (S_ISREG(st.st_mode) && (st.st_mode & 04) == 0))) {
    return {};
  }
  // flags 0: a symlink is linked itself, never followed. Another file system,
  // the link count at its limit or a refused link fall back to a copy; any
  // other failure (`to` exists above all: a copy would write through it) is
  // an error.
  if (mode == CopyMode::kLinkRootOwned && linkable(st)) {
    if (::linkat(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), 0) == 0) return {};
    if (errno != EXDEV && errno != EMLINK && errno != EPERM) return Error::fromErrno("link " + from + " to " + to);
  }
  if (S_ISLNK(st.st_mode)) {
    MOAT_ASSIGN(std::string target, readLink(from));
    return symlink(target, to);
  }
  if (S_ISDIR(st.st_mode)) {
    MOAT_TRY(makeDir(to, st.st_mode & 07777));
    MOAT_ASSIGN(auto names, listDir(from));
    for (const auto& name : names) {
      Status s = copyTree(from + "/" + name, to + "/" + name, mode, worldReadableOnly);
      // Unreadable entries (e.g. a private key dir) are skipped, not copied.
      if (!s.ok() && s.error().sysErrno != EACCES) return s;
    }
    return {};
  }
  if (!S_ISREG(st.st_mode)) return {};
  MOAT_ASSIGN(std::string data, readFile(from, 64 << 20));
  return writeFile(to, data, st.st_mode & 0777);
}

Result<long> fileSystemType(const std::string& path) {
  struct statfs sfs;
  if (statfsUnwatched(path.c_str(), &sfs) != 0) return Error::fromErrno("statfs " + path);
  return static_cast<long>(sfs.f_type);
}

Result<uint64_t> freeBytesOf(const std::string& path) {
  struct statfs sfs;
  if (statfsUnwatched(path.c_str(), &sfs) != 0) return Error::fromErrno("statfs " + path);
  return static_cast<uint64_t>(sfs.f_bavail) * static_cast<uint64_t>(sfs.f_bsize);
}

std::string joinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  if (a.back() == '/') return b.front() == '/' ? a + b.substr(1) : a + b;
  return b.front() == '/' ? a + b : a + "/" + b;
}

Status changeDirectory(const std::string& path) {
  if (::chdir(path.c_str()) != 0) return Error::fromErrno("chdir " + path);
  return {};
}

Result<std::string> currentDirectory() {
  char buf[PATH_MAX];
  if (::getcwd(buf, sizeof buf) == nullptr) return Error::fromErrno("getcwd");
  return std::string(buf);
}

Result<std::string> realPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) return Error::fromErrno("resolve " + path);
  return std::string(resolved);
}

Result<std::string> selfDirectory() {
  MOAT_ASSIGN(std::string exe, readLink("/proc/self/exe"));
  auto slash = exe.rfind('/');
  if (slash == std::string::npos) return Error::make(Code::kInternal, "odd /proc/self/exe: " + exe);
  return exe.substr(0, slash);
}

namespace {

constexpr int kMaxShiftDepth = 512;

uint32_t shifted(uint32_t id, uint32_t fromBase, uint32_t toBase, uint32_t count) {
  return id >= fromBase && id - fromBase < count ? id - fromBase + toBase : id;
}

// Re-owns `name` in `dirFd` (the root itself when name is empty) and, for
// a directory, what it holds.
Status shiftEntry(int dirFd, const char* name, const std::string& shown, uint32_t fromBase, uint32_t toBase,
                  uint32_t count, int depth) {
  struct stat st;
  int flags = AT_SYMLINK_NOFOLLOW | (*name ? 0 : AT_EMPTY_PATH);
  if (::fstatat(dirFd, name, &st, flags) != 0) return Error::fromErrno("stat " + shown);
  uid_t uid = shifted(st.st_uid, fromBase, toBase, count);
  gid_t gid = shifted(st.st_gid, fromBase, toBase, count);
  if (uid != st.st_uid || gid != st.st_gid) {
    if (::fchownat(dirFd, name, uid, gid, flags) != 0) return Error::fromErrno("chown " + shown);
    // A chown clears set-id bits; the tree is nobody else's (a copy nothing
    // has mounted yet), and the name is not followed should it be a link.
    if (*name && S_ISREG(st.st_mode) && (st.st_mode & (S_ISUID | S_ISGID)) &&
        ::fchmodat(dirFd, name, st.st_mode & 07777, AT_SYMLINK_NOFOLLOW) != 0) {
      return Error::fromErrno("chmod " + shown);
    }
  }
  if (!S_ISDIR(st.st_mode)) return {};
  if (depth >= kMaxShiftDepth) {
    return Error::make(Code::kInvalidArgument,
                       "re-own " + shown + ": more than " + std::to_string(kMaxShiftDepth) + " directories deep");
  }
  int fd = *name ? ::openat(dirFd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : ::dup(dirFd);
  if (fd < 0) return Error::fromErrno("open " + shown);
  DIR* dir = ::fdopendir(fd);
  if (!dir) {
    int err = errno;
    ::close(fd);
    return Error::fromErrno("open " + shown, err);
  }
  Status result;
  while (result.ok()) {
    errno = 0;
    struct dirent* entry = ::readdir(dir);
    if (!entry) {
      if (errno != 0) result = Error::fromErrno("read " + shown);
      break;
    }
    if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
    result = shiftEntry(::dirfd(dir), entry->d_name, shown + "/" + entry->d_name, fromBase, toBase, count, depth + 1);
  }
  ::closedir(dir);
  return result;
}

}  // namespace

Status shiftOwnership(const std::string& root, uint32_t fromBase, uint32_t toBase, uint32_t count) {
  if (fromBase == toBase) return {};
  MOAT_ASSIGN(UniqueFd fd, open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
  return shiftEntry(fd.get(), "", root, fromBase, toBase, count, 0);
}

Status syncFileSystemOf(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::fromErrno("open " + path);
  if (::syncfs(fd.get()) != 0) return Error::fromErrno("sync the file system of " + path);
  return {};
}

}  // namespace moat::os
