#pragma once

#include <cstddef>
#include <optional>
#include <string>

// A unified diff (diff -u) of two texts, line by line, for a person to
// review (the board's changes view). Bounded: texts that differ in more than
// maxEdits lines get no diff (too different to read as one).
namespace moat {

struct UnifiedDiffOptions {
  size_t context = 3;      // unchanged lines around each change
  size_t maxEdits = 1000;  // lines inserted plus deleted
};

// The hunks ("@@ -1,3 +1,4 @@" and their lines; "\ No newline at end of
// file" where a side ends without one), empty when the texts are equal;
// nothing when they differ in more than maxEdits lines.
std::optional<std::string> unifiedDiff(const std::string& before, const std::string& after,
                                       const UnifiedDiffOptions& options = {});

// Text a person can read as lines: no NUL byte, valid UTF-8.
bool looksLikeText(const std::string& data);

}  // namespace moat
