#pragma once

#include <string>

#include "common/result.h"

// Text encodings shared by moatd's API and the CLI: output that is not valid
// UTF-8 travels as base64.
namespace moat {

// Strict UTF-8: no overlong forms, surrogates or values past U+10FFFF.
bool isValidUtf8(const std::string& s);
std::string base64Encode(const std::string& s);
Result<std::string> base64Decode(const std::string& s);

}  // namespace moat
