#include "isolation/cgroup/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>

#include "isolation/cgroup/cpus.h"
#include "os/file.h"

namespace moat::isolation::cgroup {
namespace {

uint64_t counterFrom(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  uint64_t v;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

}  // namespace

Cgroup::Cgroup(Layout layout, std::vector<std::string> dirs) : layout_(std::move(layout)), dirs_(std::move(dirs)) {
  for (const auto& d : dirs_) addFiles(d);
}

void Cgroup::addFiles(const std::string& dir) {
  procsFiles_.push_back(dir + "/cgroup.procs");
  joinFiles_.push_back(dir + (layout_.version == Version::kV1 ? "/tasks" : "/cgroup.procs"));
}

Cgroup::Cgroup(Cgroup&& other) noexcept
    : layout_(std::move(other.layout_)),
      name_(std::move(other.name_)),
      dirs_(std::move(other.dirs_)),
      procsFiles_(std::move(other.procsFiles_)),
      joinFiles_(std::move(other.joinFiles_)),
      cpuacct_(other.cpuacct_) {
  other.dirs_.clear();
}

Cgroup::~Cgroup() { (void)remove(); }

Result<Cgroup> Cgroup::create(const Layout& layout, const std::string& name, const Limits& limits) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    return Error::make(Code::kInvalidArgument, "bad cgroup name: " + name);
  }
  std::vector<std::string> dirs;
  if (layout.version == Version::kV2) {
    dirs.push_back(layout.v2Parent + "/" + name);
  } else {
    for (const std::string c : {"cpu", "memory", "pids"}) {
      dirs.push_back(layout.v1Parents.at(c) + "/" + name);
    }
  }
  Cgroup cg(layout, {});
  cg.name_ = name;
  for (const auto& d : dirs) {
    if (::mkdir(d.c_str(), 0755) != 0) return Error::fromErrno("create cgroup " + d);
    cg.dirs_.push_back(d);  // from here on, the destructor removes it
    cg.addFiles(d);
  }
  // Joined for its accounting only (no limit): what usage() reports as CPU.
  // Best effort: a host that does not let moat make it runs without.
  if (auto acct = layout.v1Parents.find("cpuacct"); layout.version == Version::kV1 && acct != layout.v1Parents.end()) {
    std::string d = acct->second + "/" + name;
    if (::mkdir(d.c_str(), 0755) == 0) {
      cg.dirs_.push_back(d);
      cg.addFiles(d);
      cg.cpuacct_ = true;
    }
  }
  if (auto set = layout.v1Parents.find("cpuset");
      layout.version == Version::kV1 && set != layout.v1Parents.end() && !limits.cpuSet.empty()) {
    std::string d = set->second + "/" + name;
    if (::mkdir(d.c_str(), 0755) == 0) {
      // A new cpuset has no memory nodes: the parent's; then its CPUs. One
      // that cannot be given both is not joined (nothing could join it).
      auto mems = os::readFile(set->second + "/cpuset.mems");
      if (mems.ok() && os::writeExisting(d + "/cpuset.mems", mems.value()).ok() &&
          os::writeExisting(d + "/cpuset.cpus", formatCpuList(limits.cpuSet)).ok()) {
        cg.dirs_.push_back(d);
        cg.addFiles(d);
      } else {
        ::rmdir(d.c_str());
      }
    }
  }
  MOAT_TRY(cg.applyLimits(limits));
  return cg;
}

Result<Cgroup> Cgroup::open(const Layout& layout, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    return Error::make(Code::kInvalidArgument, "bad cgroup name: " + name);
  }
  Cgroup cg(layout, {});
  cg.name_ = name;
  auto add = [&](const std::string& dir, bool needed) -> Status {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      if (needed) return Error::make(Code::kNotFound, "no cgroup " + dir);
      return {};
    }
    cg.dirs_.push_back(dir);
    cg.addFiles(dir);
    return {};
  };
  if (layout.version == Version::kV2) {
    MOAT_TRY(add(layout.v2Parent + "/" + name, true));
    return cg;
  }
  for (const std::string c : {"cpu", "memory", "pids"}) MOAT_TRY(add(layout.v1Parents.at(c) + "/" + name, true));
  if (auto acct = layout.v1Parents.find("cpuacct"); acct != layout.v1Parents.end()) {
    const size_t before = cg.dirs_.size();
    MOAT_TRY(add(acct->second + "/" + name, false));
    cg.cpuacct_ = cg.dirs_.size() > before;
  }
  if (auto set = layout.v1Parents.find("cpuset"); set != layout.v1Parents.end()) {
    MOAT_TRY(add(set->second + "/" + name, false));
  }
  return cg;
}

std::vector<pid_t> idsIn(const std::string& file) {
  std::vector<pid_t> ids;
  auto text = os::readFile(file, 1 << 20);
  if (!text.ok()) return ids;
  std::istringstream lines(text.value());
  for (long id; lines >> id;) {
    if (id > 0) ids.push_back(static_cast<pid_t>(id));
  }
  return ids;
}

std::vector<pid_t> Cgroup::processes() const {
  return procsFiles_.empty() ? std::vector<pid_t>{} : idsIn(procsFiles_[0]);
}

std::vector<KnobWrite> limitWrites(Version version, const Limits& limits) {
  const bool v2 = version == Version::kV2;
  std::vector<KnobWrite> writes;
  if (limits.cpus > 0) {
    // Within one period an environment may run on every core until its
    // quota is spent: with the kernel's usual 100 ms, a 1-CPU environment
    // on 2 cores holds both for 50 ms at a time, and everyone else waits
    // that long. 10 ms keeps the burst short (a neighbour's exec p99 under
    // a fork bomb: ~60 ms -> ~15 ms; docs/BENCHMARKS.md, "Exhaustion").
    // The kernel's smallest quota is 1 ms: small fractions get a longer
    // period (0.01 CPU: 1 ms every 100 ms).
    constexpr double kPeriodUs = 10000, kMinQuotaUs = 1000, kMaxPeriodUs = 100000;
    double period = kPeriodUs;
    if (limits.cpus * period < kMinQuotaUs) period = std::min(kMaxPeriodUs, std::ceil(kMinQuotaUs / limits.cpus));
    auto periodText = std::to_string(static_cast<uint64_t>(period));
    auto quota = std::to_string(static_cast<uint64_t>(std::llround(limits.cpus * period)));
    if (v2) {
      writes.push_back({"", "cpu.max", quota + " " + periodText});
    } else {
      writes.push_back({"cpu", "cpu.cfs_period_us", periodText});
      writes.push_back({"cpu", "cpu.cfs_quota_us", quota});
    }
  }
  if (limits.memoryBytes > 0) {
    std::string bytes = std::to_string(limits.memoryBytes);
    // No swap: a memory limit that can spill to swap does not hold.
    if (v2) {
      writes.push_back({"", "memory.max", bytes});
      writes.push_back({"", "memory.swap.max", "0", true});
    } else {
      writes.push_back({"memory", "memory.limit_in_bytes", bytes});
      writes.push_back({"memory", "memory.memsw.limit_in_bytes", bytes, true});
      writes.push_back({"memory", "memory.swappiness", "0", true});
    }
  }
  if (limits.pids > 0) {
    writes.push_back({v2 ? "" : "pids", "pids.max", std::to_string(limits.pids)});
  }
  return writes;
}

Status Cgroup::applyLimits(const Limits& limits) {
  for (const auto& w : limitWrites(layout_.version, limits)) {
    std::string dir = dirs_[0];
    if (layout_.version == Version::kV1)
      dir = w.controller == "cpu" ? dirs_[0] : w.controller == "memory" ? dirs_[1] : dirs_[2];
    std::string path = dir + "/" + w.file;
    Status written = os::writeExisting(path, w.value);
    // An optional knob this kernel does not have (swap accounting off).
    if (!written.ok() && w.optional && written.error().sysErrno == ENOENT) continue;
    MOAT_TRY(written);
  }
  return {};
}

Result<UniqueFd> Cgroup::openDirectory() const {
  if (layout_.version != Version::kV2) return Error::make(Code::kUnsupported, "cgroup v1 has no dir fd");
  return os::open(dirs_[0], O_RDONLY | O_DIRECTORY);
}

Usage usageFrom(Version version, const UsageFiles& files) {
  const bool v2 = version == Version::kV2;
  auto number = [](const std::optional<std::string>& text) -> uint64_t {
    return text ? std::strtoull(text->c_str(), nullptr, 10) : 0;
  };
  Usage usage;
  if (files.cpu) usage.cpuUsec = v2 ? counterFrom(*files.cpu, "usage_usec") : number(files.cpu) / 1000;
  usage.memoryBytes = number(files.memory);
  usage.pids = number(files.pids);
  if (files.memoryEvents) usage.oomKills = counterFrom(*files.memoryEvents, "oom_kill");
  return usage;
}

Usage Cgroup::usage() const {
  if (dirs_.empty()) return {};
  const bool v2 = layout_.version == Version::kV2;
  auto read = [](const std::string& path) -> std::optional<std::string> {
    auto text = os::readFile(path);
    if (!text.ok()) return std::nullopt;
    return std::move(text.value());
  };
  UsageFiles files;
  if (v2) {
    files.cpu = read(dirs_[0] + "/cpu.stat");
    files.memory = read(dirs_[0] + "/memory.current");
    files.pids = read(dirs_[0] + "/pids.current");
    files.memoryEvents = read(dirs_[0] + "/memory.events");
  } else {
    // cpuacct mounted with cpu (most hybrid hosts) or apart (dirs_[3]).
    files.cpu = read((cpuacct_ ? dirs_[3] : dirs_[0]) + "/cpuacct.usage");
    files.memory = read(dirs_[1] + "/memory.usage_in_bytes");
    files.pids = read(dirs_[2] + "/pids.current");
    files.memoryEvents = read(dirs_[1] + "/memory.oom_control");
  }
  return usageFrom(layout_.version, files);
}

void Cgroup::killAll() const {
  if (dirs_.empty()) return;
  const bool v2 = layout_.version == Version::kV2;
  const std::string paused = pauseDir();
  // v2's kill takes the paused child with it (frozen processes die of it),
  // but passes over a process whose first thread has ended while others
  // run on (it goes by processes' leaders): every thread listed is sent the
  // kill too, which ends its whole process.
  if (v2 && os::exists(dirs_[0] + "/cgroup.kill")) (void)os::writeExisting(dirs_[0] + "/cgroup.kill", "1");
  // Threads, not processes (v1: each hierarchy's `tasks`).
  std::vector<std::string> files = v2 ? std::vector<std::string>{dirs_[0] + "/cgroup.threads"} : joinFiles_;
  if (!paused.empty()) files.push_back(paused + (v2 ? "/cgroup.threads" : "/tasks"));
  for (const auto& file : files) {
    for (pid_t id : idsIn(file)) ::kill(id, SIGKILL);
  }
  // A v1 frozen process dies of its SIGKILL only once thawed: it runs no
  // more of its own code (the kill is handled first).
  if (layout_.version == Version::kV1 && !paused.empty()) (void)os::writeExisting(paused + "/freezer.state", "THAWED");
}

Status Cgroup::remove() {
  Status result;
  // A pause's cgroup goes too: first on v2 (a child of dirs_[0]), last on v1.
  std::vector<std::string> dirs(dirs_.rbegin(), dirs_.rend());
  if (const std::string paused = dirs.empty() ? "" : pauseDir(); !paused.empty()) {
    if (layout_.version == Version::kV2) {
      dirs.insert(dirs.begin(), paused);
    } else {
      dirs.push_back(paused);
    }
  }
  for (auto it = dirs.begin(); it != dirs.end(); ++it) {
    // Tasks that were just killed can keep a cgroup busy for a moment.
    int attempts = 0;
    while (::rmdir(it->c_str()) != 0) {
      if (errno == ENOENT) break;
      if (errno != EBUSY || ++attempts > 200) {
        if (result.ok()) result = Error::fromErrno("remove cgroup " + *it);
        break;
      }
      if (attempts == 1) killAll();
      struct timespec ts = {0, 5 * 1000 * 1000};
      ::nanosleep(&ts, nullptr);
    }
  }
  dirs_.clear();
  procsFiles_.clear();
  joinFiles_.clear();
  return result;
}

void removeEmptyNamed(const Layout& layout, const std::string& prefix) {
  std::vector<std::string> parents;
  if (layout.version == Version::kV2) {
    parents.push_back(layout.v2Parent);
  } else {
    for (const auto& [controller, parent] : layout.v1Parents) parents.push_back(parent);
  }
  for (const auto& parent : parents) {
    DIR* d = ::opendir(parent.c_str());
    if (!d) continue;
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      if (e->d_type == DT_DIR && std::string(e->d_name).rfind(prefix, 0) == 0) names.push_back(e->d_name);
    }
    ::closedir(d);
    for (const auto& name : names) (void)::rmdir((parent + "/" + name).c_str());
  }
}

Result<Layout> preparedHostLayout(bool again) {
  static std::mutex mutex;
  static std::optional<Layout> cached;
  std::lock_guard<std::mutex> lock(mutex);
  if (!cached || again) {
    cached.reset();
    MOAT_ASSIGN(Layout layout, detectHostLayout());
    MOAT_TRY(prepareParents(layout));
    cached = std::move(layout);
  }
  return *cached;
}

Result<std::unique_ptr<Cgroup>> createUnderPreparedParents(Layout& layout, const std::string& name,
                                                           const Limits& limits) {
  for (bool again = false;; again = true) {
    auto cgroup = Cgroup::create(layout, name, limits);
    if (cgroup.ok()) return std::make_unique<Cgroup>(std::move(cgroup.value()));
    if (again || cgroup.error().sysErrno != ENOENT) return cgroup.error();
    MOAT_ASSIGN(layout, preparedHostLayout(true));
  }
}

}  // namespace moat::isolation::cgroup
