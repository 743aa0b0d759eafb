#pragma once

#include <cstddef>
#include <string>
#include <string_view>

// Reads the server name (SNI) out of the first bytes a client sends on a TLS
// connection, so the egress proxy can decide on a host before it terminates
// or forwards the connection. The bytes come from inside a sandbox: every
// length is checked against the bytes that are there, nothing is read past
// `data`, and the only allocation is bounded by kMaxClientHelloBytes.
namespace moat::egress {

enum class HelloStatus {
  kNeedMore,   // a prefix of what could be a ClientHello: read more, call again
  kNotTls,     // does not start like a TLS handshake record (e.g. plain HTTP)
  kMalformed,  // starts like TLS but breaks the format, or exceeds the bounds
  kOk,         // a whole ClientHello was parsed; *out is set
};

struct ClientHello {
  // The host_name from the server_name extension, lower-cased, or empty when
  // the client sent no SNI.
  std::string serverName;
};

// A ClientHello never needs more input than this (record headers included):
// past it the parser answers kMalformed, so a caller buffers at most this
// many bytes before it has an answer.
constexpr size_t kMaxClientHelloBytes = 64 * 1024;
// The largest TLS plaintext record (RFC 8446 5.1).
constexpr size_t kMaxTlsRecordPayload = 16 * 1024;

// Parses the ClientHello at the start of `data` (everything the client has
// sent so far). The handshake message may be split over several handshake
// records, as RFC 8446 5.1 allows; they are joined. Bytes after the
// ClientHello are ignored. `out` is written only on kOk.
//
// The host name must look like a DNS name: 1..253 bytes of [A-Za-z0-9._-],
// no empty label, no label over 63 bytes, no trailing dot (RFC 6066 3);
// anything else (NULs, spaces, '/', ...) is kMalformed, as are a second
// server_name extension or a second host_name in the list.
HelloStatus parseClientHello(std::string_view data, ClientHello* out);

const char* toString(HelloStatus status);

}  // namespace moat::egress
