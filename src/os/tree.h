#pragma once

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

// Operations on a tree moat does not trust (an environment's files, a
// directory template, a volume's source): every path is resolved by
// openat2(2) from a directory descriptor the caller holds, with the
// RESOLVE_* flags the caller names, and what was opened is acted on through
// its descriptor. docs/SECURITY.md, "Host-side code over an environment's
// files".
namespace moat::os {

// RESOLVE_* combinations.
// Stays below dirFd and follows no symlink at all: for paths moat itself
// made (mount points, the writable layer's top).
constexpr uint64_t kResolveStrict = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

Result<UniqueFd> openAt(int dirFd, const std::string& path, int flags, uint64_t resolve, mode_t mode = 0);
Result<struct stat> statFd(int fd);
// What `name` in dirFd is, not following it if it is a symlink.
Result<struct stat> statAt(int dirFd, const std::string& name);
// The target of the symlink `name` in dirFd (at most PATH_MAX bytes), as data.
Result<std::string> readLinkAt(int dirFd, const std::string& name);
// The names in the directory dirFd is open on (not "." or ".."), sorted;
// at most maxNames (more: an error with code "too_large").
Result<std::vector<std::string>> listDirFd(int dirFd, size_t maxNames);
// The value of extended attribute `name` of what fd is open on (not
// O_PATH), at most 255 bytes; empty when it has none.
Result<std::string> xattrFd(int fd, const char* name);
// `bytes` from fd's current offset, fewer only at its end.
Result<std::string> readExactly(int fd, size_t bytes);
// Up to maxBytes from fd's current offset; truncated says there was more
// (one byte beyond maxBytes was read to know).
struct ReadBytes {
  std::string data;
  bool truncated = false;
};
Result<ReadBytes> readUpTo(int fd, size_t maxBytes);
// mkdirat: true when it made the directory, false when the name exists
// (whatever it is).
Result<bool> makeDirAt(int dirFd, const std::string& name, mode_t mode);
// The same, for a caller to whom an existing name is no failure.
Status makeDirectoryAt(int dirFd, const std::string& name, mode_t mode);
// A new regular file holding data (O_EXCL: never an existing one, nor a
// link), its mode despite the umask.
Status createFileAt(int dirFd, const std::string& name, mode_t mode, const std::string& data = "");
// A new symlink `name` in dirFd pointing at `target` (never replacing).
Status makeSymlinkAt(int dirFd, const std::string& name, const std::string& target);
// Changes the owner of what fd refers to (an O_PATH descriptor will do).
Status chownFd(int fd, uid_t uid, gid_t gid);
// Sets the mode of the directory fd refers to (despite the umask).
Status chmodDirectory(int dirFd, const std::string& name, mode_t mode);
// Removes `name` (not a directory) from dirFd; one that is not there is fine.
Status removeAt(int dirFd, const std::string& name);
// Makes `name` in dirFd a regular file holding data: written in place when
// it is new or a regular file of one link, else replaced by a temporary
// file renamed over it. Whatever else `name` was (a symlink, a hard link to
// another file, a FIFO) is replaced, never followed or written to.
Status replaceFileAt(int dirFd, const std::string& name, const std::string& data, mode_t mode);

// Opens a host path (O_PATH) that follows no symlink at all, and says where
// the first one it meets leads. For the sources of binds: a directory an
// environment was given read-write is one where root inside is host root
// (the bind is id-mapped), so a link it planted there is owned by root like
// any the host's own admin made, and nothing tells the two apart; a later
// bind through it would show the environment whatever it points at. `what`
// names the path in errors.
// flags/mode: O_PATH by default; moat cp opens what it reads or writes the
// same way.
Result<UniqueFd> openHostPath(const std::string& path, const std::string& what, int flags = O_PATH, mode_t mode = 0);

}  // namespace moat::os
