#include "backend/namespaces/environment.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "common/hex.h"
#include "common/log.h"
#include "common/process_args.h"
#include "common/trace.h"
#include "init/protocol.h"
#include "init/supervisor.h"
#include "isolation/caps/capabilities.h"
#include "isolation/cgroup/cpus.h"
#include "isolation/cgroup/layout.h"
#include "isolation/fs/storage_pool.h"
#include "isolation/fs/template.h"
#include "isolation/namespaces/user_namespace.h"
#include "isolation/proc/lxcfs.h"
#include "isolation/seccomp/policy.h"
#include "os/block.h"
#include "os/file.h"
#include "os/mount.h"
#include "os/net.h"
#include "os/process.h"
#include "os/security.h"
#include "os/socket.h"
#include "os/tree.h"

namespace moat::backend::namespaces {
namespace {

namespace cg = isolation::cgroup;
namespace fs = isolation::fs;

constexpr uint64_t kMiB = 1ULL << 20;
// fds the child sets up right before exec.
constexpr int kControlFd = 3;     // inherited by moat-init
constexpr int kInitFd = 4;        // the moat-init binary (close-on-exec)
constexpr int kErrorFd = 5;       // setup errors to the parent (close-on-exec)
constexpr int kRendezvousFd = 6;  // new control connections (reattachable only)
constexpr int kDiskUsedFd = 7;    // the volume's qgroup counters (df inside)
constexpr int kDiskLimitFd = 8;

}  // namespace

namespace {
bool haveEnvironmentFileLimit = false;
struct rlimit environmentFileLimit;
}  // namespace

void setEnvironmentOpenFilesLimit(const struct rlimit& limit) {
  environmentFileLimit = limit;
  haveEnvironmentFileLimit = true;
}

namespace {

std::string cgroupName(const std::string& id) { return "moat-" + id; }

// Leftovers of processes that died holding environments (their locks are
// free) are collected at the first create of a process and then at most
// every 10 s: the scan opens every lock, ~1,000 of them beside a full moatd.
bool leftoversDue() {
  using clock = std::chrono::steady_clock;
  static std::mutex mutex;
  static std::optional<clock::time_point> last;
  std::lock_guard<std::mutex> lock(mutex);
  auto now = clock::now();
  if (last && now - *last < std::chrono::seconds(10)) return false;
  last = now;
  return true;
}

std::atomic<bool> limitsViewWarned{false};

void warnWithoutLimitsView(const Error& why) {
  if (limitsViewWarned.exchange(true)) return;
  moat::log::warnf(
      "warning: environments will show the host's memory and CPUs in /proc, not their limits: %s "
      "(docs/SECURITY.md, \"Limits inside\")\n",
      why.message().c_str());
}

// LXCFS's /proc files for one environment. Without them it still starts,
// and its /proc shows the host's values.
std::vector<isolation::proc::ProcFileTree> limitsView(bool warn) {
  static const isolation::proc::LxcfsConfig config = isolation::proc::lxcfsConfigFromEnvironment();
  auto trees = isolation::proc::lxcfsProcTrees(config);
  if (trees.ok()) return std::move(trees.value());
  if (warn) warnWithoutLimitsView(trees.error());
  return {};
}

// The CPUs an environment's processes start on: as many as its CPU limit
// rounded up, taken in turn from the creator's, so that consecutive
// environments spread over the host (a random first one for `moat run`,
// where each process makes one). Empty: all of them.
std::vector<int> environmentCpus(double cpus) {
  static std::atomic<unsigned> next{[] {
    unsigned seed = 0;
    (void)::getrandom(&seed, sizeof seed, 0);
    return seed;
  }()};
  auto allowed = os::cpuAffinity();
  if (!allowed.ok() || cpus <= 0) return {};
  auto count = static_cast<unsigned>(std::ceil(cpus));
  return cg::chooseCpus(allowed.value(), cpus, next.fetch_add(count));
}

struct ChildArgs {
  std::string id;
  const fs::RootPlan* plan;
  std::vector<std::string> joinFiles;  // v1: join by writing "0"
  int usernsFd;
  int controlFd;
  int initFd;        // -1: run the supervisor in process
  int rendezvousFd;  // -1: not reattachable
  int errorFd;
  int networkFd;  // -1: the clone made a new network namespace
  const std::vector<sock_filter>* seccomp;
  const struct rlimit* fileLimit = nullptr;  // null: keep the creator's
  const std::vector<int>* cpus = nullptr;    // empty: every CPU of the creator
  int diskUsedFd = -1;                       // -1: statfs shows the pool (no counters)
  int diskLimitFd = -1;
};

[[noreturn]] void runChild(const ChildArgs& a);

int childMain(void* args) { runChild(*static_cast<const ChildArgs*>(args)); }

[[noreturn]] void childFail(int errorFd, const std::string& stage, const Error& error) {
  std::string message = stage + ": " + error.message();
  ssize_t ignored = ::write(errorFd, message.data(), message.size());
  (void)ignored;
  ::_exit(1);
}

#define CHILD_STEP(stage, expr)                                            \
  do {                                                                     \
    auto step_result_ = (expr);                                            \
    if (!step_result_.ok()) childFail(errFd, stage, step_result_.error()); \
    traceStage(stage);                                                     \
  } while (0)

// Runs in the cloned child, as host root in the new namespaces, and ends in
// exec of moat-init. Errors go to the parent through errorFd.
[[noreturn]] void runChild(const ChildArgs& a) {
  int errFd = a.errorFd;
  if (a.networkFd >= 0) CHILD_STEP("network namespace", os::setNamespace(a.networkFd, CLONE_NEWNET));
  for (const auto& file : a.joinFiles) CHILD_STEP("join cgroup", os::writeExisting(file, "0"));
  CHILD_STEP("cgroup namespace", os::unshareNamespaces(CLONE_NEWCGROUP));
  // After joining the cgroup (a v1 cpuset resets the affinity of who joins).
  if (a.cpus && !a.cpus->empty()) CHILD_STEP("cpu affinity", os::setCpuAffinity(*a.cpus));
  CHILD_STEP("root file system", fs::buildRoot(*a.plan, a.usernsFd));
  CHILD_STEP("hostname", os::setHostname(a.id));
  if (a.networkFd < 0) CHILD_STEP("loopback", os::bringLoopbackUp());  // a pooled one has it up
  CHILD_STEP("enter user namespace", os::setNamespace(a.usernsFd, CLONE_NEWUSER));
  CHILD_STEP("become root of the user namespace", os::becomeId(0, 0));
  CHILD_STEP("capabilities", os::restrictCapabilities(isolation::caps::initCapabilities()));
  CHILD_STEP("no_new_privs", os::setNoNewPrivs());
  // The environment dies with the moat process that created it. Set after
  // the last credential change, which would clear it. (Should the parent die
  // before this line, moat-init still exits: its control socket reads EOF.)
  CHILD_STEP("parent death signal", os::setParentDeathSignal(SIGKILL));
  CHILD_STEP("landlock", os::landlockScopeSelf());

  int devNull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devNull < 0) childFail(errFd, "open /dev/null", Error::fromErrno("open"));
  int control = ::fcntl(a.controlFd, F_DUPFD_CLOEXEC, 10);
  int init = a.initFd < 0 ? -1 : ::fcntl(a.initFd, F_DUPFD_CLOEXEC, 10);
  int err = ::fcntl(errFd, F_DUPFD_CLOEXEC, 10);
  int rendezvous = a.rendezvousFd < 0 ? -1 : ::fcntl(a.rendezvousFd, F_DUPFD_CLOEXEC, 10);
  const bool disk = a.diskUsedFd >= 0 && a.diskLimitFd >= 0;
  int diskUsed = disk ? ::fcntl(a.diskUsedFd, F_DUPFD_CLOEXEC, 10) : -1;
  int diskLimit = disk ? ::fcntl(a.diskLimitFd, F_DUPFD_CLOEXEC, 10) : -1;
  if (control < 0 || (a.initFd >= 0 && init < 0) || err < 0 || (a.rendezvousFd >= 0 && rendezvous < 0) ||
      (disk && (diskUsed < 0 || diskLimit < 0))) {
    childFail(errFd, "dup", Error::fromErrno("fcntl"));
  }
  errFd = err;
  // Traced (MOAT_TRACE), moat-init keeps the spawner's stderr for its stages.
  for (int fd = 0; fd < (traceEnabled() ? 2 : 3); ++fd) {
    if (::dup2(devNull, fd) < 0) childFail(errFd, "stdio", Error::fromErrno("dup2"));
  }
  if (::dup2(control, kControlFd) < 0 || (init >= 0 && ::dup3(init, kInitFd, O_CLOEXEC) < 0) ||
      ::dup3(err, kErrorFd, O_CLOEXEC) < 0 || (rendezvous >= 0 && ::dup2(rendezvous, kRendezvousFd) < 0) ||
      (disk && (::dup2(diskUsed, kDiskUsedFd) < 0 || ::dup2(diskLimit, kDiskLimitFd) < 0))) {
    childFail(errFd, "fds", Error::fromErrno("dup2"));
  }
  errFd = kErrorFd;
  // Nothing of the parent's may stay open here: its end of the control
  // socket would keep moat-init from ever seeing EOF, its lock would keep
  // the environment from being collected.
  if (init < 0) ::close(kInitFd);
  if (rendezvous < 0) ::close(kRendezvousFd);
  if (!disk) {
    ::close(kDiskUsedFd);
    ::close(kDiskLimitFd);
  }
  CHILD_STEP("close fds", os::closeFrom(kDiskLimitFd + 1));
  // After the dups above: the creator's descriptors may be numbered beyond it.
  if (a.fileLimit) CHILD_STEP("open files limit", os::setOpenFilesLimit(*a.fileLimit));
  // As the environment's root, in its root, with its capabilities and
  // nothing of the creator's open: nothing outside is reachable.
  if (!a.plan->environmentFilesWritten) CHILD_STEP("environment files", fs::writeEnvironmentFiles(a.id));
  CHILD_STEP("seccomp", os::installSeccomp(*a.seccomp));
  if (init >= 0) {
    // Nothing allocated: this child shares its creator's memory (see create).
    static char name[] = "moat-init", flag[] = "--rendezvous-fd", fd[] = "6", diskFlag[] = "--disk-fds",
                diskFds[] = "7";
    static_assert(kRendezvousFd == 6 && kDiskUsedFd == 7 && kDiskLimitFd == 8);
    char* argv[5] = {name, nullptr, nullptr, nullptr, nullptr};
    int argc = 1;
    if (rendezvous >= 0) {
      argv[argc++] = flag;
      argv[argc++] = fd;
    }
    if (disk) {
      argv[argc++] = diskFlag;
      argv[argc++] = diskFds;
    }
    static char traceVar[] = "MOAT_TRACE=1";
    char* env[] = {traceEnabled() ? traceVar : nullptr, nullptr};
    childFail(errFd, "exec", os::execFd(kInitFd, argv, env));
  }

  // In process: become moat-init without an exec. Closing the error pipe
  // tells the parent that setup is complete, as an exec would.
  CHILD_STEP("not dumpable", os::setDumpable(false));
  ::prctl(PR_SET_NAME, "moat-init", 0, 0, 0);
  scrubProcessArgs();
  ::close(errFd);
  init::Supervisor supervisor(kControlFd, true, rendezvous >= 0 ? kRendezvousFd : -1);
  if (disk) supervisor.showDiskLimit(os::QgroupCounters{UniqueFd(kDiskUsedFd), UniqueFd(kDiskLimitFd)});
  ::_exit(supervisor.run());
}

Status checkSpec(const EnvironmentSpec& spec) {
  if (!spec.id.empty() &&
      (spec.id.size() != 12 || spec.id.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return Error::make(Code::kInvalidArgument, "environment id must be 12 lowercase hex digits");
  }
  if (spec.stateDir.empty() || spec.stateDir[0] != '/') {
    return Error::make(Code::kInvalidArgument, "state directory must be an absolute path");
  }
  for (const auto& v : spec.volumes) {
    MOAT_TRY(fs::validateBindTarget(v.target));
    // Checked (and opened, by addBind) with no symlink followed unless
    // root made it: a link that an environment planted in a directory it
    // shares with the host must not turn a later bind into another path.
    MOAT_ASSIGN(UniqueFd source, os::openHostPath(v.source, "volume source"));
    (void)source;
  }
  return {};
}

}  // namespace

void prepareLimitsView() {
  auto config = isolation::proc::lxcfsConfigFromEnvironment();
  if (!config.enabled) return;
  if (auto started = isolation::proc::ensureLxcfs(config); !started.ok()) warnWithoutLimitsView(started.error());
}

Result<std::string> findInitBinary() {
  if (const char* env = std::getenv("MOAT_INIT")) return std::string(env);
  MOAT_ASSIGN(std::string dir, os::selfDirectory());
  // Beside moatd (the build tree), or where an installation keeps what
  // is no command of a user's: PREFIX/lib/moat (make install, the package).
  for (const std::string& path : {dir + "/moat-init", dir + "/../lib/moat/moat-init"}) {
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return Error::fromErrno("moat-init not found next to " + dir + " nor in " + dir + "/../lib/moat (set MOAT_INIT)",
                          ENOENT);
}

Result<std::unique_ptr<Environment>> Environment::create(
    const EnvironmentSpec& spec, std::optional<isolation::namespaces::ReadyUserNamespace> userNamespace) {
  MOAT_TRY(checkSpec(spec));
  std::unique_ptr<Environment> env(new Environment);
  env->id_ = spec.id.empty() ? newEnvironmentId() : spec.id;
  env->stateDir_ = spec.stateDir;

  std::string runDir = spec.stateDir + "/run";
  MOAT_TRY(os::makeDirs(runDir, 0700));
  if (leftoversDue()) collectLeftovers(spec.stateDir);
  {
    // Lock before the name is visible, so a collector never takes a live one.
    std::string tmp = runDir + "/." + env->id_;
    MOAT_ASSIGN(env->lock_, os::open(tmp, O_RDWR | O_CREAT | O_EXCL, 0600));
    if (::flock(env->lock_.get(), LOCK_EX | LOCK_NB) != 0) return Error::fromErrno("lock " + tmp);
    if (::rename(tmp.c_str(), (runDir + "/" + env->id_ + ".lock").c_str()) != 0) {
      return Error::fromErrno("rename " + tmp);
    }
  }

  traceStage("locked");
  MOAT_ASSIGN(cg::Layout layout, cg::preparedHostLayout(false));
  traceStage("cgroup parents");
  MOAT_ASSIGN(fs::StoragePool pool, fs::StoragePool::open(spec.stateDir));
  const uint64_t storageBytes = storageLimitBytes(spec.storageGb);
  if (storageBytes > pool.capacityBytes()) {
    return Error::make(Code::kInvalidArgument,
                       "storage of " + std::to_string(storageBytes / kMiB) + " MiB exceeds the pool (" +
                           std::to_string(pool.capacityBytes() / kMiB) + " MiB; see MOAT_STORAGE_GB)");
  }
  traceStage("pool");
  MOAT_ASSIGN(fs::Template tmpl, fs::resolveTemplate(spec.templateName, spec.stateDir));
  std::string volume;
  UniqueFd userns;
  if (spec.fromSnapshot.empty()) {
    MOAT_ASSIGN(volume, pool.createVolume(env->id_, storageBytes));
    env->haveVolume_ = true;
    if (userNamespace) {
      env->idmap_ = std::move(userNamespace->lease);
      userns = std::move(userNamespace->ns);
    } else {
      MOAT_ASSIGN(env->idmap_, isolation::namespaces::leaseIdMap());
    }
  } else {
    MOAT_ASSIGN(volume, pool.createVolumeFromSnapshot(spec.fromSnapshot, env->id_, storageBytes));
    env->haveVolume_ = true;
    // The snapshot's own range when it is free (a restore): nothing to re-own.
    MOAT_ASSIGN(env->idmap_,
                isolation::namespaces::leaseIdMap(isolation::namespaces::kIdMapLockDir,
                                                  isolation::namespaces::idMapSlotOf(spec.snapshotHostBase)));
    MOAT_TRY(os::shiftOwnership(volume, spec.snapshotHostBase, env->idmap_.map.hostBase, env->idmap_.map.count));
    // The overlay's work directory must start empty.
    MOAT_TRY(os::removeTree(volume + "/work"));
  }
  const auto& idmap = env->idmap_.map;
  // What `df` inside shows: without the counters (a kernel without btrfs's
  // qgroups in sysfs), the pool's size, as before.
  auto disk = os::openQgroupCounters(volume);
  traceStage("volume");
  MOAT_ASSIGN(fs::RootPlan plan, fs::prepareRoot(volume, tmpl.lower.get(), env->id_, idmap.hostBase, idmap.hostBase));
  MOAT_ASSIGN(plan.devDir, fs::ensureDevSkeleton(pool.root()));
  for (const auto& dir : tmpl.hostReadOnlyDirs) MOAT_TRY(fs::addBind(plan, dir, dir, true, false));
  for (const auto& v : spec.volumes) MOAT_TRY(fs::addBind(plan, v.source, v.target, v.readOnly, true));
  plan.procFiles = limitsView(spec.warnWithoutLimitsView);
  traceStage("limits view");
  const std::vector<int> cpus = environmentCpus(spec.cpus);

  traceStage("root prepared");
  cg::Limits limits;
  limits.cpus = spec.cpus;
  limits.memoryBytes = spec.memoryMb * kMiB;
  limits.pids = spec.pids;
  limits.cpuSet = cpus;
  MOAT_ASSIGN(env->cgroup_, cg::createUnderPreparedParents(layout, cgroupName(env->id_), limits));

  traceStage("cgroup");
  if (!userns) {
    MOAT_ASSIGN(userns, isolation::namespaces::createUserNamespace(idmap));
    traceStage("userns");
  }
  MOAT_TRY(fs::detachTrees(plan, userns.get()));
  MOAT_ASSIGN(auto program, isolation::seccomp::defaultProgram());
  UniqueFd initFd;
  if (spec.initMode == InitMode::kExec) {
    MOAT_ASSIGN(std::string initPath, findInitBinary());
    MOAT_ASSIGN(initFd, os::open(initPath, O_PATH));
  }

  traceStage("seccomp+init");
  int sockets[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) {
    return Error::fromErrno("socketpair");
  }
  UniqueFd parentEnd(sockets[0]), childEnd(sockets[1]);
  UniqueFd rendezvousChild;
  if (spec.reattachable) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
      return Error::fromErrno("rendezvous socketpair");
    }
    env->rendezvous_.reset(pair[0]);
    rendezvousChild.reset(pair[1]);
  }
  if (!spec.firstFrames.empty() && ::send(parentEnd.get(), spec.firstFrames.data(), spec.firstFrames.size(),
                                          MSG_DONTWAIT) != static_cast<ssize_t>(spec.firstFrames.size())) {
    return Error::fromErrno("queue first requests");
  }
  int errorPipe[2];
  if (::pipe2(errorPipe, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  UniqueFd errorRead(errorPipe[0]), errorWrite(errorPipe[1]);

  os::CloneOptions clone;
  clone.flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC;
  if (spec.networkNamespaceFd < 0) clone.flags |= CLONE_NEWNET;
  UniqueFd cgroupFd;
  ChildArgs args{env->id_,
                 &plan,
                 {},
                 userns.get(),
                 childEnd.get(),
                 initFd.get(),
                 rendezvousChild.get(),
                 errorWrite.get(),
                 spec.networkNamespaceFd,
                 &program.filter};
  if (haveEnvironmentFileLimit) args.fileLimit = &environmentFileLimit;
  if (disk.ok()) {
    args.diskUsedFd = disk->referenced.get();
    args.diskLimitFd = disk->maxReferenced.get();
  }
  args.cpus = &cpus;
  if (layout.version == cg::Version::kV2) {
    MOAT_ASSIGN(cgroupFd, env->cgroup_->openDirectory());
    clone.cgroupFd = cgroupFd.get();
  } else {
    args.joinFiles = env->cgroup_->joinFiles();
  }
  os::Child child;
  if (spec.initMode == InitMode::kExec) {
    // The child execs moat-init: it can share this process's memory until
    // then, which spares the copy of the address space and the
    // copy-on-write faults after it (~0.5 ms of a create in the spawner).
    MOAT_ASSIGN(child, os::cloneVfork(clone, childMain, &args));
  } else {
    MOAT_ASSIGN(child, os::clone3(clone));
    if (child.pid == 0) runChild(args);
  }
  env->initPidfd_ = std::move(child.pidfd);
  env->initPid_ = child.pid;

  traceStage("cloned");
  childEnd.reset();
  rendezvousChild.reset();
  errorWrite.reset();
  std::string failure;
  char buf[1024];
  for (;;) {
    ssize_t n = ::read(errorRead.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    failure.append(buf, static_cast<size_t>(n));
  }
  if (!failure.empty()) {
    (void)os::waitPidfd(env->initPidfd_.get());
    env->initPidfd_.reset();
    return Error::make(Code::kEnvironmentFailed, "environment setup failed at " + failure);
  }
  traceStage("child exec");
  // moat-init's Hello is read by the client together with its first replies:
  // requests may be sent right away and wait in the socket meanwhile.
  env->control_ = std::move(parentEnd);
  return env;
}

Result<UniqueFd> Environment::reconnect() {
  if (!rendezvous_) return Error::make(Code::kUnsupported, "environment " + id_ + " is not reattachable");
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return Error::fromErrno("socketpair");
  }
  UniqueFd mine(pair[0]), theirs(pair[1]);
  MOAT_TRY(os::sendWithFd(rendezvous_.get(), "c", theirs.get()));
  return mine;
}

Status Environment::destroy() {
  if (destroyed_) return {};
  destroyed_ = true;
  traceStage("destroy: start");
  Status result;
  // Paused: killed where they stand (pid 1's end could not take frozen
  // processes with it on cgroup v1).
  if (cgroup_ && cgroup_->frozen()) cgroup_->killAll();
  control_.reset();  // moat-init kills everything when its client goes
  rendezvous_.reset();
  if (initPidfd_) {
    // pid 1 dying takes the whole pid namespace with it; once it is reaped,
    // every process and mount of the environment is gone.
    (void)os::pidfdSendSignal(initPidfd_.get(), SIGKILL);
    (void)os::waitPidfd(initPidfd_.get());
    initPidfd_.reset();
    traceStage("destroy: init reaped");
  }
  if (cgroup_) {
    Status s = cgroup_->remove();
    if (!s.ok() && result.ok()) result = s;
    cgroup_.reset();
    traceStage("destroy: cgroup");
  }
  if (haveVolume_) {
    auto pool = isolation::fs::StoragePool::open(stateDir_);
    Status s = pool.ok() ? pool->destroyVolume(id_) : Status(pool.error());
    if (!s.ok() && result.ok()) result = s;
    haveVolume_ = false;
    traceStage("destroy: volume");
  }
  // Its files and processes are gone: the host id range may serve another.
  idmap_ = {};
  if (lock_) {
    // Kept, unlocked, while something could not be removed: that is how a
    // later collector (collectLeftovers) finds it and tries again.
    if (result.ok()) ::unlink((stateDir_ + "/run/" + id_ + ".lock").c_str());
    lock_.reset();
  }
  return result;
}

Status Environment::pause() {
  if (!cgroup_ || destroyed_) return Error::make(Code::kNotFound, "environment " + id_ + " has no cgroup");
  return cgroup_->freeze(initPid_);
}

Status Environment::resume() {
  if (!cgroup_ || destroyed_) return Error::make(Code::kNotFound, "environment " + id_ + " has no cgroup");
  return cgroup_->thaw();
}

Result<uint32_t> Environment::snapshot(const std::string& name) const {
  if (!haveVolume_) return Error::make(Code::kConflict, "environment " + id_ + " has no writable layer");
  MOAT_ASSIGN(isolation::fs::StoragePool pool, isolation::fs::StoragePool::open(stateDir_));
  MOAT_TRY(pool.snapshotVolume(id_, name));
  return idmap_.map.hostBase;
}

Environment::~Environment() { (void)destroy(); }

void collectLeftovers(const std::string& stateDir) {
  std::string runDir = stateDir + "/run";
  auto names = os::listDir(runDir);
  if (!names.ok()) return;
  const auto now = std::chrono::system_clock::now();
  for (const auto& name : names.value()) {
    if (!name.empty() && name[0] == '.') {
      // A lock file not yet renamed: its creator died between the two, or
      // is between its open and its flock right now, for microseconds.
      // Removed once unlocked and a minute old.
      std::string path = runDir + "/" + name;
      struct stat st;
      auto lock = os::open(path, O_RDWR | O_NOFOLLOW);
      if (lock.ok() && ::fstat(lock->get(), &st) == 0 && S_ISREG(st.st_mode) &&
          now - std::chrono::system_clock::from_time_t(st.st_mtime) > std::chrono::minutes(1) &&
          ::flock(lock->get(), LOCK_EX | LOCK_NB) == 0) {
        ::unlink(path.c_str());
      }
      continue;
    }
    const std::string suffix = ".lock";
    if (name.empty() || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    std::string path = runDir + "/" + name;
    auto lock = os::open(path, O_RDWR);
    if (!lock.ok() || ::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) continue;  // alive
    std::string id = name.substr(0, name.size() - suffix.size());
    bool gone = true;
    auto layout = cg::detectHostLayout();
    if (!layout.ok()) gone = false;
    if (layout.ok()) {
      // Processes still there (frozen by a pause: pid 1's end could not
      // take them with it on cgroup v1) are killed, thawed and waited for.
      if (auto left = cg::Cgroup::open(layout.value(), cgroupName(id)); left.ok()) (void)left->remove();
      std::vector<std::string> dirs;
      if (layout->version == cg::Version::kV2) {
        dirs.push_back(layout->v2Parent + "/" + cgroupName(id) + "/paused");  // a pause's child (freeze.cc)
        dirs.push_back(layout->v2Parent + "/" + cgroupName(id));
      } else {
        for (const auto& [c, parent] : layout->v1Parents) dirs.push_back(parent + "/" + cgroupName(id));
      }
      for (const auto& d : dirs) {
        if (::rmdir(d.c_str()) != 0 && errno != ENOENT) gone = false;
      }
    }
    auto pool = isolation::fs::StoragePool::open(stateDir);
    if (!pool.ok() || !pool->destroyVolume(id).ok()) gone = false;
    if (gone) ::unlink(path.c_str());  // else tried again next time
  }
}

Result<UniqueFd> Environment::networkNamespace() const {
  if (!initPidfd_ || destroyed_) return Error::make(Code::kNotFound, "environment " + id_ + " has no pid 1");
  return os::networkNamespaceOf(initPidfd_.get());
}

}  // namespace moat::backend::namespaces
