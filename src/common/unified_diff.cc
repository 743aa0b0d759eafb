#include "common/unified_diff.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace moat {
namespace {

struct Line {
  std::string_view text;  // without its '\n'
  bool newline = true;    // false: the text's last line, without one
};

std::vector<Line> linesOf(const std::string& text) {
  std::vector<Line> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      lines.push_back({std::string_view(text).substr(start), false});
      break;
    }
    lines.push_back({std::string_view(text).substr(start, end - start), true});
    start = end + 1;
  }
  return lines;
}

bool same(const Line& a, const Line& b) { return a.text == b.text && a.newline == b.newline; }

enum class Op { kKeep, kDelete, kInsert };

// Myers' O((N+M)D) shortest edit script, kept as the V array of every step
// (at most maxEdits of them) to walk back from the end.
std::optional<std::vector<Op>> editScript(const std::vector<Line>& a, const std::vector<Line>& b, size_t maxEdits) {
  const long n = static_cast<long>(a.size());
  const long m = static_cast<long>(b.size());
  const long max = std::min<long>(n + m, static_cast<long>(maxEdits));
  const long offset = max + 1;
  std::vector<long> v(static_cast<size_t>(2 * max + 3), 0);
  // trace[d]: V as step d found it, diagonals -d..d only (what the walk back
  // reads), as 32-bit offsets: about maxEdits^2 * 4 bytes at worst.
  std::vector<std::vector<int32_t>> trace;
  long found = -1;
  for (long d = 0; d <= max && found < 0; ++d) {
    trace.emplace_back(v.begin() + (offset - d - 1), v.begin() + (offset + d + 2));
    for (long k = -d; k <= d; k += 2) {
      long x;
      if (k == -d || (k != d && v[static_cast<size_t>(offset + k - 1)] < v[static_cast<size_t>(offset + k + 1)])) {
        x = v[static_cast<size_t>(offset + k + 1)];  // down: an insertion
      } else {
        x = v[static_cast<size_t>(offset + k - 1)] + 1;  // right: a deletion
      }
      long y = x - k;
      while (x < n && y < m && same(a[static_cast<size_t>(x)], b[static_cast<size_t>(y)])) {
        ++x;
        ++y;
      }
      v[static_cast<size_t>(offset + k)] = x;
      if (x >= n && y >= m) {
        found = d;
        break;
      }
    }
  }
  if (found < 0) return std::nullopt;
  std::vector<Op> ops;
  long x = n;
  long y = m;
  for (long d = found; d > 0; --d) {
    const std::vector<int32_t>& slice = trace[static_cast<size_t>(d)];
    auto prev = [&](long k) { return static_cast<long>(slice[static_cast<size_t>(k + d + 1)]); };
    const long k = x - y;
    const long prevK = (k == -d || (k != d && prev(k - 1) < prev(k + 1))) ? k + 1 : k - 1;
    const long prevX = prev(prevK);
    const long prevY = prevX - prevK;
    while (x > prevX && y > prevY) {
      ops.push_back(Op::kKeep);
      --x;
      --y;
    }
    ops.push_back(x == prevX ? Op::kInsert : Op::kDelete);
    x = prevX;
    y = prevY;
  }
  while (x > 0 && y > 0) {
    ops.push_back(Op::kKeep);
    --x;
    --y;
  }
  std::reverse(ops.begin(), ops.end());
  return ops;
}

void appendLine(std::string& out, char mark, const Line& line) {
  out += mark;
  out.append(line.text);
  out += '\n';
  if (!line.newline) out += "\\ No newline at end of file\n";
}

// "start,count" as diff -u writes it (an empty range names the line before).
std::string range(size_t start, size_t count) {
  if (count == 0) return std::to_string(start) + ",0";
  if (count == 1) return std::to_string(start + 1);
  return std::to_string(start + 1) + "," + std::to_string(count);
}

}  // namespace

std::optional<std::string> unifiedDiff(const std::string& before, const std::string& after,
                                       const UnifiedDiffOptions& options) {
  const auto a = linesOf(before);
  const auto b = linesOf(after);
  auto script = editScript(a, b, options.maxEdits);
  if (!script) return std::nullopt;
  const std::vector<Op>& ops = *script;
  std::string out;
  size_t i = 0;
  while (i < ops.size()) {
    // The next change, and the hunk around it: changes closer than twice
    // the context share one.
    size_t first = i;
    while (first < ops.size() && ops[first] == Op::kKeep) ++first;
    if (first == ops.size()) break;
    size_t start = first >= options.context ? first - options.context : 0;
    size_t end = first;
    size_t keeps = 0;
    for (size_t j = first; j < ops.size(); ++j) {
      if (ops[j] == Op::kKeep) {
        if (++keeps > 2 * options.context) break;
      } else {
        keeps = 0;
        end = j + 1;
      }
    }
    end = std::min(ops.size(), end + options.context);
    // Where the hunk starts on each side.
    size_t ai = 0;
    size_t bi = 0;
    for (size_t j = 0; j < start; ++j) {
      if (ops[j] != Op::kInsert) ++ai;
      if (ops[j] != Op::kDelete) ++bi;
    }
    size_t aCount = 0;
    size_t bCount = 0;
    for (size_t j = start; j < end; ++j) {
      if (ops[j] != Op::kInsert) ++aCount;
      if (ops[j] != Op::kDelete) ++bCount;
    }
    out += "@@ -" + range(ai, aCount) + " +" + range(bi, bCount) + " @@\n";
    for (size_t j = start; j < end; ++j) {
      switch (ops[j]) {
        case Op::kKeep:
          appendLine(out, ' ', a[ai++]);
          ++bi;
          break;
        case Op::kDelete:
          appendLine(out, '-', a[ai++]);
          break;
        case Op::kInsert:
          appendLine(out, '+', b[bi++]);
          break;
      }
    }
    i = end;
  }
  return out;
}

bool looksLikeText(const std::string& data) {
  size_t i = 0;
  while (i < data.size()) {
    const unsigned char c = static_cast<unsigned char>(data[i]);
    if (c == 0) return false;
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > data.size()) return false;
    for (size_t j = 1; j < len; ++j) {
      if ((static_cast<unsigned char>(data[i + j]) & 0xc0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace moat
