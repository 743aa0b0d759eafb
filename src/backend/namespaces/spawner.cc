#include "backend/namespaces/spawner.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "init/protocol.h"

namespace moat::backend::namespaces {
namespace {

constexpr size_t kMaxMessage = 1 << 16;
enum Op : uint8_t { kCreate = 1, kDestroy = 2 };

uint64_t bitsOf(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

double doubleOf(uint64_t bits) {
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

std::string encodeSpec(const EnvironmentSpec& spec) {
  init::Encoder e;
  e.u8(kCreate)
      .bytes(spec.stateDir)
      .bytes(spec.templateName)
      .u64(bitsOf(spec.cpus))
      .u64(spec.memoryMb)
      .u64(spec.pids)
      .u64(bitsOf(spec.storageGb))
      .u8(spec.initMode == InitMode::kExec ? 0 : 1)
      .bytes(spec.id)
      .u32(static_cast<uint32_t>(spec.volumes.size()));
  for (const auto& v : spec.volumes) e.bytes(v.source).bytes(v.target).u8(v.readOnly ? 1 : 0);
  return e.take();
}

Result<EnvironmentSpec> decodeSpec(init::Decoder& d) {
  EnvironmentSpec spec;
  MOAT_ASSIGN(spec.stateDir, d.bytes());
  MOAT_ASSIGN(spec.templateName, d.bytes());
  MOAT_ASSIGN(uint64_t cpus, d.u64());
  spec.cpus = doubleOf(cpus);
  MOAT_ASSIGN(spec.memoryMb, d.u64());
  MOAT_ASSIGN(spec.pids, d.u64());
  MOAT_ASSIGN(uint64_t storage, d.u64());
  spec.storageGb = doubleOf(storage);
  MOAT_ASSIGN(uint8_t mode, d.u8());
  spec.initMode = mode == 0 ? InitMode::kExec : InitMode::kInProcess;
  MOAT_ASSIGN(spec.id, d.bytes());
  MOAT_ASSIGN(uint32_t volumes, d.u32());
  for (uint32_t i = 0; i < volumes; ++i) {
    isolation::fs::BindMount v;
    MOAT_ASSIGN(v.source, d.bytes());
    MOAT_ASSIGN(v.target, d.bytes());
    MOAT_ASSIGN(uint8_t ro, d.u8());
    v.readOnly = ro != 0;
    spec.volumes.push_back(v);
  }
  return spec;
}

// One SEQPACKET message, optionally carrying one fd.
Status sendMessage(int channel, const std::string& data, int fd = -1) {
  struct iovec iov = {const_cast<char*>(data.data()), data.size()};
  struct msghdr msg;
  std::memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    std::memset(control, 0, sizeof control);
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  for (;;) {
    if (::sendmsg(channel, &msg, MSG_NOSIGNAL) >= 0) return {};
    if (errno != EINTR) return Error::fromErrno("spawner: send");
  }
}

// Receives one message; an empty result with code "eof" when the peer is gone.
Result<std::string> receiveMessage(int channel, UniqueFd* fd) {
  std::string data(kMaxMessage, '\0');
  struct iovec iov = {data.data(), data.size()};
  struct msghdr msg;
  std::memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(channel, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Error::fromErrno("spawner: receive");
  if (n == 0) return Error::make("eof", "spawner channel closed");
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int received;
      std::memcpy(&received, CMSG_DATA(c), sizeof(int));
      if (fd != nullptr) {
        fd->reset(received);
      } else {
        ::close(received);
      }
    }
  }
  data.resize(static_cast<size_t>(n));
  return data;
}

std::string reply(const Status& status, const std::string& value = "") {
  init::Encoder e;
  if (status.ok()) {
    e.u8(1).bytes(value);
  } else {
    e.u8(0).bytes(status.error().code).i32(status.error().sysErrno).bytes(status.error().context);
  }
  return e.take();
}

}  // namespace

[[noreturn]] void runSpawner(int channel) {
  // A terminal's ^C reaches moatd's whole process group: the spawner ends
  // only when moatd closes the channel, after cleaning up.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  std::map<std::string, std::unique_ptr<Environment>> environments;
  for (;;) {
    auto message = receiveMessage(channel, nullptr);
    if (!message.ok()) break;
    init::Decoder d(message.value());
    auto op = d.u8();
    if (op.ok() && op.value() == kCreate) {
      auto spec = decodeSpec(d);
      if (!spec.ok()) {
        (void)sendMessage(channel, reply(spec.error()));
        continue;
      }
      auto env = Environment::create(spec.value());
      if (!env.ok()) {
        (void)sendMessage(channel, reply(env.error()));
        continue;
      }
      std::string id = env.value()->id();
      UniqueFd control = env.value()->releaseControl();
      environments[id] = std::move(env.value());
      (void)sendMessage(channel, reply(Status{}, id), control.get());
    } else if (op.ok() && op.value() == kDestroy) {
      auto id = d.bytes();
      if (!id.ok()) {
        (void)sendMessage(channel, reply(id.error()));
        continue;
      }
      auto it = environments.find(id.value());
      Status s;
      if (it != environments.end()) {
        s = it->second->destroy();
        environments.erase(it);
      }
      (void)sendMessage(channel, reply(s));
    } else {
      (void)sendMessage(channel, reply(Error::make("protocol", "unknown spawner request")));
    }
  }
  for (auto& [id, env] : environments) (void)env->destroy();
  ::_exit(0);
}

Result<std::unique_ptr<Spawner>> Spawner::start() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return Error::fromErrno("spawner socketpair");
  }
  UniqueFd parentEnd(pair[0]), childEnd(pair[1]);
  pid_t pid = ::fork();
  if (pid < 0) return Error::fromErrno("fork spawner");
  if (pid == 0) {
    parentEnd.reset();
    runSpawner(childEnd.get());
  }
  std::unique_ptr<Spawner> spawner(new Spawner);
  spawner->channel_ = std::move(parentEnd);
  spawner->pid_ = pid;
  return spawner;
}

Spawner::~Spawner() {
  channel_.reset();  // the spawner destroys what it owns, then exits
  if (pid_ > 0) {
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

Result<std::string> Spawner::call(const std::string& request, UniqueFd* receivedFd) {
  std::lock_guard<std::mutex> lock(mutex_);
  MOAT_TRY(sendMessage(channel_.get(), request));
  MOAT_ASSIGN(std::string answer, receiveMessage(channel_.get(), receivedFd));
  init::Decoder d(answer);
  MOAT_ASSIGN(uint8_t ok, d.u8());
  if (ok) return d.bytes();
  Error e;
  MOAT_ASSIGN(e.code, d.bytes());
  MOAT_ASSIGN(e.sysErrno, d.i32());
  MOAT_ASSIGN(e.context, d.bytes());
  return e;
}

Result<Spawner::Created> Spawner::create(const EnvironmentSpec& spec) {
  Created created;
  MOAT_ASSIGN(created.id, call(encodeSpec(spec), &created.control));
  if (!created.control) return Error::make("internal", "spawner sent no control socket");
  return created;
}

Status Spawner::destroy(const std::string& id) {
  auto answer = call(init::Encoder().u8(kDestroy).bytes(id).take(), nullptr);
  if (!answer.ok()) return answer.error();
  return {};
}

}  // namespace moat::backend::namespaces
