#include "common/error_code.h"

#include <unordered_map>

namespace moat {

const char* codeName(Code code) {
  switch (code) {
    case Code::kSyscall:
      return "syscall";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kInvalidRequest:
      return "invalid_request";
    case Code::kUnknownField:
      return "unknown_field";
    case Code::kUsage:
      return "usage";
    case Code::kNotFound:
      return "not_found";
    case Code::kConflict:
      return "conflict";
    case Code::kGone:
      return "gone";
    case Code::kCapacity:
      return "capacity";
    case Code::kTooLarge:
      return "too_large";
    case Code::kStdinFull:
      return "stdin_full";
    case Code::kTimeout:
      return "timeout";
    case Code::kUnsupported:
      return "unsupported";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kMissingDependency:
      return "missing_dependency";
    case Code::kUnauthorized:
      return "unauthorized";
    case Code::kNoToken:
      return "no_token";
    case Code::kRefused:
      return "refused";
    case Code::kUnreachable:
      return "unreachable";
    case Code::kInsecure:
      return "insecure";
    case Code::kUntrustedPath:
      return "untrusted_path";
    case Code::kBusy:
      return "busy";
    case Code::kCorrupt:
      return "corrupt";
    case Code::kNotNetns:
      return "not_netns";
    case Code::kEnvironmentFailed:
      return "environment_failed";
    case Code::kResource:
      return "resource";
    case Code::kExec:
      return "exec";
    case Code::kProtocol:
      return "protocol";
    case Code::kEof:
      return "eof";
    case Code::kTls:
      return "tls";
    case Code::kStore:
      return "store";
    case Code::kIo:
      return "io";
    case Code::kApi:
      return "api";
    case Code::kToolFailed:
      return "tool_failed";
    case Code::kFailed:
      return "failed";
    case Code::kInternal:
      return "internal";
  }
  return "internal";
}

std::optional<Code> codeFromName(std::string_view name) {
  static const std::unordered_map<std::string_view, Code> byName = {
      {"syscall", Code::kSyscall},
      {"invalid_argument", Code::kInvalidArgument},
      {"invalid_request", Code::kInvalidRequest},
      {"unknown_field", Code::kUnknownField},
      {"usage", Code::kUsage},
      {"not_found", Code::kNotFound},
      {"conflict", Code::kConflict},
      {"gone", Code::kGone},
      {"capacity", Code::kCapacity},
      {"too_large", Code::kTooLarge},
      {"stdin_full", Code::kStdinFull},
      {"timeout", Code::kTimeout},
      {"unsupported", Code::kUnsupported},
      {"unavailable", Code::kUnavailable},
      {"missing_dependency", Code::kMissingDependency},
      {"unauthorized", Code::kUnauthorized},
      {"no_token", Code::kNoToken},
      {"refused", Code::kRefused},
      {"unreachable", Code::kUnreachable},
      {"insecure", Code::kInsecure},
      {"untrusted_path", Code::kUntrustedPath},
      {"busy", Code::kBusy},
      {"corrupt", Code::kCorrupt},
      {"not_netns", Code::kNotNetns},
      {"environment_failed", Code::kEnvironmentFailed},
      {"resource", Code::kResource},
      {"exec", Code::kExec},
      {"protocol", Code::kProtocol},
      {"eof", Code::kEof},
      {"tls", Code::kTls},
      {"store", Code::kStore},
      {"io", Code::kIo},
      {"api", Code::kApi},
      {"tool_failed", Code::kToolFailed},
      {"failed", Code::kFailed},
      {"internal", Code::kInternal},
  };
  auto it = byName.find(name);
  if (it == byName.end()) return std::nullopt;
  return it->second;
}

}  // namespace moat
