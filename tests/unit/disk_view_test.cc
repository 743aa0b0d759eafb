// What statfs shows of an environment's root: its volume's limit and usage
// in the file system's blocks (init/disk_view.cc).
#include "init/disk_view.h"

#include <gtest/gtest.h>

namespace moat::init {
namespace {

constexpr uint64_t kMiB = 1u << 20;

struct statfs pool(uint64_t blocks, uint64_t freeBlocks, uint64_t availBlocks) {
  struct statfs st {};
  st.f_type = 0x9123683E;
  st.f_bsize = 4096;
  st.f_frsize = 4096;
  st.f_blocks = blocks;
  st.f_bfree = freeBlocks;
  st.f_bavail = availBlocks;
  st.f_files = 0;
  st.f_namelen = 255;
  return st;
}

TEST(DiskView, TotalIsTheLimitAndFreeIsWhatTheVolumeHasLeft) {
  auto real = pool(25u << 18, 20u << 18, 19u << 18);  // 25 GiB pool, 20 free
  auto v = diskView(real, 100 * kMiB, 30 * kMiB);
  EXPECT_EQ(v.f_blocks, 100 * kMiB / 4096);
  EXPECT_EQ(v.f_bfree, 70 * kMiB / 4096);
  EXPECT_EQ(v.f_bavail, 70 * kMiB / 4096);
  // Everything else is the real answer's.
  EXPECT_EQ(v.f_type, real.f_type);
  EXPECT_EQ(v.f_bsize, 4096);
  EXPECT_EQ(v.f_namelen, 255);
}

TEST(DiskView, UsedBytesRoundUpToABlock) {
  auto v = diskView(pool(1u << 20, 1u << 19, 1u << 19), 8192, 1);
  EXPECT_EQ(v.f_blocks, 2u);
  EXPECT_EQ(v.f_bfree, 1u);
}

TEST(DiskView, AVolumeOverItsLimitHasNothingFree) {
  // Usage can pass the limit (btrfs accounts at commit): free is 0, not a wrap.
  auto v = diskView(pool(1u << 20, 1u << 19, 1u << 19), 10 * kMiB, 11 * kMiB);
  EXPECT_EQ(v.f_blocks, 10 * kMiB / 4096);
  EXPECT_EQ(v.f_bfree, 0u);
  EXPECT_EQ(v.f_bavail, 0u);
}

TEST(DiskView, FreeIsNeverMoreThanThePoolHas) {
  // A fuller pool than the limit suggests: the pool's free space is what a write gets.
  auto v = diskView(pool(1u << 20, 100, 50), 100 * kMiB, 0);
  EXPECT_EQ(v.f_blocks, 100 * kMiB / 4096);
  EXPECT_EQ(v.f_bfree, 100u);
  EXPECT_EQ(v.f_bavail, 50u);
}

TEST(DiskView, NoLimitIsTheRealAnswer) {
  auto real = pool(1000, 600, 500);
  auto v = diskView(real, 0, 12345);
  EXPECT_EQ(v.f_blocks, 1000u);
  EXPECT_EQ(v.f_bfree, 600u);
  EXPECT_EQ(v.f_bavail, 500u);
}

TEST(DiskView, TheUnitIsTheFragmentSizeWhenGiven) {
  auto real = pool(1000, 600, 500);
  real.f_bsize = 65536;
  real.f_frsize = 1024;
  auto v = diskView(real, kMiB, 0);
  EXPECT_EQ(v.f_blocks, 1024u);
  real.f_frsize = 0;  // none: the block size
  v = diskView(real, kMiB, 0);
  EXPECT_EQ(v.f_blocks, 16u);
}

}  // namespace
}  // namespace moat::init
