#include "init/identity_keeper.h"

#include <linux/capability.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "os/machine.h"
#include "os/process.h"
#include "os/security.h"
#include "os/socket.h"

namespace moat::init {
namespace {

// A request: one byte of the name's length, the name, then the seed. An
// answer: the errno of what failed (0: done).
constexpr size_t kMaxRequest = 1 + 64 + 512;

[[noreturn]] void serve(int socket) {
  char request[kMaxRequest];
  for (;;) {
    const ssize_t n = ::recv(socket, request, sizeof request, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(0);  // moat-init is gone
    int32_t err = 0;
    const size_t nameLength = static_cast<unsigned char>(request[0]);
    if (static_cast<size_t>(n) < 1 + nameLength || nameLength > 64) {
      err = EINVAL;
    } else {
      const std::string name(request + 1, nameLength);
      const std::string seed(request + 1 + nameLength, static_cast<size_t>(n) - 1 - nameLength);
      Status done = name.empty() ? Status{} : os::setHostname(name);
      if (done.ok() && !seed.empty()) done = os::addEntropy(seed);
      if (!done.ok()) err = done.error().sysErrno ? done.error().sysErrno : EIO;
    }
    (void)::send(socket, &err, sizeof err, MSG_NOSIGNAL);
  }
}

}  // namespace

Result<IdentityKeeper> IdentityKeeper::start() {
  MOAT_ASSIGN(os::SocketPair pair, os::seqpacketSocketPair());
  MOAT_ASSIGN(pid_t pid, os::forkProcess());
  if (pid == 0) {
    // Nothing of moat-init's but its own socket (as fd 3); SYS_ADMIN
    // alone, no way to more; it ends with moat-init.
    if (::dup2(pair.second.get(), 3) != 3 || !os::closeFrom(4).ok() || !os::setParentDeathSignal(SIGKILL).ok() ||
        !os::restrictCapabilities({CAP_SYS_ADMIN}).ok() || !os::setNoNewPrivs().ok()) {
      ::_exit(1);
    }
    serve(3);
  }
  pair.second.reset();
  // moat-init's loop waits on it: never for long.
  const timeval wait = {kWaitMs / 1000, (kWaitMs % 1000) * 1000};
  if (::setsockopt(pair.first.get(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait) != 0 ||
      ::setsockopt(pair.first.get(), SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait) != 0) {
    return Error::fromErrno("SO_RCVTIMEO");
  }
  return IdentityKeeper(std::move(pair.first), pid);
}

Status IdentityKeeper::renew(const std::string& hostname, const std::string& seed) {
  if (!socket_) return Error::make(Code::kUnavailable, "this guest's identity keeper is gone");
  if (hostname.size() > 64 || seed.size() > 512) return Error::make(Code::kInvalidArgument, "identity too large");
  std::string request(1, static_cast<char>(hostname.size()));
  request += hostname + seed;
  int32_t err = 0;
  ssize_t n = ::send(socket_.get(), request.data(), request.size(), MSG_NOSIGNAL);
  if (n >= 0) {
    do {
      n = ::recv(socket_.get(), &err, sizeof err, 0);
    } while (n < 0 && errno == EINTR);
  }
  if (n != static_cast<ssize_t>(sizeof err)) {
    // Stopped, killed or out of step: no answer of it is trusted again.
    const int why = n < 0 ? errno : EPIPE;
    if (pid_ > 0) ::kill(pid_, SIGKILL);
    socket_.reset();
    return Error::fromErrno("the identity keeper did not answer (a command may have stopped or killed it)",
                            why == EAGAIN ? ETIMEDOUT : why);
  }
  if (err != 0) return Error::fromErrno(hostname.empty() ? "reseed the random generator" : "rename and reseed", err);
  return {};
}

}  // namespace moat::init
