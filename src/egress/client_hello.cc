#include "egress/client_hello.h"

#include <cstdint>

#include "egress/host_name.h"

namespace moat::egress {
namespace {

constexpr uint8_t kContentHandshake = 22;
constexpr uint8_t kHandshakeClientHello = 1;
constexpr uint16_t kExtensionServerName = 0;
constexpr uint8_t kNameTypeHostName = 0;
constexpr size_t kRecordHeader = 5;
constexpr size_t kHandshakeHeader = 4;

// Reads big-endian integers and slices off a view; every read checks the
// bytes left first and fails (false) without moving when they are short.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  size_t remaining() const { return data_.size(); }
  bool empty() const { return data_.empty(); }

  bool u8(uint8_t* v) {
    if (data_.size() < 1) return false;
    *v = static_cast<uint8_t>(data_[0]);
    data_.remove_prefix(1);
    return true;
  }
  bool u16(uint16_t* v) {
    if (data_.size() < 2) return false;
    *v = static_cast<uint16_t>(byte(0) << 8 | byte(1));
    data_.remove_prefix(2);
    return true;
  }
  bool bytes(size_t n, std::string_view* v) {
    if (data_.size() < n) return false;
    *v = data_.substr(0, n);
    data_.remove_prefix(n);
    return true;
  }
  bool skip(size_t n) {
    std::string_view ignored;
    return bytes(n, &ignored);
  }
  // A vector with a 1- or 2-byte length prefix.
  bool vector8(std::string_view* v) {
    uint8_t n;
    return u8(&n) && bytes(n, v);
  }
  bool vector16(std::string_view* v) {
    uint16_t n;
    return u16(&n) && bytes(n, v);
  }

 private:
  unsigned byte(size_t i) const { return static_cast<uint8_t>(data_[i]); }
  std::string_view data_;
};

// server_name extension data (RFC 6066 3): a non-empty list of
// (name_type, opaque name<1..2^16-1>). Only host_name is defined; other
// types are skipped by their length, a second host_name is refused.
bool parseServerName(std::string_view extension, std::string* name) {
  Reader r(extension);
  std::string_view list;
  if (!r.vector16(&list) || !r.empty() || list.empty()) return false;
  Reader entries(list);
  bool seen = false;
  while (!entries.empty()) {
    uint8_t type;
    std::string_view value;
    if (!entries.u8(&type) || !entries.vector16(&value) || value.empty()) return false;
    if (type != kNameTypeHostName) continue;
    if (seen || !normalizeHostName(value, name)) return false;
    seen = true;
  }
  return true;
}

// The ClientHello body (RFC 8446 4.1.2; the same layout since TLS 1.0).
HelloStatus parseBody(std::string_view body, ClientHello* out) {
  Reader r(body);
  uint16_t legacyVersion;
  std::string_view sessionId, cipherSuites, compression;
  if (!r.u16(&legacyVersion) || (legacyVersion >> 8) != 3) return HelloStatus::kMalformed;
  if (!r.skip(32)) return HelloStatus::kMalformed;  // random
  if (!r.vector8(&sessionId) || sessionId.size() > 32) return HelloStatus::kMalformed;
  if (!r.vector16(&cipherSuites) || cipherSuites.empty() || cipherSuites.size() % 2 != 0) {
    return HelloStatus::kMalformed;
  }
  if (!r.vector8(&compression) || compression.empty()) return HelloStatus::kMalformed;

  std::string serverName;
  // Extensions are optional before TLS 1.3; without them there is no SNI.
  if (!r.empty()) {
    std::string_view extensions;
    if (!r.vector16(&extensions) || !r.empty()) return HelloStatus::kMalformed;
    Reader e(extensions);
    bool seenServerName = false;
    while (!e.empty()) {
      uint16_t type;
      std::string_view data;
      if (!e.u16(&type) || !e.vector16(&data)) return HelloStatus::kMalformed;
      if (type != kExtensionServerName) continue;
      if (seenServerName || !parseServerName(data, &serverName)) return HelloStatus::kMalformed;
      seenServerName = true;
    }
  }
  out->serverName = std::move(serverName);
  return HelloStatus::kOk;
}

}  // namespace

HelloStatus parseClientHello(std::string_view data, ClientHello* out) {
  if (data.empty()) return HelloStatus::kNeedMore;
  if (byteAt(data, 0) != kContentHandshake) return HelloStatus::kNotTls;
  if (data.size() >= 2 && byteAt(data, 1) != 3) return HelloStatus::kNotTls;

  // Joins the handshake fragments of consecutive records until the whole
  // ClientHello is there. Usually it fits one record and `message` is a view
  // into `data`; `joined` holds the copy otherwise (at most
  // kMaxClientHelloBytes, enforced through the record bound below).
  std::string joined;
  std::string_view message;
  size_t pos = 0;
  for (;;) {
    if (data.size() - pos < kRecordHeader) {
      // Refuse a later record of the wrong type as soon as its first byte
      // is there rather than after its header.
      if (pos < data.size() && byteAt(data, pos) != kContentHandshake) {
        return HelloStatus::kMalformed;
      }
      return HelloStatus::kNeedMore;
    }
    if (byteAt(data, pos) != kContentHandshake || byteAt(data, pos + 1) != 3) {
      return HelloStatus::kMalformed;  // a record interleaved inside the hello
    }
    size_t length = byteAt(data, pos + 3) << 8 | byteAt(data, pos + 4);
    // Zero-length handshake fragments are forbidden (RFC 8446 5.1).
    if (length == 0 || length > kMaxTlsRecordPayload) return HelloStatus::kMalformed;
    if (pos + kRecordHeader + length > kMaxClientHelloBytes) return HelloStatus::kMalformed;
    // The first message must be a ClientHello: say so without waiting.
    if (pos == 0 && data.size() > kRecordHeader && byteAt(data, kRecordHeader) != kHandshakeClientHello) {
      return HelloStatus::kMalformed;
    }
    if (data.size() - pos - kRecordHeader < length) return HelloStatus::kNeedMore;

    std::string_view fragment = data.substr(pos + kRecordHeader, length);
    pos += kRecordHeader + length;
    if (message.empty()) {
      message = fragment;
    } else {
      if (joined.empty()) joined.assign(message);
      joined.append(fragment);
      message = joined;
    }
    if (message.size() < kHandshakeHeader) continue;
    if (byteAt(message, 0) != kHandshakeClientHello) return HelloStatus::kMalformed;
    size_t bodyLength = byteAt(message, 1) << 16 | byteAt(message, 2) << 8 | byteAt(message, 3);
    // The records carrying it would not fit the bound either.
    if (kHandshakeHeader + bodyLength > kMaxClientHelloBytes) return HelloStatus::kMalformed;
    if (message.size() - kHandshakeHeader < bodyLength) continue;
    return parseBody(message.substr(kHandshakeHeader, bodyLength), out);
  }
}

const char* toString(HelloStatus status) {
  switch (status) {
    case HelloStatus::kNeedMore:
      return "need more";
    case HelloStatus::kNotTls:
      return "not tls";
    case HelloStatus::kMalformed:
      return "malformed";
    case HelloStatus::kOk:
      return "ok";
  }
  return "unknown";
}

}  // namespace moat::egress
