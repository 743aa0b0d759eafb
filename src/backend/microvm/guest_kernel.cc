#include "backend/microvm/guest_kernel.h"

#include <dirent.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace moat::backend::microvm {
namespace {

// "kernel/fs/erofs/erofs.ko" -> "erofs" (the kernel's names use _ for -).
std::string moduleName(const std::string& path) {
  std::string base = path.substr(path.rfind('/') + 1);
  for (const char* suffix : {".ko.xz", ".ko.zst", ".ko.gz", ".ko"}) {
    const size_t n = std::strlen(suffix);
    if (base.size() > n && base.compare(base.size() - n, n, suffix) == 0) {
      base.resize(base.size() - n);
      break;
    }
  }
  std::replace(base.begin(), base.end(), '-', '_');
  return base;
}

GuestKernel kernelAt(const std::string& image) {
  GuestKernel k;
  k.image = image;
  const std::string base = image.substr(image.rfind('/') + 1);
  k.version = base.rfind("vmlinuz-", 0) == 0 ? base.substr(8) : "";
  k.modulesDir = "/lib/modules/" + k.version;
  return k;
}

}  // namespace

Result<GuestKernel> findGuestKernel() {
  if (const char* named = std::getenv("MOAT_GUEST_KERNEL"); named && *named) {
    if (::access(named, R_OK) != 0) return Error::fromErrno(std::string("MOAT_GUEST_KERNEL ") + named);
    return kernelAt(named);
  }
  std::vector<std::string> versions;
  if (DIR* d = ::opendir("/boot")) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, "vmlinuz-", 8) == 0) versions.emplace_back(e->d_name + 8);
    }
    ::closedir(d);
  }
  if (versions.empty()) {
    return Error::make(Code::kMissingDependency,
                       "no guest kernel: microVMs boot the host's distribution kernel (apt-get install "
                       "linux-image-cloud-amd64) or the one MOAT_GUEST_KERNEL names");
  }
  std::sort(versions.begin(), versions.end(),
            [](const std::string& a, const std::string& b) { return ::strverscmp(a.c_str(), b.c_str()) < 0; });
  return kernelAt("/boot/vmlinuz-" + versions.back());
}

const std::vector<std::string>& guestModules() {
  // virtio on the microvm machine's MMIO transport, the control port, the
  // root disk, the NIC and the file systems of the root.
  static const std::vector<std::string> modules = {"virtio_mmio", "virtio_console", "virtio_blk",
                                                   "virtio_net",  "erofs",          "overlay"};
  return modules;
}

Result<std::vector<std::string>> moduleLoadOrder(const std::string& modulesDep,
                                                 const std::vector<std::string>& wanted) {
  std::map<std::string, std::pair<std::string, std::vector<std::string>>> byName;  // name -> path, deps
  std::istringstream lines(modulesDep);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return Error::make(Code::kInvalidArgument, "modules.dep: no ':' in " + line);
    std::string path = line.substr(0, colon);
    std::vector<std::string> deps;
    std::istringstream words(line.substr(colon + 1));
    for (std::string dep; words >> dep;) deps.push_back(dep);
    byName[moduleName(path)] = {path, std::move(deps)};
  }
  std::vector<std::string> order;
  std::set<std::string> placed;
  // modules.dep lists every module a module needs, directly or not; each is
  // placed after its own.
  std::function<void(const std::string&, int)> place = [&](const std::string& path, int depth) {
    if (placed.count(path) || depth > 64) return;
    auto it = byName.find(moduleName(path));
    if (it != byName.end()) {
      for (const auto& dep : it->second.second) place(dep, depth + 1);
    }
    if (placed.insert(path).second) order.push_back(path);
  };
  for (const auto& name : wanted) {
    auto it = byName.find(name);
    if (it != byName.end()) place(it->second.first, 0);
  }
  return order;
}

}  // namespace moat::backend::microvm
