#include "os/socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace moat::os {

Result<SocketPair> streamSocketPair() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return Error::fromErrno("socketpair");
  return SocketPair{UniqueFd(pair[0]), UniqueFd(pair[1])};
}

Result<SocketPair> seqpacketSocketPair() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return Error::fromErrno("socketpair");
  return SocketPair{UniqueFd(pair[0]), UniqueFd(pair[1])};
}

Status setSendTimeout(int socket, std::chrono::milliseconds timeout) {
  struct timeval tv = {static_cast<time_t>(timeout.count() / 1000),
                       static_cast<suseconds_t>(timeout.count() % 1000) * 1000};
  if (::setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) return Error::fromErrno("SO_SNDTIMEO");
  return {};
}

Status sendWithFd(int socket, const std::string& data, int fd) {
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
    if (::sendmsg(socket, &msg, MSG_NOSIGNAL) >= 0) return {};
    if (errno != EINTR) return Error::fromErrno("sendmsg");
  }
}

Result<std::string> receiveWithFd(int socket, UniqueFd* fd, size_t maxBytes) {
  std::string data(maxBytes, '\0');
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
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Error::fromErrno("recvmsg");
  const bool truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
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
  if (n == 0) return Error::make(Code::kEof, "peer closed the socket");
  if (truncated) {
    // The kernel dropped a descriptor that came with the message (no room
    // for it: this process is at its descriptor limit).
    return Error::make(Code::kResource,
                       "recvmsg: a descriptor sent with the message was lost (at the open file limit?)");
  }
  data.resize(static_cast<size_t>(n));
  return data;
}

void drainBeforeClose(int socket, std::chrono::milliseconds idle, std::chrono::steady_clock::time_point deadline) {
  ::shutdown(socket, SHUT_WR);
  char sink[16384];
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    auto wait = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now), idle);
    if (wait.count() <= 0) return;
    pollfd p{socket, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(wait.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return;  // quiet for `idle`, or an error
    ssize_t n = ::recv(socket, sink, sizeof sink, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // the peer closed (or reset)
  }
}

namespace {

// A unix stream socket (close-on-exec) and the address of `path`.
Result<std::pair<UniqueFd, sockaddr_un>> unixStreamFor(const std::string& path) {
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return Error::fromErrno("socket path " + path, ENAMETOOLONG);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Error::fromErrno("socket");
  return std::make_pair(std::move(fd), addr);
}

}  // namespace

Result<UniqueFd> listenUnixStream(const std::string& path, int backlog) {
  MOAT_ASSIGN(auto made, unixStreamFor(path));
  auto& [fd, addr] = made;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return Error::fromErrno("bind " + path);
  if (::chmod(path.c_str(), 0600) != 0) return Error::fromErrno("chmod " + path);
  if (::listen(fd.get(), backlog) != 0) return Error::fromErrno("listen " + path);
  return std::move(fd);
}

Result<UniqueFd> connectUnixStream(const std::string& path) {
  MOAT_ASSIGN(auto made, unixStreamFor(path));
  auto& [fd, addr] = made;
  while (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno != EINTR) return Error::fromErrno("connect " + path);
  }
  return std::move(fd);
}

}  // namespace moat::os
