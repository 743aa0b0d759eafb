#include "fake_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moat_process.h"
#include "os/socket.h"

namespace moat::test {

namespace {

constexpr int kControlFd = 3;
constexpr int kRendezvousFd = 4;

}  // namespace

FakeBackend::~FakeBackend() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, env] : envs_) end(env);
}

void FakeBackend::record(const std::string& op, const std::string& id, const backend::Spec& spec) {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.push_back({op, id, spec});
}

void FakeBackend::end(Env& env) {
  env.rendezvous.reset();
  if (env.pid <= 0) return;
  // moat-init ends what it runs and exits once its rendezvous is gone; one
  // that does not within 5 s is killed.
  struct pollfd exited = {env.exited.get(), POLLIN, 0};
  if (!env.exited || ::poll(&exited, 1, 5000) != 1) ::kill(env.pid, SIGKILL);
  ::waitpid(env.pid, nullptr, 0);
  env.pid = -1;
}

Result<backend::Backend::Created> FakeBackend::create(const backend::Spec& spec) {
  record("create", spec.id, spec);
  std::lock_guard<std::mutex> lock(mutex_);
  if (failCreate_) {
    Error e = *failCreate_;
    failCreate_.reset();
    return e;
  }
  if (spec.id.empty() || envs_.count(spec.id)) return Error::make(Code::kInvalidArgument, "bad or taken id " + spec.id);
  if (!spec.fromSnapshot.empty() && !snapshots_.count(spec.fromSnapshot)) {
    return Error::make(Code::kNotFound, "no snapshot " + spec.fromSnapshot);
  }
  int control[2], rendezvous[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control) != 0) return Error::fromErrno("socketpair");
  UniqueFd ours(control[0]), theirs(control[1]);
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, rendezvous) != 0) return Error::fromErrno("socketpair");
  UniqueFd rendezvousOurs(rendezvous[0]), rendezvousTheirs(rendezvous[1]);
  const std::string bin = binDir() + "/moat-init";
  // Commands run as root inside, as in every environment: a test run by
  // another user puts moat-init in a user namespace of its own, that user
  // mapped to root (prepared before the fork: the child only writes).
  const bool asRoot = ::geteuid() == 0;
  const std::string uidMap = "0 " + std::to_string(::geteuid()) + " 1";
  const std::string gidMap = "0 " + std::to_string(::getegid()) + " 1";
  int status[2];
  if (::pipe2(status, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  pid_t pid = ::fork();
  if (pid < 0) return Error::fromErrno("fork");
  if (pid == 0) {
    // Above every descriptor the fixed numbers could collide with, before
    // any of them is taken.
    int st = ::fcntl(status[1], F_DUPFD_CLOEXEC, 10);
    int c = ::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10), r = ::fcntl(rendezvousTheirs.get(), F_DUPFD_CLOEXEC, 10);
    auto die = [st](int code) {
      char byte = static_cast<char>(code);
      if (st >= 0) (void)!::write(st, &byte, 1);
      ::_exit(code);
    };
    if (st < 0 || c < 0 || r < 0 || ::dup2(c, kControlFd) < 0 || ::dup2(r, kRendezvousFd) < 0) die(120);
    // Nothing else of the test process reaches moat-init (the status pipe
    // is close-on-exec: its closing says the exec happened).
    for (int fd = kRendezvousFd + 1; fd < 1024; ++fd) {
      if (fd != st) ::close(fd);
    }
    if (!asRoot) {
      auto put = [](const char* path, const std::string& text) {
        int fd = ::open(path, O_WRONLY | O_CLOEXEC);
        bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        if (fd >= 0) ::close(fd);
        return ok;
      };
      if (::unshare(CLONE_NEWUSER) != 0 || !put("/proc/self/setgroups", "deny") || !put("/proc/self/uid_map", uidMap) ||
          !put("/proc/self/gid_map", gidMap)) {
        die(122);
      }
    }
    // The exec gate's filter needs it without root, as in an environment.
    ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    const char* argv[] = {"moat-init", "--control-fd", "3", "--rendezvous-fd", "4", nullptr};
    ::execv(bin.c_str(), const_cast<char* const*>(argv));
    die(121);
  }
  ::close(status[1]);
  // A byte: the child could not exec moat-init (its exit code says where).
  char failed = 0;
  ssize_t got = ::read(status[0], &failed, 1);
  ::close(status[0]);
  if (got > 0) {
    ::waitpid(pid, nullptr, 0);
    return Error::make(Code::kEnvironmentFailed,
                       "the fake could not start moat-init (step " + std::to_string(static_cast<int>(failed)) + ")");
  }
  Env env;
  env.pid = pid;
  env.exited.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  env.rendezvous = std::move(rendezvousOurs);
  envs_[spec.id] = std::move(env);
  return Created{spec.id, std::move(ours)};
}

Status FakeBackend::destroy(const std::string& id) {
  record("destroy", id);
  Env env;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = envs_.find(id);
    if (it == envs_.end()) return {};
    env = std::move(it->second);
    envs_.erase(it);
  }
  end(env);
  return {};
}

Result<UniqueFd> FakeBackend::attach(const std::string& id) {
  record("attach", id);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = envs_.find(id);
  if (it == envs_.end()) return Error::make(Code::kNotFound, "no environment " + id);
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return Error::fromErrno("socketpair");
  UniqueFd mine(pair[0]), theirs(pair[1]);
  MOAT_TRY(os::sendWithFd(it->second.rendezvous.get(), "c", theirs.get()));
  return mine;
}

Result<std::vector<std::string>> FakeBackend::list() {
  record("list", "");
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& [id, env] : envs_) ids.push_back(id);
  return ids;
}

Result<backend::Usage> FakeBackend::usage(const std::string& id) {
  record("usage", id);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!envs_.count(id)) return Error::make(Code::kNotFound, "no environment " + id);
  return usage_;
}

void FakeBackend::setUsage(const backend::Usage& usage) {
  std::lock_guard<std::mutex> lock(mutex_);
  usage_ = usage;
}

Result<UniqueFd> FakeBackend::networkNamespace(const std::string& id) {
  record("networkNamespace", id);
  return Error::make(Code::kUnsupported, "the fake backend has no network");
}

Result<uint32_t> FakeBackend::snapshot(const std::string& id, const std::string& name) {
  record("snapshot", name);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!envs_.count(id)) return Error::make(Code::kNotFound, "no environment " + id);
  snapshots_.insert(name);
  return 100000u;
}

Status FakeBackend::deleteSnapshot(const std::string& name) {
  record("deleteSnapshot", name);
  std::lock_guard<std::mutex> lock(mutex_);
  if (failSnapshotDeletes_) return Error::make(Code::kIo, "the fake's storage cannot be reached");
  snapshots_.erase(name);
  return {};
}

Result<backend::Changes> FakeBackend::changes(const backend::ChangesRequest& request) {
  record("changes", request.id);
  return backend::Changes{};
}

Result<std::vector<std::string>> FakeBackend::snapshots() {
  record("snapshots", "");
  std::lock_guard<std::mutex> lock(mutex_);
  return std::vector<std::string>(snapshots_.begin(), snapshots_.end());
}

std::vector<FakeBackend::Call> FakeBackend::calls() {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

std::vector<FakeBackend::Call> FakeBackend::calls(const std::string& op) {
  std::vector<Call> out;
  for (auto& c : calls()) {
    if (c.op == op) out.push_back(c);
  }
  return out;
}

bool FakeBackend::runs(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  return envs_.count(id) > 0;
}

bool FakeBackend::keepsSnapshot(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshots_.count(name) > 0;
}

void FakeBackend::failNextCreate(Code code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  failCreate_ = Error::make(code, message);
}

Status FakeBackend::pause(const std::string& id) {
  record("pause", id);
  std::unique_lock<std::mutex> lock(mutex_);
  pauseCv_.wait(lock, [&] { return !holdPauses_; });
  lock.unlock();
  return Backend::pause(id);
}

void FakeBackend::holdPauses(bool hold) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    holdPauses_ = hold;
  }
  pauseCv_.notify_all();
}

void FakeBackend::failSnapshotDeletes(bool fail) {
  std::lock_guard<std::mutex> lock(mutex_);
  failSnapshotDeletes_ = fail;
}

void FakeBackend::holdSnapshot(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  snapshots_.insert(name);
}

void FakeBackend::vanish(const std::string& id) {
  Env env;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = envs_.find(id);
    if (it == envs_.end()) return;
    env = std::move(it->second);
    envs_.erase(it);
  }
  ::kill(env.pid, SIGKILL);
  ::waitpid(env.pid, nullptr, 0);
  env.pid = -1;
}

}  // namespace moat::test
