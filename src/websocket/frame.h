#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

// RFC 6455 framing, shared by moatd's WebSocket endpoints and the CLI's
// client: encoding, and an incremental parser that yields whole messages
// (fragments joined) and control frames.
namespace moat::websocket {

enum class Opcode : uint8_t {
  kContinuation = 0,
  kText = 1,
  kBinary = 2,
  kClose = 8,
  kPing = 9,
  kPong = 10,
};

// One frame with FIN set. Clients mask what they send; servers do not.
std::string encodeFrame(Opcode opcode, std::string_view payload, bool mask);
// A close frame's payload: the status code and a reason (cut to fit 123 bytes).
std::string closePayload(uint16_t code, std::string_view reason);

struct Message {
  Opcode opcode = Opcode::kBinary;  // kText, kBinary, or a control opcode
  std::string data;
};

class Parser {
 public:
  // expectMasked: a server requires masked frames from its clients, a client
  // refuses masked frames from the server. maxMessage bounds a message.
  Parser(bool expectMasked, size_t maxMessage) : expectMasked_(expectMasked), maxMessage_(maxMessage) {}
  void feed(const char* data, size_t size) { buffer_.append(data, size); }
  // The next complete message or control frame: true with `out` set, false
  // when more bytes are needed, an error (code "protocol") when the peer
  // broke the protocol.
  Result<bool> next(Message& out);

 private:
  bool expectMasked_;
  size_t maxMessage_;
  std::string buffer_;
  bool inMessage_ = false;
  Opcode messageOpcode_ = Opcode::kBinary;
  std::string message_;
};

}  // namespace moat::websocket
