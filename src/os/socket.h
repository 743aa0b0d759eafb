#pragma once

#include <chrono>
#include <string>
#include <utility>

#include "common/result.h"
#include "common/unique_fd.h"

// Unix-socket messages that carry a file descriptor (SCM_RIGHTS), and the
// end of a connection after its last answer.
namespace moat::os {

// Sends one message (a whole SEQPACKET packet, or bytes on a stream), with
// `fd` attached when it is >= 0.
Status sendWithFd(int socket, const std::string& data, int fd = -1);

// Receives one message of at most maxBytes; an attached fd lands in *fd
// (closed when fd is null). Error code "eof" when the peer has gone.
Result<std::string> receiveWithFd(int socket, UniqueFd* fd, size_t maxBytes = 1 << 16);

// A connected pair of unix stream sockets (close-on-exec).
struct SocketPair {
  UniqueFd first, second;
};
Result<SocketPair> streamSocketPair();
// The same with message boundaries kept (SOCK_SEQPACKET).
Result<SocketPair> seqpacketSocketPair();

// Writes to `socket` that cannot go on for `timeout` fail with EAGAIN
// (SO_SNDTIMEO), possibly after part of what was asked went.
Status setSendTimeout(int socket, std::chrono::milliseconds timeout);

// A stream connection to the unix socket at `path` (close-on-exec).
Result<UniqueFd> connectUnixStream(const std::string& path);

// A unix stream socket listening at `path` (made here, mode 0600 as the
// umask allows; close-on-exec), with room for `backlog` connections.
Result<UniqueFd> listenUnixStream(const std::string& path, int backlog);

// For a connection about to be closed after its final answer while the peer
// may still be sending its request (a body never read): ends the sending
// side, then reads and drops what arrives until the peer closes, `idle`
// passes without a byte, or `deadline`. Closing with unread data sends a
// reset, and a client still sending could lose the answer before reading it.
void drainBeforeClose(int socket, std::chrono::milliseconds idle, std::chrono::steady_clock::time_point deadline);

}  // namespace moat::os
