#include "init/file_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "common/unique_fd.h"
#include "os/file.h"
#include "os/statfs_notify.h"
#include "os/tree.h"

namespace moat::init {
namespace {

constexpr uint64_t kMaxRead = 8u << 20;  // per request; read larger files in ranges
// A listing's encoded size: names plus at most this much per entry, within
// a budget well below the protocol's frame limit.
constexpr uint64_t kListEntryOverhead = 64;
constexpr uint64_t kMaxListBytes = 12u << 20;

FileResult failure(const FileRequest& req, int err, const std::string& what) {
  FileResult r;
  r.tag = req.tag;
  r.err = err;
  r.message = what + " " + req.path + ": " + std::strerror(err);
  return r;
}

FileInfo infoFrom(const std::string& name, const struct stat& st) {
  FileInfo info;
  info.name = name;
  info.type = S_ISREG(st.st_mode) ? 'f' : S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : 'o';
  info.size = static_cast<uint64_t>(st.st_size);
  info.mode = st.st_mode & 07777;
  info.mtimeSec = static_cast<uint64_t>(st.st_mtim.tv_sec);
  return info;
}

Status makeParents(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return {};
  return os::makeDirs(path.substr(0, slash), 0755);
}

// File systems whose "regular files" are made up by the kernel as they are
// read: their size says nothing (0, or 18 for a symlink pointing there) and
// some never end (/proc/self/pagemap reads 256 GiB of this machine's page
// tables). The file API refuses them; `cat` through exec reads them with
// the exec's output limit.
bool madeUpByTheKernel(int fd, const char** name) {
  struct statfs fs;
  if (os::fstatfsUnwatched(fd, &fs) != 0) return false;  // moat-init's own: past the disk view

  struct Known {
    unsigned long magic;
    const char* name;
  };
  static constexpr Known kPseudo[] = {
      {PROC_SUPER_MAGIC, "procfs"},     {SYSFS_MAGIC, "sysfs"},           {DEBUGFS_MAGIC, "debugfs"},
      {TRACEFS_MAGIC, "tracefs"},       {SECURITYFS_MAGIC, "securityfs"}, {CGROUP_SUPER_MAGIC, "cgroupfs"},
      {CGROUP2_SUPER_MAGIC, "cgroup2"}, {BPF_FS_MAGIC, "bpffs"},          {EFIVARFS_MAGIC, "efivarfs"},
      {PSTOREFS_MAGIC, "pstore"},       {0x62656570, "configfs"},         {DEVPTS_SUPER_MAGIC, "devpts"},
  };
  for (const auto& k : kPseudo) {
    if (static_cast<unsigned long>(fs.f_type) == k.magic) {
      *name = k.name;
      return true;
    }
  }
  return false;
}

// Opens a path for the file API. moat-init is pid 1: /proc/self/fd/N,
// /proc/self/exe (and the same of other processes) would hand a client the
// pipes and terminals of other clients' commands and moat-init's own host
// binary, which no process inside reaches; those magic links are never
// followed (RESOLVE_NO_MAGICLINKS). Ordinary symlinks resolve inside the
// environment as for any process there.
Result<UniqueFd> openForApi(const FileRequest& req, int flags, mode_t mode = 0) {
  auto fd = os::openAt(AT_FDCWD, req.path, flags | O_NOCTTY | O_NONBLOCK, RESOLVE_NO_MAGICLINKS, mode);
  if (fd.ok()) return fd;
  Error e = fd.error();
  e.context = "open " + req.path;
  if (e.sysErrno == ELOOP && req.path.rfind("/proc/", 0) == 0) {
    e.context = "open " + req.path +
                ": a /proc link to a process's files (fd, exe, root, cwd), which the "
                "file API does not follow";
  }
  return e;
}

FileResult failure(const FileRequest& req, const Error& e) {
  FileResult r;
  r.tag = req.tag;
  r.err = e.sysErrno;
  r.message = e.message();
  return r;
}

// Regular files of an ordinary file system only: else a message saying
// what it is, for both reads and writes.
std::optional<FileResult> notAPlainFile(const FileRequest& req, int fd, const struct stat& st, const char* what) {
  if (S_ISDIR(st.st_mode)) return failure(req, EISDIR, what);
  if (!S_ISREG(st.st_mode)) {
    FileResult r = failure(req, EINVAL, what);
    r.message = std::string(what) + " " + req.path + ": not a regular file (a device, FIFO or socket)";
    return r;
  }
  const char* pseudo = nullptr;
  if (madeUpByTheKernel(fd, &pseudo)) {
    FileResult r = failure(req, EINVAL, what);
    r.message = std::string(what) + " " + req.path + ": a file of " + pseudo +
                ", made up by the kernel as it is read (no size, some never end): use exec (cat) instead";
    return r;
  }
  return std::nullopt;
}

FileResult doRead(const FileRequest& req) {
  auto opened = openForApi(req, O_RDONLY);
  if (!opened.ok()) return failure(req, opened.error());
  UniqueFd fd = std::move(opened.value());
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return failure(req, errno, "stat");
  if (auto refused = notAPlainFile(req, fd.get(), st, "read")) return *refused;
  uint64_t want = req.length == 0 ? kMaxRead : std::min<uint64_t>(req.length, kMaxRead);
  FileResult r;
  r.tag = req.tag;
  r.info = infoFrom(req.path, st);
  r.offset = req.offset;
  if (req.flags & kFileSkipHoles) {
    // From the next data to the hole after it: a sparse file's holes are
    // not sent as zeros. No data at or after the offset: nothing, at its end.
    if (req.offset > static_cast<uint64_t>(INT64_MAX)) return failure(req, EINVAL, "read");
    off_t data = ::lseek(fd.get(), static_cast<off_t>(req.offset), SEEK_DATA);
    if (data < 0 && errno == ENXIO) {
      r.offset = std::max<uint64_t>(req.offset, static_cast<uint64_t>(st.st_size));
      return r;
    }
    if (data < 0) return failure(req, errno, "seek (data) in");
    off_t hole = ::lseek(fd.get(), data, SEEK_HOLE);
    if (hole < 0) return failure(req, errno, "seek (hole) in");
    r.offset = static_cast<uint64_t>(data);
    // A hole punched between the two seeks: read on from the data as it
    // was (zeros now), never an empty answer that would look like the end.
    if (hole > data) want = std::min<uint64_t>(want, static_cast<uint64_t>(hole - data));
  }
  r.data.resize(want);
  size_t got = 0;
  while (got < want) {
    ssize_t n = ::pread(fd.get(), r.data.data() + got, want - got, static_cast<off_t>(r.offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return failure(req, errno, "read");
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  r.data.resize(got);
  return r;
}

FileResult doWrite(const FileRequest& req) {
  if (req.flags & kFileCreateParents) {
    Status s = makeParents(req.path);
    if (!s.ok()) return failure(req, s.error().sysErrno, "mkdir parents of");
  }
  // Not truncated on open: what it is is checked first (a FIFO, a device
  // or a kernel file is refused before anything is written to it).
  int flags = O_WRONLY | O_CREAT | ((req.flags & kFileAppend) ? O_APPEND : 0);
  auto opened = openForApi(req, flags, req.mode & 07777);
  if (!opened.ok()) return failure(req, opened.error());
  UniqueFd fd = std::move(opened.value());
  struct stat before;
  if (::fstat(fd.get(), &before) != 0) return failure(req, errno, "stat");
  if (auto refused = notAPlainFile(req, fd.get(), before, "write")) return *refused;
  if (!(req.flags & kFileAppend) && ::ftruncate(fd.get(), 0) != 0) return failure(req, errno, "truncate");
  size_t off = 0;
  while (off < req.data.size()) {
    ssize_t n = ::write(fd.get(), req.data.data() + off, req.data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return failure(req, errno, "write");
    }
    off += static_cast<size_t>(n);
  }
  FileResult r;
  r.tag = req.tag;
  struct stat st;
  if (::fstat(fd.get(), &st) == 0) r.info = infoFrom(req.path, st);
  return r;
}

FileResult doStat(const FileRequest& req) {
  struct stat st;
  if (::lstat(req.path.c_str(), &st) != 0) return failure(req, errno, "stat");
  FileResult r;
  r.tag = req.tag;
  r.info = infoFrom(req.path, st);
  return r;
}

FileResult doList(const FileRequest& req) {
  auto opened = openForApi(req, O_RDONLY | O_DIRECTORY);
  if (!opened.ok()) return failure(req, opened.error());
  DIR* dir = ::fdopendir(opened->get());
  if (dir == nullptr) return failure(req, errno, "list");
  opened->release();
  FileResult r;
  r.tag = req.tag;
  uint64_t bytes = 0;
  while (struct dirent* entry = ::readdir(dir)) {
    if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
    struct stat st;
    if (::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    // The answer is one frame: a directory too large for it is refused by
    // name, not sent as a frame moatd would never get.
    bytes += std::strlen(entry->d_name) + kListEntryOverhead;
    if (bytes > kMaxListBytes) {
      ::closedir(dir);
      return failure(req, E2BIG, "list (more than " + std::to_string(r.entries.size()) + " entries)");
    }
    r.entries.push_back(infoFrom(entry->d_name, st));
  }
  ::closedir(dir);
  return r;
}

FileResult doMkdir(const FileRequest& req) {
  // Parents as `mkdir -p` makes them (searchable, whatever the leaf's mode).
  Status s = (req.flags & kFileCreateParents) ? os::makeDirs(req.path, req.mode & 07777, 0755) : Status{};
  if (!s.ok()) return failure(req, s.error().sysErrno, "mkdir");
  if (!(req.flags & kFileCreateParents) && ::mkdir(req.path.c_str(), req.mode & 07777) != 0) {
    return failure(req, errno, "mkdir");
  }
  FileResult r;
  r.tag = req.tag;
  return r;
}

FileResult doRemove(const FileRequest& req) {
  Status s;
  if (req.flags & kFileRecursive) {
    s = os::removeTree(req.path);
  } else if (::unlinkat(AT_FDCWD, req.path.c_str(), 0) != 0) {
    if (errno != EISDIR || ::rmdir(req.path.c_str()) != 0) s = Error::fromErrno("remove");
  }
  if (!s.ok()) return failure(req, s.error().sysErrno ? s.error().sysErrno : EBUSY, "remove");
  FileResult r;
  r.tag = req.tag;
  return r;
}

FileResult doSync(const FileRequest& req) {
  Status s = os::syncFileSystemOf(req.path);
  if (!s.ok()) return failure(req, s.error().sysErrno ? s.error().sysErrno : EIO, "sync");
  FileResult r;
  r.tag = req.tag;
  return r;
}

FileResult doRename(const FileRequest& req) {
  if (::rename(req.path.c_str(), req.target.c_str()) != 0) return failure(req, errno, "rename");
  FileResult r;
  r.tag = req.tag;
  return r;
}

}  // namespace

FileResult runFileRequest(const FileRequest& request) {
  if (request.path.empty() || request.path.find('\0') != std::string::npos ||
      request.target.find('\0') != std::string::npos) {
    return failure(request, EINVAL, "path");
  }
  switch (request.op) {
    case FileOp::kRead:
      return doRead(request);
    case FileOp::kWrite:
      return doWrite(request);
    case FileOp::kStat:
      return doStat(request);
    case FileOp::kList:
      return doList(request);
    case FileOp::kMkdir:
      return doMkdir(request);
    case FileOp::kRemove:
      return doRemove(request);
    case FileOp::kRename:
      return doRename(request);
    case FileOp::kSync:
      return doSync(request);
    case FileOp::kPause:  // a guest's moat-init's (Supervisor), not a file's
    case FileOp::kResume:
    case FileOp::kTasks:
    case FileOp::kClock:
    case FileOp::kQuiesce:
    case FileOp::kChanges:
      return failure(request, EOPNOTSUPP, "a guest's own request outside a microVM guest:");
  }
  return failure(request, EINVAL, "operation");
}

}  // namespace moat::init
