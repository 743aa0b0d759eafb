#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

// Plain file-system helpers with Result errors. Everything here works on
// host paths; nothing resolves paths inside an environment.
namespace moat::os {

Result<std::string> readFile(const std::string& path, size_t maxBytes = 1 << 20);
// The last maxBytes of a file (a log that grows).
Result<std::string> readFileTail(const std::string& path, size_t maxBytes);
Status writeFile(const std::string& path, const std::string& data, mode_t mode = 0644);
// Writes to an existing file (cgroup knobs, /proc files) without O_CREAT.
Status writeExisting(const std::string& path, const std::string& data);
// Writes `data` over the start of `path` (made with `mode` if missing; a
// symlink is not followed), truncating nothing: what lies past it stays.
// No block is freed, so a file system mounted with `discard` sends the disk
// no discard (one took up to ~3.5 ms here).
Status overwriteFile(const std::string& path, const std::string& data, mode_t mode = 0600);
// The directory and any missing parents; the parents get parentMode (0: mode).
Status makeDirs(const std::string& path, mode_t mode = 0755, mode_t parentMode = 0);
Status makeDir(const std::string& path, mode_t mode = 0755);  // EEXIST is fine
// Removes a tree without following symlinks and without crossing mounts.
// Writes to its disk what the file system holding `path` has of written
// data and metadata (syncfs).
Status syncFileSystemOf(const std::string& path);
Status removeTree(const std::string& path);
bool exists(const std::string& path);
bool isDirectory(const std::string& path);
// `name` in the first of `dirs` where it is executable (access X_OK); "" when
// in none. One lookup for every program moat runs by a fixed list of places.
std::string executableIn(const std::string& name, std::initializer_list<const char*> dirs);
bool isSymlink(const std::string& path);
Result<std::string> readLink(const std::string& path);
Status symlink(const std::string& target, const std::string& linkPath);
Status chown(const std::string& path, uid_t uid, gid_t gid);  // no symlink follow
// How copyTree makes each regular file and symlink.
enum class CopyMode {
  kCopy,  // new files with the same bytes and permission bits (less the umask), owned by the caller
  // A hard link to the same inode when only root can change it (owned by
  // root:root, no group/other write, no set-id bits) and it is on the same
  // file system; a copy otherwise. No inode is allocated for a link: on ext4
  // without a journal, after churn, each new inode here cost ~1 ms.
  kLinkRootOwned,
};
// Copies a file or tree (regular files, dirs, symlinks); other types skipped.
// worldReadableOnly: also skips what the host's unprivileged users could not
// read (a file without o+r, a directory without o+rx).
Status copyTree(const std::string& from, const std::string& to, CopyMode mode = CopyMode::kCopy,
                bool worldReadableOnly = false);
Result<std::vector<std::string>> listDir(const std::string& path);
Result<UniqueFd> open(const std::string& path, int flags, mode_t mode = 0);
// Returns statfs f_type of the file system holding path.
Result<long> fileSystemType(const std::string& path);
// The bytes an unprivileged writer may still write on path's file system.
Result<uint64_t> freeBytesOf(const std::string& path);
std::string joinPath(const std::string& a, const std::string& b);
Status changeDirectory(const std::string& path);
Result<std::string> currentDirectory();
// Canonical absolute path (symlinks resolved); the file must exist.
Result<std::string> realPath(const std::string& path);
// Re-owns the tree at `root` (symlinks not followed, the root included):
// every uid and gid in [fromBase, fromBase + count) moves by toBase -
// fromBase; other ids stay. Set-id bits survive (a chown clears them). For
// trees nobody else is using; at most 512 directories deep.
Status shiftOwnership(const std::string& root, uint32_t fromBase, uint32_t toBase, uint32_t count);
// Directory of the running executable.
Result<std::string> selfDirectory();

}  // namespace moat::os
