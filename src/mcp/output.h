#pragma once

#include <cstddef>
#include <string>

namespace moat::mcp {

// A model reads output as tokens: a long stream keeps its first `head` and
// last `tail` bytes, with a line saying how much was left out between.
constexpr size_t kOutputHead = 8 * 1024;
constexpr size_t kOutputTail = 24 * 1024;
struct Capped {
  std::string text;
  size_t omitted = 0;
};
Capped capOutput(const std::string& text, size_t head = kOutputHead, size_t tail = kOutputTail);

}  // namespace moat::mcp
