#pragma once

#include <map>
#include <string>

#include "common/result.h"

// Where moat creates cgroups on this host. Detected at run time: pure
// cgroup v2 (most hosts) or v1 controllers (hybrid hosts such as this one).
namespace moat::isolation::cgroup {

enum class Version { kV1, kV2 };

struct Layout {
  Version version = Version::kV2;
  // v2: the directory under which environment cgroups are created.
  std::string v2Parent;
  // v1: controller ("cpu", "memory", "pids", "cpuacct" where it is
  // mounted apart from cpu, "cpuset" where it has a hierarchy of its own)
  // -> parent directory.
  std::map<std::string, std::string> v1Parents;
};

// Pure function over the text of /proc/self/mountinfo and /proc/self/cgroup,
// so both layouts are unit-tested without the host having them.
// `v2ParentOverride` (MOAT_CGROUP_PARENT) replaces the default v2 parent.
Result<Layout> detectLayout(const std::string& mountinfo, const std::string& procCgroup,
                            const std::string& v2ParentOverride = "");

// Reads this process's files; honours MOAT_CGROUP_PARENT.
Result<Layout> detectHostLayout();

// Makes sure the parent directories exist and (v2) delegate cpu, memory and
// pids to their children.
Status prepareParents(const Layout& layout);

}  // namespace moat::isolation::cgroup
