#pragma once

#include <cstddef>
#include <string>

#include "common/result.h"

namespace moat {

// Lowercase hex of raw bytes.
std::string toHex(const unsigned char* data, size_t size);
// The value of one hex digit (either case), -1 for any other character.
int hexValue(char c);
// `bytes` random bytes from the kernel (getrandom).
Result<std::string> randomBytes(size_t bytes);
// `bytes` random bytes from the kernel, as lowercase hex (ids, tokens).
Result<std::string> randomHex(size_t bytes);

}  // namespace moat
