// Paths: the gate decides file actions on gate::normalizePath(path) (lexical:
// "/a/../b" is "/b"), moat-init then opens the path as sent, inside the
// environment's root. The two must name the same file, or a path rule
// ("deny /etc/**") could be walked around with dot segments or slashes.
// The same function (common/path.h) serves bind mount targets and state
// directories.
//
// Input: one path. Besides the lexical properties (absolute, idempotent, no
// empty or dot segments), the path is resolved by the kernel in a small
// directory tree made once under $TMPDIR, with openat2(RESOLVE_IN_ROOT |
// RESOLVE_NO_SYMLINKS): it cannot leave the tree, and with no symlinks in the
// tree the kernel's answer depends on the names alone. Whenever the path as
// sent opens, its normalized form must open the same inode. (Symlinks made
// inside an environment are resolved by the kernel within its root; the
// gate does not see them: docs/GATE.md.)
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "gate/permissions.h"
#include "os/file.h"

namespace {

[[noreturn]] void fail(const std::string& what) {
  __builtin_printf("path_resolution: %s\n", what.c_str());
  std::abort();
}

int rootFd = -1;
bool haveOpenat2 = true;

void makeTree() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/moat-fuzz-paths-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) fail("mkdtemp");
  for (const char* d : {"/a", "/a/b", "/a/b/c", "/a/x", "/d", "/d/a", "/..a", "/.b", "/e e"}) {
    ::mkdir((dir + d).c_str(), 0755);
  }
  for (const char* f : {"/f", "/a/f", "/a/b/f", "/d/a/f", "/...", "/a/b/c/%2e%2e"}) {
    int fd = ::open((dir + f).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);
  }
  rootFd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rootFd < 0) fail("open the tree");
  // The tree goes when the fuzzer exits: nothing in it is needed later.
  static std::string cleanup = dir;
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(cleanup, ignored);
  });
}

int resolve(const std::string& path, struct stat* st) {
  struct open_how how = {};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  int fd = static_cast<int>(::syscall(SYS_openat2, rootFd, path.c_str(), &how, sizeof how));
  if (fd < 0) {
    if (errno == ENOSYS) haveOpenat2 = false;
    return -errno;
  }
  int r = ::fstat(fd, st);
  ::close(fd);
  return r == 0 ? 0 : -EIO;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (rootFd < 0) makeTree();
  std::string path(reinterpret_cast<const char*>(data), size);
  path = path.substr(0, path.find('\0'));  // the API refuses NUL in paths

  std::string n = moat::gate::normalizePath(path);
  if (n.empty() || n[0] != '/') fail("not absolute: " + n);
  if (moat::gate::normalizePath(n) != n) fail("not idempotent");
  if (n.size() > 1 && n.back() == '/') fail("a trailing slash");
  if (n.find("//") != std::string::npos || n.find("/./") != std::string::npos || n.find("/../") != std::string::npos ||
      n == "/." || n == "/.." || (n.size() >= 2 && n.compare(n.size() - 2, 2, "/.") == 0) ||
      (n.size() >= 3 && n.compare(n.size() - 3, 3, "/..") == 0)) {
    fail("a dot or empty segment is left: " + n);
  }
  if (n.size() > path.size() + 1) fail("normalizing made the path longer");
  // The gate sees the same file for "/x" and "x": both are absolute to it.
  if (!path.empty() && path[0] != '/' && moat::gate::normalizePath("/" + path) != n) {
    fail("a relative path normalizes unlike its absolute form");
  }

  if (!haveOpenat2 || path.empty() || path[0] != '/') return 0;  // the API takes absolute paths only
  struct stat raw, normal;
  if (resolve(path, &raw) != 0) return 0;
  int r = resolve(n, &normal);
  if (r != 0) fail("the path opens but its normalized form does not (" + std::string(std::strerror(-r)) + ")");
  if (raw.st_ino != normal.st_ino || raw.st_dev != normal.st_dev)
    fail("the path and its normalized form are different files");
  return 0;
}
