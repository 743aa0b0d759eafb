#include "websocket/connection.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

namespace moat::websocket {

Connection::Connection(int fd, bool isClient, std::string pending, size_t maxMessage)
    : fd_(fd), client_(isClient), parser_(!isClient, maxMessage) {
  parser_.feed(pending.data(), pending.size());
}

void Connection::fail(const std::string& reason) {
  std::lock_guard<std::mutex> lock(writeMutex_);
  if (reason_.empty()) reason_ = reason;
}

std::string Connection::closeReason() {
  std::lock_guard<std::mutex> lock(writeMutex_);
  return reason_;
}

bool Connection::sendFrame(Opcode opcode, std::string_view payload) {
  std::string frame = encodeFrame(opcode, payload, client_);
  std::lock_guard<std::mutex> lock(writeMutex_);
  if (closeSent_) return false;
  if (opcode == Opcode::kClose) closeSent_ = true;
  size_t at = 0;
  while (at < frame.size()) {
    ssize_t n = ::send(fd_, frame.data() + at, frame.size() - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      closeSent_ = true;  // nothing more can go out
      if (reason_.empty()) reason_ = "the connection broke";
      return false;
    }
    at += static_cast<size_t>(n);
  }
  return true;
}

void Connection::abort() {
  fail("the connection was dropped");
  ::shutdown(fd_, SHUT_RDWR);
}

void Connection::close(uint16_t code, std::string_view reason) {
  (void)sendFrame(Opcode::kClose, closePayload(code, reason));
}

bool Connection::receive(Message& out) {
  for (;;) {
    auto next = parser_.next(out);
    if (!next.ok()) {
      fail(next.error().context);
      close(1002, next.error().context);
      return false;
    }
    if (next.value()) {
      switch (out.opcode) {
        case Opcode::kPing:
          (void)sendFrame(Opcode::kPong, out.data);
          continue;
        case Opcode::kPong:
          continue;
        case Opcode::kClose: {
          std::string why = out.data.size() > 2 ? out.data.substr(2) : "";
          fail(why.empty() ? "the peer closed the connection" : "the peer closed the connection: " + why);
          uint16_t code = out.data.size() >= 2 ? static_cast<uint16_t>((static_cast<unsigned char>(out.data[0]) << 8) |
                                                                       static_cast<unsigned char>(out.data[1]))
                                               : 1000;
          close(code, "");
          return false;
        }
        default:
          return true;
      }
    }
    char buf[65536];
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(n == 0 ? "the peer went away" : "the connection broke");
      return false;
    }
    parser_.feed(buf, static_cast<size_t>(n));
  }
}

}  // namespace moat::websocket
