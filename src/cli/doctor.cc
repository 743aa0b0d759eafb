// moat doctor: what this host gives moat, checked one by one, each with what
// to do about it (docs/INSTALL.md, "moat doctor").
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/microvm/backend.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "isolation/cgroup/layout.h"
#include "isolation/fs/storage_pool.h"
#include "isolation/proc/lxcfs.h"
#include "os/file.h"
#include "os/netlink.h"
#include "os/security.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kDoctorUsage = R"(usage: moat doctor [--json] [connection options]

Checks what this host gives moat, one line each: ok, warn (moat works
without it, with less), or fail (moatd or moat run cannot work), with what
to do about it. Kernel features (user namespaces, cgroups, overlayfs, btrfs,
seccomp, Landlock, veth), the programs moat runs (mkfs.btrfs, lxcfs, skopeo
and umoci, QEMU and a guest kernel, CRIU), how many idle environments the
kernel's task and open-file limits leave room for, and whether moatd answers. Exit 0
when nothing fails, 1 otherwise.

  --json   one JSON object: {"checks": [{"name","status","detail","fix"}]}
)";

struct Check {
  std::string name;
  std::string status;  // "ok", "warn", "fail"
  std::string detail;
  std::string fix;  // what to do ("" when ok)
};

// The paths moatd's template import runs (templates/importer.cc: fixed,
// not searched).
constexpr const char* kSkopeo = "/usr/bin/skopeo";
constexpr const char* kUmoci = "/usr/bin/umoci";

std::string kernelRelease() {
  struct utsname u;
  return ::uname(&u) == 0 ? u.release : "";
}

// A file system the kernel has, or can load as a module.
bool fileSystemAvailable(const std::string& name) {
  auto known = os::readFile("/proc/filesystems", 1 << 16);
  if (known.ok() && (known->find("\t" + name + "\n") != std::string::npos)) return true;
  return os::exists("/lib/modules/" + kernelRelease() + "/kernel/fs/" + name);
}

bool moduleAvailable(const std::string& name, const std::string& dir) {
  if (os::exists("/sys/module/" + name)) return true;
  std::string modules = "/lib/modules/" + kernelRelease();
  auto builtin = os::readFile(modules + "/modules.builtin", 1 << 20);
  if (builtin.ok() && builtin->find("/" + name + ".ko\n") != std::string::npos) return true;
  for (const char* suffix : {".ko", ".ko.xz", ".ko.zst", ".ko.gz"}) {
    if (os::exists(modules + "/kernel/" + dir + "/" + name + suffix)) return true;
  }
  return false;
}

Check kernel() { return {"kernel", "ok", "Linux " + kernelRelease(), ""}; }

Check privileges() {
  if (::geteuid() == 0) return {"root", "ok", "running as root", ""};
  return {"root", "warn", "not root: moatd and moat run need root, and some checks below see less",
          "run moat doctor as root (sudo moat doctor)"};
}

Check userNamespaces() {
  auto max = os::readFile("/proc/sys/user/max_user_namespaces", 64);
  if (!max.ok()) return {"user namespaces", "fail", "the kernel has none", "a kernel built with CONFIG_USER_NS"};
  if (std::stol(max.value()) <= 0) {
    return {"user namespaces", "fail", "user.max_user_namespaces is 0",
            "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/)"};
  }
  return {"user namespaces", "ok", "up to " + std::to_string(std::stol(max.value())), ""};
}

Check cgroups() {
  auto layout = isolation::cgroup::detectHostLayout();
  if (!layout.ok()) {
    return {"cgroups", "fail", layout.error().message(),
            "mount cgroup2 at /sys/fs/cgroup (or cgroup v1 cpu, memory and pids)"};
  }
  if (layout->version == isolation::cgroup::Version::kV2) {
    std::string parent = layout->v2Parent;
    std::string above = parent.substr(0, parent.rfind('/'));
    auto controllers = os::readFile(above + "/cgroup.controllers", 4096);
    std::string missing;
    for (const char* c : {"cpu", "memory", "pids"}) {
      if (!controllers.ok() || (" " + controllers.value()).find(std::string(" ") + c) == std::string::npos) {
        missing += std::string(missing.empty() ? "" : ", ") + c;
      }
    }
    if (!missing.empty()) {
      return {"cgroups", "fail", "cgroup v2 at " + parent + ", without " + missing + " in " + above,
              "enable them: echo +cpu +memory +pids > " + above + "/cgroup.subtree_control"};
    }
    return {"cgroups", "ok", "cgroup v2: environments under " + parent + " (cpu, memory, pids)", ""};
  }
  std::string detail = "cgroup v1:";
  for (const auto& [controller, dir] : layout->v1Parents) detail += " " + controller + " " + dir + ";";
  detail.pop_back();
  return {"cgroups", "ok", detail, ""};
}

Check overlay() {
  if (fileSystemAvailable("overlay") || fileSystemAvailable("overlayfs")) {
    return {"overlayfs", "ok", "environments' roots are overlays of their templates", ""};
  }
  return {"overlayfs", "fail", "the kernel has no overlay file system", "modprobe overlay"};
}

Check btrfs() {
  auto mkfs = isolation::fs::findMkfsBtrfs();  // as the storage pool finds it
  bool kernel = fileSystemAvailable("btrfs");
  if (kernel && mkfs.ok()) return {"btrfs", "ok", "the storage pool (quotas, snapshots): " + mkfs.value(), ""};
  if (!kernel) return {"btrfs", "fail", "the kernel has no btrfs: no storage pool", "modprobe btrfs"};
  return {"btrfs", "fail", "mkfs.btrfs not found: no storage pool", "apt-get install btrfs-progs"};
}

Check seccomp() {
  if (!os::seccompUserNotifAvailable()) {
    return {"seccomp", "fail", "no seccomp user notification (kernel 5.5 or later): no exec gate, no disk view",
            "a kernel of 5.5 or later with CONFIG_SECCOMP_FILTER"};
  }
  return {"seccomp", "ok", "filters with user notification", ""};
}

Check landlock() {
  int abi = os::landlockAbi();
  if (abi >= 6)
    return {"landlock", "ok", "ABI " + std::to_string(abi) + ": environments' signals and sockets scoped", ""};
  if (abi == 0) {
    return {"landlock", "warn", "no Landlock: one layer fewer (scoped signals and abstract sockets)",
            "a kernel with CONFIG_SECURITY_LANDLOCK and lsm=...,landlock"};
  }
  return {"landlock", "warn", "ABI " + std::to_string(abi) + ": scoping needs 6 (kernel 6.12)",
          "a kernel of 6.12 or later"};
}

Check veth() {
  if (::geteuid() == 0) {
    Status works = os::vethPairsWork();
    if (works.ok()) return {"egress", "ok", "veth pairs to moatd's egress proxy", ""};
    return {"egress", "fail", "no veth pairs (" + works.error().message() + "): environments get no network",
            "modprobe veth (or moatd --no-egress)"};
  }
  if (moduleAvailable("veth", "drivers/net")) return {"egress", "ok", "a veth driver (not tried: not root)", ""};
  return {"egress", "warn", "no veth module found (not tried: not root)", "run moat doctor as root"};
}

Check lxcfs() {
  auto config = isolation::proc::lxcfsConfigFromEnvironment();  // as moatd reads it (MOAT_LXCFS)
  auto path = isolation::proc::lxcfsBinary(config);
  if (path.ok()) return {"lxcfs", "ok", "/proc inside shows the environment's limits: " + path.value(), ""};
  return {"lxcfs", "warn", "not found: /proc/cpuinfo and /proc/meminfo inside show the host's",
          "apt-get install lxcfs"};
}

Check templates() {
  bool skopeo = ::access(kSkopeo, X_OK) == 0, umoci = ::access(kUmoci, X_OK) == 0;
  if (skopeo && umoci) return {"templates", "ok", "OCI images import (skopeo, umoci)", ""};
  return {"templates", "warn",
          std::string("moat template import needs ") + (!skopeo ? kSkopeo : "") + (!skopeo && !umoci ? " and " : "") +
              (!umoci ? kUmoci : ""),
          "apt-get install skopeo umoci"};
}

Check microvm() {
  auto host = backend::microvm::probeHost("auto");
  if (!host.available) return {"microvm", "warn", "isolation microvm unavailable: " + host.missing, ""};
  if (host.kvm) return {"microvm", "ok", "QEMU on KVM, guest kernel " + host.kernel.version, ""};
  return {"microvm", "warn", "QEMU on TCG (emulated, slow): " + host.accelWhy + "; guest kernel " + host.kernel.version,
          "a host with /dev/kvm (bare metal, or nested virtualisation enabled)"};
}

Check criu() {
  std::string path =
      os::executableIn("criu", {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"});
  const std::string why =
      "moat does not use it: a namespace environment's checkpoint is refused, as CRIU cannot carry its exec gate; "
      "microVMs checkpoint with QEMU (docs/PAUSE.md)";
  return {"criu", "ok", (path.empty() ? "not installed; " : path + " found; ") + why, ""};
}

uint64_t kernelNumber(const char* path) {
  auto text = os::readFile(path, 64);
  return text.ok() ? std::strtoull(text->c_str(), nullptr, 10) : 0;
}

// How many idle environments the host's own limits leave room for: each
// holds three tasks (its moat-init, the thread in it that answers `df` for
// the storage limit every environment has, and moatd's reader of it) of
// kernel.pid_max
// and kernel.threads-max beside what runs now, and four open files (one in
// moatd, three in the spawner) of the limit root may raise moatd's to
// (fs.nr_open). Memory is moatd's own bound (docs/API.md, capacity).
constexpr uint64_t kTasksPerEnvironment = 3;

Check scale() {
  const uint64_t pidMax = kernelNumber("/proc/sys/kernel/pid_max");
  const uint64_t threadsMax = kernelNumber("/proc/sys/kernel/threads-max");
  const uint64_t nrOpen = kernelNumber("/proc/sys/fs/nr_open");
  uint64_t running = 0;
  if (auto load = os::readFile("/proc/loadavg", 128); load.ok()) {
    auto slash = load->find('/');
    if (slash != std::string::npos) running = std::strtoull(load->c_str() + slash + 1, nullptr, 10);
  }
  const uint64_t tasks = std::min(pidMax, threadsMax);
  const uint64_t byTasks = tasks > running ? (tasks - running) / kTasksPerEnvironment : 0;
  const uint64_t byFiles = nrOpen / 4;
  const uint64_t room = std::min(byTasks, byFiles);
  const std::string detail = "room for about " + std::to_string(room) + " idle environments (kernel.pid_max " +
                             std::to_string(pidMax) + ", kernel.threads-max " + std::to_string(threadsMax) + ", " +
                             std::to_string(running) + " tasks now, fs.nr_open " + std::to_string(nrOpen) + ")";
  if (room >= 10000) return {"scale", "ok", detail, ""};
  return {"scale", "warn", detail,
          byTasks >= byFiles    ? "sysctl -w fs.nr_open=1048576 (each environment holds four open files)"
          : threadsMax < pidMax ? "sysctl -w kernel.threads-max=4194304 (each idle environment holds three tasks)"
                                : "sysctl -w kernel.pid_max=4194304 (each idle environment holds three tasks)"};
}

Check daemon(const ConnectionOptions& connection) {
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return {"moatd", "warn", client.error().message(), ""};
  const std::string where = client->endpoint().display();
  auto health = client->request("GET", "/healthz");
  if (!health.ok()) {
    return {"moatd", "warn", health.error().message(),
            "start it: systemctl start moatd (the package), or moatd as root"};
  }
  if (health->status != 200) {
    return {"moatd", "fail", where + " answers /healthz with " + std::to_string(health->status), ""};
  }
  auto who = client->request("GET", "/v1/environments");
  if (who.ok() && who->status == 401) {
    return {"moatd", "warn", "serving at " + where + ", but this token is refused",
            "a key of your own: moat keys create --for-user $USER (root; docs/INSTALL.md)"};
  }
  if (!who.ok() || who->status != 200) {
    return {"moatd", "warn", "serving at " + where + "; no token to use it",
            "a key of your own: moat keys create --for-user $USER (root; docs/INSTALL.md)"};
  }
  return {"moatd", "ok", "serving at " + where, ""};
}

}  // namespace

int doctorCommand(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  bool asJson = false;
  FlagReader flags(args);
  while (!flags.done()) {
    if (flags.current() == "-h" || flags.current() == "--help") {
      std::fputs(kDoctorUsage, stdout);
      return 0;
    }
    Status s = flags.next();
    if (!s.ok()) return reportFailure("moat doctor", s.error());
    bool matched = false;
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok()) return reportFailure("moat doctor", s.error());
    if (matched) continue;
    if (flags.name() != "--json") return reportFailure("moat doctor", usageError("unknown option " + flags.name()));
    asJson = true;
  }
  std::vector<Check> checks = {kernel(),    privileges(), userNamespaces(), cgroups(), overlay(),
                               btrfs(),     seccomp(),    landlock(),       veth(),    lxcfs(),
                               templates(), microvm(),    criu(),           scale(),   daemon(connection)};
  bool failed = false;
  json list = json::array();
  for (const Check& c : checks) {
    failed = failed || c.status == "fail";
    list.push_back({{"name", c.name}, {"status", c.status}, {"detail", c.detail}, {"fix", c.fix}});
  }
  if (asJson) {
    std::printf("%s\n", json{{"checks", list}}.dump(2).c_str());
    return failed ? 1 : 0;
  }
  for (const Check& c : checks) {
    std::printf("%-4s  %-15s  %s\n", c.status.c_str(), c.name.c_str(), c.detail.c_str());
    if (!c.fix.empty() && c.fix != c.detail) std::printf("      %-15s  -> %s\n", "", c.fix.c_str());
  }
  return failed ? 1 : 0;
}

}  // namespace moat::cli
