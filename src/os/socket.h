#pragma once

#include <string>

#include "common/result.h"
#include "common/unique_fd.h"

// Unix-socket messages that carry a file descriptor (SCM_RIGHTS).
namespace moat::os {

// Sends one message (a whole SEQPACKET packet, or bytes on a stream), with
// `fd` attached when it is >= 0.
Status sendWithFd(int socket, const std::string& data, int fd = -1);

// Receives one message of at most maxBytes; an attached fd lands in *fd
// (closed when fd is null). Error code "eof" when the peer has gone.
Result<std::string> receiveWithFd(int socket, UniqueFd* fd, size_t maxBytes = 1 << 16);

}  // namespace moat::os
