#include "common/error_code.h"

#include <iterator>

#include "common/enum_names.h"

namespace moat {

namespace {

constexpr EnumName<Code> kCodes[] = {
    {Code::kSyscall, "syscall"},
    {Code::kInvalidArgument, "invalid_argument"},
    {Code::kInvalidRequest, "invalid_request"},
    {Code::kUnknownField, "unknown_field"},
    {Code::kUsage, "usage"},
    {Code::kNotFound, "not_found"},
    {Code::kConflict, "conflict"},
    {Code::kGone, "gone"},
    {Code::kCapacity, "capacity"},
    {Code::kTooLarge, "too_large"},
    {Code::kStdinFull, "stdin_full"},
    {Code::kTimeout, "timeout"},
    {Code::kUnsupported, "unsupported"},
    {Code::kUnavailable, "unavailable"},
    {Code::kMissingDependency, "missing_dependency"},
    {Code::kUnauthorized, "unauthorized"},
    {Code::kNoToken, "no_token"},
    {Code::kRefused, "refused"},
    {Code::kUnreachable, "unreachable"},
    {Code::kInsecure, "insecure"},
    {Code::kUntrustedPath, "untrusted_path"},
    {Code::kBusy, "busy"},
    {Code::kCorrupt, "corrupt"},
    {Code::kNotNetns, "not_netns"},
    {Code::kEnvironmentFailed, "environment_failed"},
    {Code::kResource, "resource"},
    {Code::kExec, "exec"},
    {Code::kProtocol, "protocol"},
    {Code::kEof, "eof"},
    {Code::kTls, "tls"},
    {Code::kStore, "store"},
    {Code::kIo, "io"},
    {Code::kApi, "api"},
    {Code::kToolFailed, "tool_failed"},
    {Code::kFailed, "failed"},
    {Code::kInternal, "internal"},
};
static_assert(std::size(kCodes) == static_cast<size_t>(Code::kInternal) + 1, "a code without a name");

}  // namespace

const char* codeName(Code code) { return nameIn(kCodes, code, "internal"); }

std::optional<Code> codeFromName(std::string_view name) { return valueNamed(kCodes, name); }

}  // namespace moat
