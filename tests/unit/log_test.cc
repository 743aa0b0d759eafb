// common/log: JSON lines that any JSON parser reads back, whatever a
// message holds; level names both ways.
#include "common/log.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace moat::log {
namespace {

TEST(Log, AJsonLineIsOneObjectWhateverTheMessageHolds) {
  std::string hostile = std::string("quote \" backslash \\ newline \n tab \t bell \x07 nul ") + '\0' + " end é";
  std::string line = jsonLine("2026-12-07T05:00:00.000Z", Level::kWarn, hostile,
                              {{"path", "/v1/\"x\"\n"}, {"status", "404", true}, {"duration_ms", "1.5", true}});
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line: " << line;
  auto j = nlohmann::json::parse(line.substr(0, line.size() - 1));
  EXPECT_EQ(j["time"], "2026-12-07T05:00:00.000Z");
  EXPECT_EQ(j["level"], "warn");
  EXPECT_EQ(j["msg"], hostile);
  EXPECT_EQ(j["path"], "/v1/\"x\"\n");
  EXPECT_EQ(j["status"], 404);
  EXPECT_DOUBLE_EQ(j["duration_ms"].get<double>(), 1.5);
}

// A text line is one line whatever the message holds: a client's path with
// a newline in it must not forge a line of moatd's.
TEST(Log, ATextLineIsOneLineWhateverTheMessageHolds) {
  std::string line = textLine("moatd", "access GET /a\nmoatd: forged\r\x1b[2J 401");
  EXPECT_EQ(line, "moatd: access GET /a\\x0amoatd: forged\\x0d\\x1b[2J 401\n");
  EXPECT_EQ(textLine("moatd", "serving é"), "moatd: serving é\n") << "UTF-8 passes as it is";
}

TEST(Log, LevelsByName) {
  Level l = Level::kInfo;
  for (const char* name : {"debug", "info", "warn", "error"}) {
    ASSERT_TRUE(levelNamed(name, l)) << name;
    EXPECT_STREQ(levelName(l), name);
  }
  EXPECT_FALSE(levelNamed("warning", l));
  EXPECT_FALSE(levelNamed("", l));
}

}  // namespace
}  // namespace moat::log
