#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

// DNS host names as TLS's server_name (RFC 6066 3) and certificates carry
// them, and the byte reads the egress wire parsers share.
namespace moat::egress {

inline constexpr size_t kMaxHostName = 253;
inline constexpr size_t kMaxLabel = 63;

// Lower-cases a plausible DNS host name (labels of [A-Za-z0-9_-] of at most
// kMaxLabel, no empty label, no trailing dot) into *out; false if it is not
// one.
bool normalizeHostName(std::string_view name, std::string* out);

// The byte at `i` as an unsigned number (the caller has checked the length).
inline unsigned byteAt(std::string_view data, size_t i) { return static_cast<uint8_t>(data[i]); }

}  // namespace moat::egress
