#include "common/unified_diff.h"

#include <gtest/gtest.h>

#include <random>
#include <sstream>
#include <vector>

namespace moat {
namespace {

// Applies a unified diff to `before` (as patch(1) would, hunks in order).
std::string applyDiff(const std::string& before, const std::string& diff) {
  std::vector<std::string> lines;  // each with its '\n', if it had one
  for (size_t at = 0; at < before.size();) {
    size_t end = before.find('\n', at);
    end = end == std::string::npos ? before.size() : end + 1;
    lines.push_back(before.substr(at, end - at));
    at = end;
  }
  std::string out;
  size_t next = 0;  // the next line of `before` not yet copied
  std::istringstream in(diff);
  std::string line;
  std::string* last = nullptr;  // the output line a "\ No newline" mark applies to
  std::string dropped;
  while (std::getline(in, line)) {
    if (line.rfind("@@ -", 0) == 0) {
      size_t start = std::stoul(line.substr(4));
      size_t count = line.find(',') < line.find(' ', 4) ? std::stoul(line.substr(line.find(',') + 1)) : 1;
      size_t first = count == 0 ? start : start - 1;
      while (next < first) out += lines[next++];
      last = nullptr;
    } else if (line.rfind("\\ No newline", 0) == 0) {
      if (last != nullptr && !last->empty() && last->back() == '\n') last->pop_back();
    } else if (line[0] == ' ' || line[0] == '-') {
      EXPECT_EQ(lines.at(next).substr(0, line.size() - 1), line.substr(1)) << "context or deletion does not match";
      if (line[0] == ' ') {
        out += line.substr(1) + "\n";
        last = &out;
      } else {
        dropped = line;
        last = &dropped;
      }
      ++next;
    } else if (line[0] == '+') {
      out += line.substr(1) + "\n";
      last = &out;
    }
  }
  while (next < lines.size()) out += lines[next++];
  return out;
}

TEST(UnifiedDiff, EqualTextsHaveNoHunks) {
  EXPECT_EQ(unifiedDiff("a\nb\n", "a\nb\n"), "");
  EXPECT_EQ(unifiedDiff("", ""), "");
}

TEST(UnifiedDiff, OneChangedLineWithItsContext) {
  EXPECT_EQ(unifiedDiff("1\n2\n3\n4\n5\n6\n7\n8\n", "1\n2\n3\n4\nfive\n6\n7\n8\n"),
            "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n");
}

TEST(UnifiedDiff, AddedAndRemovedFilesAreOneHunkEach) {
  EXPECT_EQ(unifiedDiff("", "x\ny\n"), "@@ -0,0 +1,2 @@\n+x\n+y\n");
  EXPECT_EQ(unifiedDiff("x\n", ""), "@@ -1 +0,0 @@\n-x\n");
}

TEST(UnifiedDiff, AMissingFinalNewlineIsMarked) {
  EXPECT_EQ(unifiedDiff("a\nb", "a\nb\n"), "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n");
}

TEST(UnifiedDiff, DistantChangesAreSeparateHunks) {
  std::string before;
  for (int i = 0; i < 30; ++i) before += std::to_string(i) + "\n";
  std::string after = before;
  after.replace(after.find("2\n"), 2, "two\n");
  after.replace(after.find("\n27\n") + 1, 3, "twenty-seven\n");
  auto diff = unifiedDiff(before, after);
  ASSERT_TRUE(diff);
  EXPECT_EQ(std::count(diff->begin(), diff->end(), '@'), 8) << *diff;  // two hunk headers
  EXPECT_EQ(applyDiff(before, *diff), after);
}

TEST(UnifiedDiff, RandomEditsApplyBackToTheNewText) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::vector<std::string> lines;
    int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) lines.push_back(std::string(1, static_cast<char>('a' + rng() % 5)));
    auto join = [](const std::vector<std::string>& v, bool finalNewline) {
      std::string s;
      for (size_t i = 0; i < v.size(); ++i) s += v[i] + (i + 1 < v.size() || finalNewline ? "\n" : "");
      return s;
    };
    std::vector<std::string> edited = lines;
    int edits = static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      size_t at = edited.empty() ? 0 : rng() % (edited.size() + 1);
      if (rng() % 2 && at < edited.size()) {
        edited.erase(edited.begin() + static_cast<long>(at));
      } else {
        edited.insert(edited.begin() + static_cast<long>(at), std::string(1, static_cast<char>('a' + rng() % 5)));
      }
    }
    const std::string before = join(lines, rng() % 4 != 0);
    const std::string after = join(edited, rng() % 4 != 0);
    auto diff = unifiedDiff(before, after);
    ASSERT_TRUE(diff) << round;
    EXPECT_EQ(applyDiff(before, *diff), after) << "round " << round << "\n" << *diff;
  }
}

TEST(UnifiedDiff, TextsTooDifferentGetNoDiff) {
  std::string a;
  std::string b;
  for (int i = 0; i < 50; ++i) {
    a += "a" + std::to_string(i) + "\n";
    b += "b" + std::to_string(i) + "\n";
  }
  UnifiedDiffOptions few;
  few.maxEdits = 20;
  EXPECT_FALSE(unifiedDiff(a, b, few));
  EXPECT_TRUE(unifiedDiff(a, b));
}

TEST(UnifiedDiff, TextIsUtf8WithoutNul) {
  EXPECT_TRUE(looksLikeText("plain\n"));
  EXPECT_TRUE(looksLikeText("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(looksLikeText(std::string("a\0b", 3)));
  EXPECT_FALSE(looksLikeText("\xff\xfe"));
  EXPECT_FALSE(looksLikeText("\xc3"));
}

}  // namespace
}  // namespace moat
