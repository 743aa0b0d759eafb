#include "mcp/output.h"

namespace moat::mcp {
namespace {

// Moves a cut off the middle of a UTF-8 sequence (continuation bytes).
size_t backToBoundary(const std::string& s, size_t at) {
  while (at > 0 && at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) --at;
  return at;
}

}  // namespace

Capped capOutput(const std::string& text, size_t head, size_t tail) {
  if (text.size() <= head + tail) return {text, 0};
  size_t headEnd = backToBoundary(text, head);
  size_t tailStart = backToBoundary(text, text.size() - tail);
  size_t omitted = tailStart - headEnd;
  return {
      text.substr(0, headEnd) + "\n[... " + std::to_string(omitted) + " bytes omitted ...]\n" + text.substr(tailStart),
      omitted};
}

}  // namespace moat::mcp
