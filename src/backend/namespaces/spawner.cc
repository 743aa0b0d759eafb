#include "backend/namespaces/spawner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>

#include "common/trace.h"
#include "init/protocol.h"
#include "isolation/namespaces/ready_network.h"
#include "os/net.h"
#include "os/netlink.h"
#include "os/process.h"
#include "os/socket.h"

namespace moat::backend::namespaces {
namespace {

constexpr size_t kMaxMessage = 1 << 16;
// Network namespaces made ahead of the creates that join them.
constexpr size_t kNetworkPool = 2;
constexpr size_t kUserPool = 2;
enum Op : uint8_t {
  kCreate = 1,
  kDestroy = 2,
  kAttach = 3,
  kList = 4,
  kShutdown = 5,
  kNetns = 6,
  kSnapshot = 7,
  kUsage = 8,
  kPause = 9,
  kResume = 10
};

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
  e.bytes(spec.fromSnapshot).u32(spec.snapshotHostBase);
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
  MOAT_ASSIGN(spec.fromSnapshot, d.bytes());
  MOAT_ASSIGN(spec.snapshotHostBase, d.u32());
  return spec;
}

Status sendMessage(int channel, const std::string& data, int fd = -1) { return os::sendWithFd(channel, data, fd); }

Result<std::string> receiveMessage(int channel, UniqueFd* fd) { return os::receiveWithFd(channel, fd, kMaxMessage); }

std::string reply(const Status& status, const std::string& value = "") {
  init::Encoder e;
  if (status.ok()) {
    e.u8(1).bytes(value);
  } else {
    e.u8(0).bytes(codeName(status.error().code)).i32(status.error().sysErrno).bytes(status.error().context);
  }
  return e.take();
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace

[[noreturn]] void runSpawner(int channel, int listenFd) {
  // Keep only stdio and the two sockets: nothing of moatd's (its state
  // directory lock, above all) may stay open in a process that outlives it.
  int c = ::fcntl(channel, F_DUPFD, 10);
  int l = ::fcntl(listenFd, F_DUPFD, 10);
  if (c < 0 || l < 0 || ::dup2(c, 3) < 0 || ::dup2(l, 4) < 0) ::_exit(1);
  channel = 3;
  listenFd = 4;
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  ::fcntl(4, F_SETFD, FD_CLOEXEC);
  (void)os::closeFrom(5);
  // Its own session: a terminal's ^C to moatd's process group does not reach
  // it, and it keeps running when moatd goes away.
  ::setsid();
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  std::map<std::string, std::unique_ptr<Environment>> environments;
  std::deque<UniqueFd> networks;                                // fresh network namespaces, loopback up
  std::deque<isolation::namespaces::ReadyUserNamespace> users;  // with their id ranges leased
  int client = channel;
  for (;;) {
    // Between requests: make the network and user namespaces the next
    // creates take, unless moatd is already waiting for an answer. (Kernel
    // objects and leases held by this process alone: nothing of them
    // outlives it.)
    auto refill = [&](auto& ready, size_t want, auto make) {
      while (client >= 0 && ready.size() < want && !readable(client)) {
        auto made = make();
        if (!made.ok()) break;  // the next create makes its own and reports what fails
        ready.push_back(std::move(made.value()));
      }
    };
    refill(networks, kNetworkPool, isolation::namespaces::readyNetwork);
    refill(users, kUserPool, isolation::namespaces::readyUserNamespace);
    if (client < 0) {
      client = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        break;
      }
    }
    auto message = receiveMessage(client, nullptr);
    if (!message.ok()) {
      ::close(client);  // moatd went away: wait for the next one
      client = -1;
      continue;
    }
    traceStage("spawner: request");
    init::Decoder d(message.value());
    auto op = d.u8();
    if (!op.ok()) {
      (void)sendMessage(client, reply(op.error()));
      continue;
    }
    if (op.value() == kCreate) {
      auto spec = decodeSpec(d);
      if (!spec.ok()) {
        (void)sendMessage(client, reply(spec.error()));
        continue;
      }
      spec.value().reattachable = true;
      spec.value().warnWithoutLimitsView = true;
      // Used once, whatever comes of the create.
      UniqueFd network;
      if (!networks.empty()) {
        network = std::move(networks.front());
        networks.pop_front();
        spec.value().networkNamespaceFd = network.get();
      }
      std::optional<isolation::namespaces::ReadyUserNamespace> user;
      if (spec.value().fromSnapshot.empty() && !users.empty()) {
        user = std::move(users.front());
        users.pop_front();
      }
      auto env = Environment::create(spec.value(), std::move(user));
      network.reset();
      if (!env.ok()) {
        (void)sendMessage(client, reply(env.error()));
        continue;
      }
      std::string id = env.value()->id();
      UniqueFd control = env.value()->releaseControl();
      environments[id] = std::move(env.value());
      (void)sendMessage(client, reply(Status{}, id), control.get());
      traceStage("spawner: created sent");
    } else if (op.value() == kSnapshot) {
      auto id = d.bytes();
      auto name = id.ok() ? d.bytes() : Result<std::string>(id.error());
      auto it = name.ok() ? environments.find(id.value()) : environments.end();
      if (!name.ok() || it == environments.end()) {
        (void)sendMessage(client, reply(Error::make(Code::kNotFound, "spawner has no such environment")));
        continue;
      }
      auto base = it->second->snapshot(name.value());
      (void)sendMessage(client, base.ok() ? reply(Status{}, std::to_string(base.value())) : reply(base.error()));
    } else if (op.value() == kPause || op.value() == kResume) {
      auto id = d.bytes();
      auto it = id.ok() ? environments.find(id.value()) : environments.end();
      if (it == environments.end()) {
        (void)sendMessage(client, reply(Error::make(Code::kNotFound, "spawner has no such environment")));
        continue;
      }
      (void)sendMessage(client, reply(op.value() == kPause ? it->second->pause() : it->second->resume()));
    } else if (op.value() == kUsage) {
      auto id = d.bytes();
      auto it = id.ok() ? environments.find(id.value()) : environments.end();
      if (it == environments.end()) {
        (void)sendMessage(client, reply(Error::make(Code::kNotFound, "spawner has no such environment")));
        continue;
      }
      auto u = it->second->usage();
      init::Encoder e;
      e.u8(u.cpuUsec ? 1 : 0).u64(u.cpuUsec.value_or(0)).u64(u.memoryBytes).u64(u.pids).u64(u.oomKills);
      (void)sendMessage(client, reply(Status{}, e.take()));
    } else if (op.value() == kNetns) {
      auto id = d.bytes();
      auto it = id.ok() ? environments.find(id.value()) : environments.end();
      if (it == environments.end()) {
        (void)sendMessage(client, reply(Error::make(Code::kNotFound, "spawner has no such environment")));
        continue;
      }
      auto ns = it->second->networkNamespace();
      if (!ns.ok()) {
        (void)sendMessage(client, reply(ns.error()));
        continue;
      }
      (void)sendMessage(client, reply(Status{}, id.value()), ns->get());
    } else if (op.value() == kDestroy || op.value() == kAttach) {
      auto id = d.bytes();
      if (!id.ok()) {
        (void)sendMessage(client, reply(id.error()));
        continue;
      }
      auto it = environments.find(id.value());
      if (op.value() == kAttach) {
        if (it == environments.end()) {
          (void)sendMessage(client, reply(Error::make(Code::kNotFound, "spawner has no environment " + id.value())));
          continue;
        }
        auto control = it->second->reconnect();
        if (!control.ok()) {
          (void)sendMessage(client, reply(control.error()));
          continue;
        }
        (void)sendMessage(client, reply(Status{}, id.value()), control->get());
        continue;
      }
      Status s;
      if (it != environments.end()) {
        s = it->second->destroy();
        environments.erase(it);
      }
      (void)sendMessage(client, reply(s));
      traceStage("spawner: destroyed sent");
    } else if (op.value() == kList) {
      std::vector<std::string> ids;
      for (const auto& [id, env] : environments) ids.push_back(id);
      (void)sendMessage(client, reply(Status{}, init::Encoder().strings(ids).take()));
    } else if (op.value() == kShutdown) {
      break;
    } else {
      (void)sendMessage(client, reply(Error::make(Code::kProtocol, "unknown spawner request")));
    }
  }
  for (auto& [id, env] : environments) (void)env->destroy();
  if (client >= 0) (void)sendMessage(client, reply(Status{}));
  ::_exit(0);
}

Result<std::unique_ptr<Spawner>> Spawner::connectOrStart(const std::string& socketPath) {
  std::unique_ptr<Spawner> spawner(new Spawner);
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (socketPath.size() >= sizeof addr.sun_path) {
    return Error::make(Code::kInvalidArgument, "spawner socket path too long: " + socketPath);
  }
  std::memcpy(addr.sun_path, socketPath.data(), socketPath.size());
  UniqueFd existing(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!existing) return Error::fromErrno("socket");
  if (::connect(existing.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    spawner->channel_ = std::move(existing);
    return spawner;  // a spawner from an earlier moatd, with its environments
  }
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listener) return Error::fromErrno("socket");
  ::unlink(socketPath.c_str());
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener.get(), 4) != 0) {
    return Error::fromErrno("listen on " + socketPath);
  }
  ::chmod(socketPath.c_str(), 0600);
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return Error::fromErrno("spawner socketpair");
  }
  UniqueFd parentEnd(pair[0]), childEnd(pair[1]);
  pid_t pid = ::fork();
  if (pid < 0) return Error::fromErrno("fork spawner");
  if (pid == 0) {
    parentEnd.reset();
    runSpawner(childEnd.get(), listener.get());
  }
  spawner->channel_ = std::move(parentEnd);
  return spawner;
}

Spawner::~Spawner() = default;

Status Spawner::shutdown() {
  auto answer = call(init::Encoder().u8(kShutdown).take(), nullptr);
  if (!answer.ok() && answer.error().code != Code::kEof) return answer.error();
  return {};
}

Result<UniqueFd> Spawner::attach(const std::string& id) {
  UniqueFd control;
  MOAT_ASSIGN(std::string ignored, call(init::Encoder().u8(kAttach).bytes(id).take(), &control));
  (void)ignored;
  if (!control) return Error::make(Code::kInternal, "spawner sent no control socket");
  return control;
}

Result<UniqueFd> Spawner::networkNamespace(const std::string& id) {
  UniqueFd ns;
  MOAT_ASSIGN(std::string ignored, call(init::Encoder().u8(kNetns).bytes(id).take(), &ns));
  (void)ignored;
  if (!ns) return Error::make(Code::kInternal, "spawner sent no namespace");
  return ns;
}

Result<isolation::cgroup::Usage> Spawner::usage(const std::string& id) {
  MOAT_ASSIGN(std::string payload, call(init::Encoder().u8(kUsage).bytes(id).take(), nullptr));
  init::Decoder d(payload);
  isolation::cgroup::Usage u;
  MOAT_ASSIGN(uint8_t cpuKnown, d.u8());
  MOAT_ASSIGN(uint64_t cpu, d.u64());
  if (cpuKnown) u.cpuUsec = cpu;
  MOAT_ASSIGN(u.memoryBytes, d.u64());
  MOAT_ASSIGN(u.pids, d.u64());
  MOAT_ASSIGN(u.oomKills, d.u64());
  return u;
}

Result<std::vector<std::string>> Spawner::list() {
  MOAT_ASSIGN(std::string payload, call(init::Encoder().u8(kList).take(), nullptr));
  init::Decoder d(payload);
  return d.strings();
}

Result<std::string> Spawner::call(const std::string& request, UniqueFd* receivedFd) {
  std::lock_guard<std::mutex> lock(mutex_);
  MOAT_TRY(sendMessage(channel_.get(), request));
  MOAT_ASSIGN(std::string answer, receiveMessage(channel_.get(), receivedFd));
  init::Decoder d(answer);
  MOAT_ASSIGN(uint8_t ok, d.u8());
  if (ok) return d.bytes();
  Error e;
  MOAT_ASSIGN(std::string code, d.bytes());
  const auto known = codeFromName(code);
  e.code = known.value_or(Code::kInternal);
  MOAT_ASSIGN(e.sysErrno, d.i32());
  MOAT_ASSIGN(e.context, d.bytes());
  // A code this moatd does not know (a spawner of another version): kept in the message.
  if (!known) e.context += " (spawner's code " + code + ")";
  return e;
}

Result<Spawner::Created> Spawner::create(const EnvironmentSpec& spec) {
  Created created;
  MOAT_ASSIGN(created.id, call(encodeSpec(spec), &created.control));
  if (!created.control) return Error::make(Code::kInternal, "spawner sent no control socket");
  return created;
}

Result<uint32_t> Spawner::snapshot(const std::string& id, const std::string& name) {
  MOAT_ASSIGN(std::string base, call(init::Encoder().u8(kSnapshot).bytes(id).bytes(name).take(), nullptr));
  return static_cast<uint32_t>(std::strtoul(base.c_str(), nullptr, 10));
}

Status Spawner::pause(const std::string& id) {
  auto answer = call(init::Encoder().u8(kPause).bytes(id).take(), nullptr);
  if (!answer.ok()) return answer.error();
  return {};
}

Status Spawner::resume(const std::string& id) {
  auto answer = call(init::Encoder().u8(kResume).bytes(id).take(), nullptr);
  if (!answer.ok()) return answer.error();
  return {};
}

Status Spawner::destroy(const std::string& id) {
  auto answer = call(init::Encoder().u8(kDestroy).bytes(id).take(), nullptr);
  if (!answer.ok()) return answer.error();
  return {};
}

}  // namespace moat::backend::namespaces
