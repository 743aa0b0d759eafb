// moatd --warm-pool values: a count, or a count and a spec checked as a
// create's is.
#include "daemon/warm_pool_flag.h"

#include <gtest/gtest.h>

namespace moat::daemon {
namespace {

TEST(WarmPoolFlag, ACountAloneIsADefaultSpecPool) {
  auto p = parseWarmPoolFlag("4", 8192);
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->size, 4u);
  EXPECT_EQ(p->templateName, "host");
  EXPECT_EQ(p->cpus, 0);
  EXPECT_EQ(p->ramMb, 0u);
}

TEST(WarmPoolFlag, ASpecSetsWhatItNamesAndLeavesTheRestDefault) {
  auto p = parseWarmPoolFlag("2:cpus=0.5,ram_mb=256,storage_gb=1.5,pids=64,template=/tmp", 8192);
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->size, 2u);
  EXPECT_EQ(p->cpus, 0.5);
  EXPECT_EQ(p->ramMb, 256u);
  EXPECT_EQ(p->storageGb, 1.5);
  EXPECT_EQ(p->pids, 64u);
  EXPECT_EQ(p->templateName, "/tmp");
  auto q = parseWarmPoolFlag("1:ram_mb=512", 8192);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->ramMb, 512u);
  EXPECT_EQ(q->pids, 0u);
}

TEST(WarmPoolFlag, BadValuesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "a number from 0 to 9999"},
      {"-1", "a number from 0 to 9999"},
      {"10000", "a number from 0 to 9999"},
      {"2x", "a number from 0 to 9999"},
      {"2:", "is not key=value"},
      {"2:ram_mb", "is not key=value"},
      {"2:=5", "is not key=value"},
      {"2:ram_mb=8", "ram_mb"},
      {"2:ram_mb=9000", "ram_mb"},  // beyond the machine's memory (8192 here)
      {"2:pids=1.5", "pids"},
      {"2:cpus=fast", "cpus"},
      {"2:bogus=1", "bogus"},
      {"2:cpus=1,cpus=2", "cpus given twice"},
      {"2:template=relative/dir", "template"},
      {"2:template=/nonexistent-moat-dir", "template"},
      {"2:template=host,template=host", "template given twice"},
  };
  for (const auto& [value, says] : cases) {
    auto p = parseWarmPoolFlag(value, 8192);
    ASSERT_FALSE(p.ok()) << "'" << value << "' was accepted";
    EXPECT_NE(p.error().message().find(says), std::string::npos) << value << ": " << p.error().message();
  }
}

}  // namespace
}  // namespace moat::daemon
