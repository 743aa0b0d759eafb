#include <gtest/gtest.h>

#include "moat_process.h"

namespace moat::test {
namespace {

TEST(Run, PrintsAndExitsZero) {
  MOAT_REQUIRE_ROOT();
  auto r = runMoat({"run", "--", "python3", "-c", "print('hi')"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "hi\n");
}

}  // namespace
}  // namespace moat::test
