#include "isolation/cgroup/layout.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <sstream>
#include <string_view>
#include <vector>

#include "common/path.h"
#include "os/file.h"

namespace moat::isolation::cgroup {
namespace {

// Items between separators, as std::getline gives them: empty ones between
// two separators count, an empty last one does not. (No stream: this runs
// in every `moat run`, and a stream per line cost ~0.1 ms of it.)
std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  while (!s.empty()) {
    size_t end = s.find(sep);
    out.emplace_back(s.substr(0, end));
    if (end == std::string_view::npos) break;
    s.remove_prefix(end + 1);
  }
  return out;
}

struct CgroupMount {
  std::string root;  // root of the hierarchy visible at this mount
  std::string mountPoint;
  std::string fsType;                // "cgroup" or "cgroup2"
  std::vector<std::string> options;  // super options (controllers for v1)
};

std::vector<CgroupMount> parseMounts(const std::string& mountinfo) {
  std::vector<CgroupMount> mounts;
  for (const auto& line : split(mountinfo, '\n')) {
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    auto left = split(line.substr(0, dash), ' ');
    auto right = split(line.substr(dash + 3), ' ');
    if (left.size() < 5 || right.size() < 3) continue;
    if (right[0] != "cgroup" && right[0] != "cgroup2") continue;
    mounts.push_back({left[3], left[4], right[0], split(right[2], ',')});
  }
  return mounts;
}

// controller (or "" for the v2 hierarchy) -> path from /proc/self/cgroup.
std::map<std::string, std::string> parseProcCgroup(const std::string& text) {
  std::map<std::string, std::string> paths;
  for (const auto& line : split(text, '\n')) {
    auto first = line.find(':');
    auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    if (controllers.empty()) {
      paths[""] = path;
      continue;
    }
    for (const auto& c : split(controllers, ',')) paths[c] = path;
  }
  return paths;
}

// Directory of `cgroupPath` under a mount whose visible root is `root`.
std::string dirUnder(const CgroupMount& m, const std::string& cgroupPath) {
  std::string rel = cgroupPath;
  // Strip the mount's root only as a whole path prefix (/a/b is under /a,
  // /a/bc is not).
  if (m.root != "/" && rel.compare(0, m.root.size(), m.root) == 0 &&
      (rel.size() == m.root.size() || rel[m.root.size()] == '/')) {
    rel = rel.substr(m.root.size());
  }
  return moat::normalizePath(m.mountPoint + "/" + rel);
}

}  // namespace

Result<Layout> detectLayout(const std::string& mountinfo, const std::string& procCgroup,
                            const std::string& v2ParentOverride) {
  auto mounts = parseMounts(mountinfo);
  auto paths = parseProcCgroup(procCgroup);
  Layout layout;

  // v1 is used when the memory controller is bound to a v1 hierarchy: then
  // v2 cannot have it (a controller lives in one hierarchy at a time).
  bool v1Memory = false;
  for (const auto& m : mounts) {
    if (m.fsType != "cgroup") continue;
    for (const auto& o : m.options) v1Memory |= (o == "memory");
  }
  if (v1Memory) {
    layout.version = Version::kV1;
    for (const std::string controller : {"cpu", "memory", "pids"}) {
      for (const auto& m : mounts) {
        if (m.fsType != "cgroup") continue;
        bool has = false;
        for (const auto& o : m.options) has |= (o == controller);
        if (!has) continue;
        auto it = paths.find(controller);
        std::string current = it == paths.end() ? "/" : it->second;
        layout.v1Parents[controller] = os::joinPath(dirUnder(m, current), "moat");
        break;
      }
      if (!layout.v1Parents.count(controller)) {
        return Error::make(Code::kUnsupported,
                           "cgroup v1 controller '" + controller + "' is not mounted; moat needs cpu, memory and pids");
      }
    }
    // CPU accounting where cpuacct has a hierarchy apart from cpu (mounted
    // with cpu, the cpu directory already has it): optional, for usage only.
    // Not where it shares one with memory or pids (their directory would be
    // made twice) or cpuset (a new cpuset cgroup has no CPUs to join).
    for (const auto& m : mounts) {
      if (m.fsType != "cgroup") continue;
      bool acct = false, other = false;
      for (const auto& o : m.options) {
        acct |= (o == "cpuacct");
        other |= (o == "cpu" || o == "memory" || o == "pids" || o == "cpuset");
      }
      if (!acct || other) continue;
      auto it = paths.find("cpuacct");
      layout.v1Parents["cpuacct"] = os::joinPath(dirUnder(m, it == paths.end() ? "/" : it->second), "moat");
      break;
    }
    // cpuset, optional, where it has a hierarchy of its own: an environment
    // whose CPU limit is below the host's CPUs gets that many (cpus.h). Its
    // affinity follows (nproc), and so does LXCFS's /proc/cpuinfo and
    // /proc/stat: lxcfs 5.0.3 reads the CPU quota at the cpuset cgroup's
    // path, which without one is the host's.
    for (const auto& m : mounts) {
      if (m.fsType != "cgroup") continue;
      bool cpuset = false, other = false;
      for (const auto& o : m.options) {
        cpuset |= (o == "cpuset");
        other |= (o == "cpu" || o == "cpuacct" || o == "memory" || o == "pids");
      }
      if (!cpuset || other) continue;
      auto it = paths.find("cpuset");
      layout.v1Parents["cpuset"] = os::joinPath(dirUnder(m, it == paths.end() ? "/" : it->second), "moat");
      break;
    }
    // freezer, optional, where it has a hierarchy of its own: a pause
    // (Cgroup::freeze) moves the environment's processes there. Sharing
    // one with a limit would take them out from under it.
    for (const auto& m : mounts) {
      if (m.fsType != "cgroup") continue;
      bool freezer = false, other = false;
      for (const auto& o : m.options) {
        freezer |= (o == "freezer");
        other |= (o == "cpu" || o == "cpuacct" || o == "memory" || o == "pids" || o == "cpuset");
      }
      if (!freezer || other) continue;
      auto it = paths.find("freezer");
      layout.v1Parents["freezer"] = os::joinPath(dirUnder(m, it == paths.end() ? "/" : it->second), "moat");
      break;
    }
    return layout;
  }

  for (const auto& m : mounts) {
    if (m.fsType != "cgroup2") continue;
    layout.version = Version::kV2;
    layout.v2Parent =
        v2ParentOverride.empty() ? os::joinPath(m.mountPoint, "moat") : moat::normalizePath(v2ParentOverride);
    return layout;
  }
  return Error::make(Code::kUnsupported, "no cgroup file system is mounted");
}

Result<Layout> detectHostLayout() {
  MOAT_ASSIGN(std::string mountinfo, os::readFile("/proc/self/mountinfo", 4 << 20));
  MOAT_ASSIGN(std::string procCgroup, os::readFile("/proc/self/cgroup"));
  const char* override = std::getenv("MOAT_CGROUP_PARENT");
  return detectLayout(mountinfo, procCgroup, override ? override : "");
}

Status prepareParents(const Layout& layout) {
  if (layout.version == Version::kV1) {
    for (const auto& [controller, dir] : layout.v1Parents) {
      Status made = os::makeDirs(dir);
      // Accounting, CPU sets and pauses only: without them, usage has no
      // CPU time, limits no CPU set, and a pause says why it cannot be.
      if (!made.ok() && controller != "cpuacct" && controller != "cpuset" && controller != "freezer") return made;
      // A new v1 cpuset has no CPUs and no memory nodes: moat's parent takes
      // its own parent's, and each environment's is given its CPUs at create.
      if (made.ok() && controller == "cpuset") {
        std::string up = dir.substr(0, dir.rfind('/'));
        for (const std::string file : {"cpuset.cpus", "cpuset.mems"}) {
          auto mine = os::readFile(dir + "/" + file);
          auto theirs = os::readFile(up + "/" + file);
          if (mine.ok() && theirs.ok() && (mine->empty() || *mine == "\n")) {
            (void)os::writeExisting(dir + "/" + file, theirs.value());
          }
        }
      }
    }
    return {};
  }
  // Controllers must be enabled on every level from the mount down to the
  // parent; levels that hold processes cannot delegate, which is why the
  // default parent sits right under the mount.
  std::string parentOfParent = layout.v2Parent.substr(0, layout.v2Parent.rfind('/'));
  for (const std::string& dir : {parentOfParent, layout.v2Parent}) {
    MOAT_TRY(os::makeDirs(dir));
    MOAT_ASSIGN(std::string text, os::readFile(dir + "/cgroup.controllers"));
    std::istringstream words(text);
    std::vector<std::string> available{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    std::string enable;
    for (const std::string c : {"cpu", "memory", "pids"}) {
      if (std::find(available.begin(), available.end(), c) == available.end()) {
        return Error::make(Code::kUnsupported, "cgroup v2 controller '" + c + "' is not available in " + dir +
                                                   " (set MOAT_CGROUP_PARENT to a delegated cgroup)");
      }
      enable += "+" + c + " ";
    }
    Status s = os::writeExisting(dir + "/cgroup.subtree_control", enable);
    if (!s.ok()) {
      return Error{s.error().code, s.error().sysErrno,
                   "enable cpu, memory, pids in " + dir + "/cgroup.subtree_control"};
    }
  }
  return {};
}

}  // namespace moat::isolation::cgroup
