#include "websocket/frame.h"

#include <sys/random.h>

#include <cstring>

namespace moat::websocket {
namespace {

Error protocol(const std::string& what) { return Error::make(Code::kProtocol, "WebSocket: " + what); }

bool isControl(uint8_t opcode) { return opcode >= 8; }

}  // namespace

std::string encodeFrame(Opcode opcode, std::string_view payload, bool mask) {
  std::string out;
  out.push_back(static_cast<char>(0x80 | static_cast<uint8_t>(opcode)));
  uint8_t maskBit = mask ? 0x80 : 0;
  size_t n = payload.size();
  if (n < 126) {
    out.push_back(static_cast<char>(maskBit | n));
  } else if (n <= 0xffff) {
    out.push_back(static_cast<char>(maskBit | 126));
    out.push_back(static_cast<char>(n >> 8));
    out.push_back(static_cast<char>(n & 0xff));
  } else {
    out.push_back(static_cast<char>(maskBit | 127));
    for (int shift = 56; shift >= 0; shift -= 8)
      out.push_back(static_cast<char>((static_cast<uint64_t>(n) >> shift) & 0xff));
  }
  if (!mask) {
    out.append(payload);
    return out;
  }
  unsigned char key[4];
  if (::getrandom(key, sizeof key, 0) != sizeof key) std::memset(key, 0x5a, sizeof key);
  out.append(reinterpret_cast<const char*>(key), 4);
  size_t start = out.size();
  out.append(payload);
  for (size_t i = 0; i < n; ++i) out[start + i] = static_cast<char>(out[start + i] ^ key[i % 4]);
  return out;
}

std::string closePayload(uint16_t code, std::string_view reason) {
  std::string out;
  out.push_back(static_cast<char>(code >> 8));
  out.push_back(static_cast<char>(code & 0xff));
  out.append(reason.substr(0, 123));
  return out;
}

Result<bool> Parser::next(Message& out) {
  for (;;) {
    const auto* b = reinterpret_cast<const unsigned char*>(buffer_.data());
    size_t have = buffer_.size();
    if (have < 2) return false;
    bool fin = b[0] & 0x80;
    if (b[0] & 0x70) return protocol("reserved bits set (no extension was negotiated)");
    uint8_t opcode = b[0] & 0x0f;
    bool masked = b[1] & 0x80;
    uint64_t length = b[1] & 0x7f;
    size_t pos = 2;
    if (length == 126) {
      if (have < 4) return false;
      length = (static_cast<uint64_t>(b[2]) << 8) | b[3];
      pos = 4;
    } else if (length == 127) {
      if (have < 10) return false;
      length = 0;
      for (int i = 0; i < 8; ++i) length = (length << 8) | b[2 + i];
      pos = 10;
    }
    if (masked != expectMasked_) {
      return protocol(expectMasked_ ? "client frames must be masked" : "server frames must not be masked");
    }
    if (opcode != 0 && opcode != 1 && opcode != 2 && opcode != 8 && opcode != 9 && opcode != 10) {
      return protocol("unknown opcode " + std::to_string(opcode));
    }
    if (isControl(opcode) && (!fin || length > 125)) return protocol("control frames must be whole and short");
    if (length > maxMessage_ || (!isControl(opcode) && message_.size() + length > maxMessage_)) {
      return protocol("message larger than " + std::to_string(maxMessage_) + " bytes");
    }
    size_t maskAt = pos;
    if (masked) pos += 4;
    if (have < pos + length) return false;
    std::string payload = buffer_.substr(pos, static_cast<size_t>(length));
    if (masked) {
      for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(payload[i] ^ b[maskAt + i % 4]);
    }
    buffer_.erase(0, pos + static_cast<size_t>(length));
    if (isControl(opcode)) {
      out.opcode = static_cast<Opcode>(opcode);
      out.data = std::move(payload);
      return true;
    }
    if (opcode == 0) {
      if (!inMessage_) return protocol("continuation frame without a message");
    } else {
      if (inMessage_) return protocol("new message inside a fragmented one");
      inMessage_ = true;
      messageOpcode_ = static_cast<Opcode>(opcode);
      message_.clear();
    }
    message_ += payload;
    if (fin) {
      inMessage_ = false;
      out.opcode = messageOpcode_;
      out.data = std::move(message_);
      message_.clear();
      return true;
    }
  }
}

}  // namespace moat::websocket
