// Capacity: environments and memory against moatd's limits.
#include "manager/capacity.h"

#include <gtest/gtest.h>

namespace moat::manager {
namespace {

TEST(Capacity, TheEnvironmentLimitAndTheMemoryLimitEachRefuseWithTheirOwnWords) {
  Capacity capacity(2, 1024);
  ASSERT_TRUE(capacity.take(512).ok());
  auto memory = capacity.take(768);
  ASSERT_FALSE(memory.ok());
  EXPECT_EQ(memory.error().code, Code::kCapacity);
  EXPECT_EQ(memory.error().context, "at capacity: 512 of 1024 MB of memory are reserved");
  ASSERT_TRUE(capacity.take(512).ok());
  auto count = capacity.take(1);
  ASSERT_FALSE(count.ok());
  EXPECT_EQ(count.error().context, "at capacity: 2 environments exist");
  EXPECT_EQ(capacity.environments(), 2u);
  EXPECT_EQ(capacity.memoryMb(), 1024u);
}

TEST(Capacity, WhatIsReleasedCanBeTakenAgain) {
  Capacity capacity(1, 1024);
  ASSERT_TRUE(capacity.take(1024).ok());
  EXPECT_FALSE(capacity.take(1).ok());
  capacity.release(1024);
  EXPECT_EQ(capacity.environments(), 0u);
  EXPECT_EQ(capacity.memoryMb(), 0u);
  EXPECT_TRUE(capacity.take(1024).ok());
}

// After a restart the environments found running are counted whatever the
// limits now say; new ones wait until enough of them are gone.
TEST(Capacity, EnvironmentsFoundRunningCountBeyondTheLimitsAndHoldOffNewOnes) {
  Capacity capacity(1, 1024);
  capacity.count(1024);
  capacity.count(1024);
  EXPECT_EQ(capacity.environments(), 2u);
  EXPECT_FALSE(capacity.take(1).ok());
  capacity.release(1024);
  EXPECT_FALSE(capacity.take(1).ok()) << "one still there: at the limit of 1";
  capacity.release(1024);
  EXPECT_TRUE(capacity.take(1024).ok());
}

TEST(Capacity, AnEnvironmentLargerThanAllTheMemoryDoesNotWrapAround) {
  Capacity capacity(10, 1024);
  EXPECT_FALSE(capacity.take(UINT64_MAX).ok());
  EXPECT_FALSE(capacity.take(1025).ok());
  EXPECT_EQ(capacity.memoryMb(), 0u);
}

}  // namespace
}  // namespace moat::manager
