// Error codes: one list, stable names that survive a trip through the
// spawner's wire, and one HTTP status each.
#include "common/error_code.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "api/validation.h"

namespace moat {
namespace {

TEST(ErrorCode, EveryCodeHasItsOwnNameAndComesBackFromIt) {
  std::set<std::string> names;
  for (int i = 0; i <= static_cast<int>(Code::kInternal); ++i) {
    const Code code = static_cast<Code>(i);
    const std::string name = codeName(code);
    EXPECT_TRUE(names.insert(name).second) << name << " named twice";
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_"), std::string::npos) << name;
    auto back = codeFromName(name);
    ASSERT_TRUE(back) << name;
    EXPECT_EQ(*back, code) << name;
  }
  EXPECT_FALSE(codeFromName("no_such_code"));
  EXPECT_FALSE(codeFromName(""));
}

// Names clients match on: they stay what they were.
TEST(ErrorCode, TheNamesClientsSeeAreTheDocumentedOnes) {
  EXPECT_STREQ(codeName(Code::kNotFound), "not_found");
  EXPECT_STREQ(codeName(Code::kInvalidRequest), "invalid_request");
  EXPECT_STREQ(codeName(Code::kInvalidArgument), "invalid_argument");
  EXPECT_STREQ(codeName(Code::kCapacity), "capacity");
  EXPECT_STREQ(codeName(Code::kStdinFull), "stdin_full");
  EXPECT_STREQ(codeName(Code::kSyscall), "syscall");
}

TEST(ErrorCode, TheClientsMistakesAre4xxAndMoatdsOwn500) {
  EXPECT_EQ(api::httpStatus(Code::kInvalidRequest), 400);
  EXPECT_EQ(api::httpStatus(Code::kInvalidArgument), 400);
  EXPECT_EQ(api::httpStatus(Code::kUnknownField), 400);
  EXPECT_EQ(api::httpStatus(Code::kUnsupported), 400);
  EXPECT_EQ(api::httpStatus(Code::kNotFound), 404);
  EXPECT_EQ(api::httpStatus(Code::kConflict), 409);
  EXPECT_EQ(api::httpStatus(Code::kGone), 409);
  EXPECT_EQ(api::httpStatus(Code::kStdinFull), 409);
  EXPECT_EQ(api::httpStatus(Code::kCapacity), 429);
  EXPECT_EQ(api::httpStatus(Code::kUnavailable), 503);
  EXPECT_EQ(api::httpStatus(Code::kTimeout), 504);
  EXPECT_EQ(api::httpStatus(Code::kSyscall), 500);
  EXPECT_EQ(api::httpStatus(Code::kStore), 500);
  EXPECT_EQ(api::httpStatus(Code::kInternal), 500);
  auto e = api::fromError(Error::make(Code::kNotFound, "no environment x"));
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "not_found");
  EXPECT_EQ(e.message, "no environment x");
}

}  // namespace
}  // namespace moat
