#include "isolation/fs/template.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/path.h"
#include "isolation/fs/built_dir.h"
#include "os/file.h"
#include "os/tree.h"

namespace moat::isolation::fs {
namespace {

// Bump when the skeleton's content changes: a new version is built beside
// the old one.
constexpr const char* kHostSkeleton = "host-v2";

// /etc entries copied from the host: what programs need to run (the dynamic
// loader's cache, certificates, terminfo, alternatives), never credentials
// (shadow, ssh, ssl/private, sudoers) nor host identity (hostname, machine-id).
constexpr const char* kCopiedEtc[] = {
    "ld.so.cache", "ld.so.conf",     "ld.so.conf.d", "alternatives", "ssl/certs", "ssl/openssl.cnf",
    "os-release",  "debian_version", "localtime",    "timezone",     "terminfo",  "inputrc",
    "bash.bashrc", "shells",         "protocols",    "services",     "gai.conf",  "host.conf",
    "networks",    "mime.types",     "magic",        "magic.mime",   "python3",   "python3.11",
    "profile",     "nanorc",         "vim",          "perl",         "gitconfig", "mke2fs.conf",
};

constexpr const char* kNsswitch =
    "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
    "protocols: files\nservices: files\nethers: files\nrpc: files\n";

Status buildHostSkeleton(const std::string& dir) {
  MOAT_TRY(os::makeDir(dir, 0755));
  for (const char* sub : {"usr", "etc", "proc", "dev", "root", "home", "workspace", "tmp", "var", "var/tmp", "var/lib",
                          "var/cache", "var/log", "run", "opt", "mnt", "srv", "media"}) {
    MOAT_TRY(os::makeDir(os::joinPath(dir, sub), 0755));
  }
  ::chmod((dir + "/root").c_str(), 0700);
  ::chmod((dir + "/tmp").c_str(), 01777);
  ::chmod((dir + "/var/tmp").c_str(), 01777);
  // Merged-/usr hosts have /bin -> usr/bin etc.; mirror the links. Real
  // directories are bound read-only instead (see resolveTemplate).
  for (const char* top : {"bin", "sbin", "lib", "lib32", "lib64", "libx32"}) {
    std::string host = std::string("/") + top;
    if (os::isSymlink(host)) {
      MOAT_ASSIGN(std::string target, os::readLink(host));
      MOAT_TRY(os::symlink(target, dir + "/" + top));
    } else if (os::isDirectory(host)) {
      MOAT_TRY(os::makeDir(dir + "/" + top, 0755));
    }
  }
  std::string etc = dir + "/etc";
  MOAT_TRY(os::makeDir(etc + "/ssl", 0755));
  for (const char* name : kCopiedEtc) {
    std::string from = std::string("/etc/") + name;
    if (!os::exists(from)) continue;
    // Linked where only root could change the host's file anyway: the
    // environment sees it through a read-only lower layer, and a write
    // there is copied up into its own upper layer (the host's stays as is).
    // Only what any host user may read: root inside owns the skeleton's
    // files (the lower layer is id-mapped), so it must hold nothing more.
    MOAT_TRY(os::copyTree(from, etc + "/" + name, os::CopyMode::kLinkRootOwned, true));
  }
  bool haveBash = ::access("/usr/bin/bash", X_OK) == 0;
  MOAT_TRY(os::writeFile(etc + "/passwd", generatedPasswd(haveBash)));
  MOAT_TRY(os::writeFile(etc + "/group", generatedGroup()));
  MOAT_TRY(os::writeFile(etc + "/shadow", "", 0600));
  MOAT_TRY(os::writeFile(etc + "/nsswitch.conf", kNsswitch));
  MOAT_TRY(os::writeFile(etc + "/resolv.conf", "# moat: this environment has no network\n"));
  MOAT_TRY(os::writeFile(etc + "/hosts", "127.0.0.1 localhost\n::1 localhost\n"));
  MOAT_TRY(os::symlink("../proc/self/mounts", etc + "/mtab"));
  return {};
}

}  // namespace

std::string generatedPasswd(bool haveBash) {
  return std::string("root:x:0:0:root:/root:") + (haveBash ? "/bin/bash" : "/bin/sh") +
         "\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
}

std::string generatedGroup() { return "root:x:0:\ntty:x:5:\nusers:x:100:\nnogroup:x:65534:\n"; }

std::string namedTemplatesDir(const std::string& stateDir) { return stateDir + "/templates/images"; }

bool isTemplateName(const std::string& name) {
  if (name.empty() || name.size() > 64 || name == "host") return false;
  auto lowerOrDigit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lowerOrDigit(name[0])) return false;
  for (char c : name) {
    if (!lowerOrDigit(c) && c != '.' && c != '_' && c != ':' && c != '-') return false;
  }
  return true;
}

Result<Template> resolveTemplate(const std::string& spec, const std::string& stateDir) {
  Template t;
  t.name = spec;
  if (spec == "host") {
    MOAT_ASSIGN(t.lowerDir, ensureBuiltDirectory(stateDir + "/templates", kHostSkeleton, buildHostSkeleton));
    MOAT_ASSIGN(t.lower, os::open(t.lowerDir, O_PATH | O_DIRECTORY | O_NOFOLLOW));
    t.hostReadOnlyDirs.push_back("/usr");
    for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
      if (!os::isSymlink(top) && os::isDirectory(top)) t.hostReadOnlyDirs.push_back(top);
    }
    return t;
  }
  if (isTemplateName(spec)) {
    // Named: made by moatd; present only once complete. No symlink on the way.
    const std::string dir = namedTemplatesDir(stateDir) + "/" + spec;
    auto opened = os::open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW);
    if (!opened.ok()) {
      if (opened.error().sysErrno == ENOENT) {
        return Error::make(Code::kNotFound, "unknown template '" + spec + "' (moat template ls lists them)");
      }
      return opened.error();
    }
    t.lower = std::move(opened.value());
    t.lowerDir = dir;
    return t;
  }
  if (spec.empty() || spec.find('/') == std::string::npos) {
    return Error::make(Code::kInvalidArgument, "unknown template '" + spec +
                                                   "' (use 'host', a template's name or a root file system directory)");
  }
  MOAT_ASSIGN(t.lower, os::openHostPath(spec, "template directory"));
  MOAT_ASSIGN(struct stat st, os::statFd(t.lower.get()));
  if (!S_ISDIR(st.st_mode)) return Error::make(Code::kInvalidArgument, "template " + spec + " is not a directory");
  // Where it is, for the checks below: what was opened, not the name again.
  MOAT_ASSIGN(t.lowerDir, os::readLink("/proc/self/fd/" + std::to_string(t.lower.get())));
  if (t.lowerDir == "/") {
    return Error::make(Code::kInvalidArgument, "template / would show the whole host to the environment; use 'host'");
  }
  // The state directory holds the master token, keys and every environment's
  // files: no template may show it, from above or from inside.
  auto state = os::realPath(stateDir);
  std::string s = state.ok() ? state.value() : moat::normalizePath(stateDir);
  auto within = [](const std::string& inner, const std::string& outer) {
    return inner == outer || (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
                              (outer == "/" || inner[outer.size()] == '/'));
  };
  if (within(s, t.lowerDir) || within(t.lowerDir, s)) {
    return Error::make(Code::kInvalidArgument, "template " + spec + " overlaps moat's state directory " + s);
  }
  return t;
}

}  // namespace moat::isolation::fs
