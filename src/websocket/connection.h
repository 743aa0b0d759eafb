#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "websocket/frame.h"

namespace moat::websocket {

// One WebSocket after its handshake, over a connected socket. One thread
// receives; any thread may send (frames never interleave). Pings are
// answered inside receive().
//
// Why not Boost.Beast's websocket::stream (moatd already uses Beast for
// HTTP): a shell's connection is read by one thread (the viewer's keys and
// resizes) while others write to it (the terminal's output, pings), and
// abort() ends a blocked read from a third. Beast's stream allows none of
// that for its blocking calls ("Shared objects: Unsafe"; its read also
// writes, to answer pings and closes, and a close() during a read asserts),
// so it would need the whole relay rewritten on async operations and a
// strand. This framing is small, and tests/unit/websocket_frame_test.cc
// holds it to RFC 6455.
class Connection {
 public:
  // fd stays owned by the caller. `pending`: bytes already read past the
  // handshake. A client masks what it sends.
  Connection(int fd, bool isClient, std::string pending = {}, size_t maxMessage = 1u << 20);

  // The next text or binary message; false once the peer closed or the
  // connection failed (closeReason() says which).
  bool receive(Message& out);
  bool sendText(std::string_view data) { return sendFrame(Opcode::kText, data); }
  bool sendBinary(std::string_view data) { return sendFrame(Opcode::kBinary, data); }
  bool ping() { return sendFrame(Opcode::kPing, {}); }
  // Sends a close frame (once). The peer's answer ends receive().
  void close(uint16_t code, std::string_view reason);
  std::string closeReason();
  // Ends the connection now, without a closing handshake: a blocked
  // receive() returns false.
  void abort();

 private:
  bool sendFrame(Opcode opcode, std::string_view payload);
  void fail(const std::string& reason);

  int fd_;
  bool client_;
  Parser parser_;
  std::mutex writeMutex_;  // also guards closeSent_ and reason_
  bool closeSent_ = false;
  std::string reason_;
};

}  // namespace moat::websocket
