// WarmPools: which pool is short, claims, back-off, and what the metrics see.
#include "manager/warm_pools.h"

#include <gtest/gtest.h>

namespace moat::manager {
namespace {

WarmPool pool(uint64_t ramMb, size_t size) {
  WarmPool p;
  p.cpus = 1;
  p.ramMb = ramMb;
  p.storageGb = 4;
  p.pids = 1024;
  p.size = size;
  return p;
}

ReadyEnvironment ready(const std::string& id, size_t pool) { return ReadyEnvironment{id, nullptr, pool}; }

TEST(WarmPools, APoolIsShortUntilWhatIsReadyAndWhatIsBeingMadeFillIt) {
  WarmPools pools({pool(512, 2), pool(1024, 1)});
  EXPECT_EQ(pools.shortOf(0), 0u);
  pools.refilling(0);
  pools.refilled(ready("a", 0));
  pools.refilling(0);  // the second is being made: pool 0 is full as far as refills go
  EXPECT_EQ(pools.shortOf(0), 1u);
  pools.refilling(1);
  EXPECT_EQ(pools.shortOf(0), std::nullopt);
  pools.refilled(ready("b", 0));
  pools.refilled(ready("c", 1));
  EXPECT_EQ(pools.shortOf(0), std::nullopt);
  EXPECT_EQ(pools.ready(), 3u);
}

TEST(WarmPools, AFailedRefillBacksThatPoolOffForFiveSeconds) {
  WarmPools pools({pool(512, 1), pool(1024, 1)});
  pools.refilling(0);
  pools.refillFailed(0, 1000);
  EXPECT_EQ(pools.shortOf(1000), 1u) << "pool 0 backs off; pool 1 is next";
  pools.refilling(1);
  pools.refilled(ready("x", 1));
  EXPECT_EQ(pools.shortOf(5999), std::nullopt);
  EXPECT_EQ(pools.shortOf(6000), 0u);
}

TEST(WarmPools, AClaimTakesTheNewestOfItsPoolAndIsCountedOnlyOnceItIsOne) {
  WarmPools pools({pool(512, 3), pool(1024, 1)});
  for (const char* id : {"old", "other", "new"}) {
    const size_t p = std::string(id) == "other" ? 1 : 0;
    pools.refilling(p);
    pools.refilled(ready(id, p));
  }
  EXPECT_EQ(pools.poolFor("host", 1, 1024, 4, 1024, backend::Isolation::kNamespaces), 1u);
  EXPECT_EQ(pools.poolFor("host", 2, 1024, 4, 1024, backend::Isolation::kNamespaces), std::nullopt);
  EXPECT_EQ(pools.poolFor("host", 1, 1024, 4, 1024, backend::Isolation::kMicroVm), std::nullopt)
      << "the same spec in a microVM is another pool's";
  auto taken = pools.take(0, 42);
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->id, "new");
  EXPECT_EQ(pools.lastClaimMs(), 42);
  EXPECT_EQ(pools.claims(), 0u);
  pools.putBack(std::move(*taken));  // its record could not be stored
  taken = pools.take(0, 43);
  ASSERT_TRUE(taken);
  pools.claimed(0);
  EXPECT_EQ(pools.claims(), 1u);
  auto counts = pools.counts();
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts[0].ready, 1u);
  EXPECT_EQ(counts[0].claims, 1u);
  EXPECT_EQ(counts[1].ready, 1u);
  EXPECT_EQ(counts[1].claims, 0u);
  EXPECT_FALSE(pools.take(1, 44) && pools.take(1, 45)) << "pool 1 held one";
}

TEST(WarmPools, AReadyOneThatDiedIsRemovedByIdAndOthersStay) {
  WarmPools pools({pool(512, 2)});
  pools.refilling(0);
  pools.refilled(ready("a", 0));
  pools.refilling(0);
  pools.refilled(ready("b", 0));
  EXPECT_FALSE(pools.remove("zzz"));
  auto dead = pools.remove("a");
  ASSERT_TRUE(dead);
  EXPECT_EQ(dead->id, "a");
  EXPECT_EQ(pools.ready(), 1u);
  EXPECT_EQ(pools.shortOf(0), 0u);
  auto all = pools.takeAll();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].id, "b");
  EXPECT_EQ(pools.ready(), 0u);
}

}  // namespace
}  // namespace moat::manager
