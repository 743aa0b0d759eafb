#include "isolation/fs/helper_root.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

#include "os/file.h"
#include "os/tree.h"

namespace moat::isolation::fs {
namespace {

struct Bind {
  std::string path;  // real, absolute
  int fd;
  bool writable;
};

struct Link {
  std::string path;
  std::string target;
};

bool beneath(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

// The directories leading to `path` (absolute) in the root, made as needed.
Status makeParents(int root, const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    MOAT_TRY(os::makeDirectoryAt(root, path.substr(1, slash - 1), 0755));
  }
  return {};
}

}  // namespace

Result<HelperRoot> HelperRoot::make(const std::vector<Entry>& entries, const std::string& attachAt) {
  if (!os::isDirectory(attachAt) || os::isSymlink(attachAt)) {
    return Error::make(Code::kInvalidArgument, attachAt + ": not a directory to attach a root on");
  }
  std::vector<Bind> binds;
  std::vector<Link> links;
  for (const auto& entry : entries) {
    if (entry.path.empty() || entry.path[0] != '/') {
      return Error::make(Code::kInvalidArgument, "not an absolute path: " + entry.path);
    }
    MOAT_ASSIGN(std::string real, os::realPath(entry.path));
    if (real != entry.path && os::isSymlink(entry.path)) {
      const std::string dir = entry.path.substr(0, entry.path.rfind('/'));
      auto realDir = os::realPath(dir.empty() ? "/" : dir);
      if (realDir.ok() && realDir.value() == (dir.empty() ? "/" : dir)) {
        MOAT_ASSIGN(std::string target, os::readLink(entry.path));
        links.push_back({entry.path, target});
      }
    }
    binds.push_back({real, entry.fd, entry.writable});
  }
  // A path beneath another one bound is already there.
  std::sort(binds.begin(), binds.end(), [](const Bind& a, const Bind& b) { return a.path < b.path; });
  std::vector<Bind> kept;
  for (auto& bind : binds) {
    if (bind.path == "/") return Error::make(Code::kInvalidArgument, "a helper's root cannot hold all of the host's");
    if (!kept.empty() && beneath(bind.path, kept.back().path)) continue;
    kept.push_back(bind);
  }
  HelperRoot root;
  MOAT_ASSIGN(root.root_, os::newMount("tmpfs", {{"mode", "0755"}, {"size", "256k"}, {"nr_inodes", "1024"}},
                                       {.readOnly = false, .noSuid = true, .noDev = true, .noExec = true}));
  const int top = root.root_.get();
  for (const auto& bind : kept) {
    MOAT_TRY(makeParents(top, bind.path));
    const std::string name = bind.path.substr(1);
    MOAT_ASSIGN(struct stat st, os::statFd(bind.fd));
    if (S_ISDIR(st.st_mode)) {
      MOAT_TRY(os::makeDirectoryAt(top, name, 0755));
    } else {
      MOAT_TRY(os::createFileAt(top, name, 0444));
    }
    MOAT_ASSIGN(UniqueFd target, os::openAt(top, name, O_PATH, os::kResolveStrict));
    MOAT_ASSIGN(UniqueFd tree, os::cloneTree(bind.fd, false));
    const bool device = S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode);
    MOAT_TRY(os::setMountAttrs(
        tree.get(),
        {.readOnly = !bind.writable, .noSuid = true, .noDev = !device, .noExec = false, .makePrivate = true}, false));
    root.attach_.push_back({tree.get(), target.get()});
    root.held_.push_back(std::move(tree));
    root.held_.push_back(std::move(target));
  }
  for (const auto& link : links) {
    if (std::any_of(kept.begin(), kept.end(), [&](const Bind& b) { return beneath(link.path, b.path); })) continue;
    MOAT_TRY(makeParents(top, link.path));
    MOAT_TRY(os::makeSymlinkAt(top, link.path.substr(1), link.target));
  }
  MOAT_TRY(os::makeDirectoryAt(top, "proc", 0555));
  MOAT_ASSIGN(root.procAt_, os::openAt(top, "proc", O_PATH | O_DIRECTORY, os::kResolveStrict));
  MOAT_TRY(os::setMountAttrs(top, {.readOnly = true, .noSuid = true, .noDev = true, .noExec = true}, false));
  root.attachAt_ = attachAt;
  return root;
}

os::RootPlan HelperRoot::plan() const {
  return {root_.get(), attachAt_.c_str(), attach_.data(), attach_.size(), procAt_.get()};
}

}  // namespace moat::isolation::fs
