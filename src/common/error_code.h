#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace moat {

// What kind of failure an Error is: what callers branch on, and (by its
// name) what the API answers with and the spawner sends back. One list for
// the whole code base; names are stable (clients match on them), and
// api/validation.cc maps each to its HTTP status.
enum class Code : uint8_t {
  kSyscall,            // "syscall": a system call failed; Error::sysErrno says how
  kInvalidArgument,    // "invalid_argument": a value that cannot be taken
  kInvalidRequest,     // "invalid_request": a request's field (Error::invalidField)
  kUnknownField,       // "unknown_field": a request names a field that does not exist
  kUsage,              // "usage": a command line that cannot be parsed
  kNotFound,           // "not_found"
  kConflict,           // "conflict": the state does not allow it now
  kGone,               // "gone": it ended meanwhile
  kCapacity,           // "capacity": a limit is reached; try later or free something
  kTooLarge,           // "too_large"
  kStdinFull,          // "stdin_full": a process's input buffer is full
  kTimeout,            // "timeout"
  kUnsupported,        // "unsupported": not on this host or in this mode
  kUnavailable,        // "unavailable": a part of moatd is not running
  kMissingDependency,  // "missing_dependency": a program or library the host lacks
  kUnauthorized,       // "unauthorized"
  kNoToken,            // "no_token": no credentials to send
  kRefused,            // "refused": the other side said no
  kUnreachable,        // "unreachable": the other side cannot be reached
  kInsecure,           // "insecure": a file or setting that would leak secrets
  kUntrustedPath,      // "untrusted_path": a path through a symlink inside an environment
  kBusy,               // "busy": a mount or process is in the way
  kCorrupt,            // "corrupt": stored data that fails its checks
  kNotNetns,           // "not_netns": a file that is not a network namespace
  kEnvironmentFailed,  // "environment_failed": an environment could not be set up
  kResource,           // "resource": the kernel ran out of something
  kExec,               // "exec": a new program's image could not be read
  kProtocol,           // "protocol": a peer broke the guest or spawner protocol
  kEof,                // "eof": the peer went away
  kTls,                // "tls"
  kStore,              // "store": the database failed
  kIo,                 // "io"
  kApi,                // "api": moatd answered a client with an error
  kToolFailed,         // "tool_failed": an MCP tool call failed
  kFailed,             // "failed": a step the message names did not work
  kInternal,           // "internal": a bug (last: tests walk the codes up to it)
};

// The stable name ("not_found").
const char* codeName(Code code);
// The code a name stands for (a spawner's answer); none for an unknown name.
std::optional<Code> codeFromName(std::string_view name);

}  // namespace moat
