// What output travels as JSON text and what as base64.
#include "common/encoding.h"

#include <gtest/gtest.h>

#include <string>

namespace moat {
namespace {

TEST(Encoding, ReadableTextTravelsAsText) {
  EXPECT_TRUE(travelsAsJsonText(""));
  EXPECT_TRUE(travelsAsJsonText("hello\nworld\n"));
  EXPECT_TRUE(travelsAsJsonText("tabs\tand \"quotes\" and \\ and ünïcødé\n"));
  // Some control bytes among text: fine.
  EXPECT_TRUE(travelsAsJsonText("\x1b[31mred\x1b[0m plain text that is long enough\n"));
}

TEST(Encoding, NonUtf8OrMostlyControlBytesTravelAsBase64) {
  EXPECT_FALSE(travelsAsJsonText("\xff\xfe"));
  // A megabyte of NULs is valid UTF-8 but six megabytes as JSON text.
  EXPECT_FALSE(travelsAsJsonText(std::string(1 << 20, '\0')));
  // The line: \u escapes growing it by more than a third and 4 KiB.
  EXPECT_FALSE(travelsAsJsonText(std::string(1000, '\x01') + std::string(1000, 'a')));  // 5000 extra for 2000
  EXPECT_TRUE(travelsAsJsonText(std::string(1000, '\x01') + std::string(14000, 'a')));  // 5000 extra for 15000
  EXPECT_TRUE(travelsAsJsonText(std::string(800, '\x01')));  // 4000 extra: small enough as it is
  // Newlines, tabs and quotes cost a byte each: text however many there are.
  EXPECT_TRUE(travelsAsJsonText(std::string(100000, '\n')));
  EXPECT_TRUE(travelsAsJsonText(std::string(100000, '"')));
  EXPECT_TRUE(travelsAsJsonText("\n"));
  EXPECT_TRUE(travelsAsJsonText("a\tb\n"));
}

}  // namespace
}  // namespace moat
