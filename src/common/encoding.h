#pragma once

#include <string>

#include "common/result.h"

// Text encodings shared by moatd's API and the CLI: output that is not valid
// UTF-8 travels as base64.
namespace moat {

// Strict UTF-8: no overlong forms, surrogates or values past U+10FFFF.
bool isValidUtf8(const std::string& s);
// Whether `s` should travel in JSON as text: valid UTF-8, and not so full of
// control bytes (\u0001 is six bytes for one) that escaping grows it by more
// than a third (base64's cost) and 4 KiB. Such output goes as base64
// instead of growing sixfold.
bool travelsAsJsonText(const std::string& s);
std::string base64Encode(const std::string& s);
Result<std::string> base64Decode(const std::string& s);

}  // namespace moat
