#include "api/rate_limit.h"

#include <gtest/gtest.h>

using moat::api::RateLimiter;
using namespace std::chrono_literals;

namespace {

RateLimiter::Limits limits(double perSecond, double burst, RateLimiter::Clock::duration maxWait = 2s) {
  return {perSecond, burst, maxWait};
}

}  // namespace

TEST(RateLimiter, ABurstGoesThroughAtOnceThenRequestsWaitTheirTurnInOrder) {
  RateLimiter rate(limits(10, 4));
  auto t0 = RateLimiter::Clock::time_point{} + 1h;
  for (int i = 0; i < 4; ++i) {
    auto a = rate.admit("k", t0);
    ASSERT_TRUE(a.admitted);
    EXPECT_EQ(a.wait, RateLimiter::Clock::duration::zero()) << i;
  }
  // Beyond the burst: one every 100 ms, each behind the one before.
  auto fifth = rate.admit("k", t0);
  auto sixth = rate.admit("k", t0);
  ASSERT_TRUE(fifth.admitted);
  ASSERT_TRUE(sixth.admitted);
  EXPECT_NEAR(std::chrono::duration<double>(fifth.wait).count(), 0.1, 1e-6);
  EXPECT_NEAR(std::chrono::duration<double>(sixth.wait).count(), 0.2, 1e-6);
}

TEST(RateLimiter, ATurnFurtherAwayThanTheLongestWaitIsRefusedWithWhenToComeBack) {
  RateLimiter rate(limits(10, 1, 300ms));
  auto t0 = RateLimiter::Clock::time_point{} + 1h;
  ASSERT_TRUE(rate.admit("k", t0).admitted);
  EXPECT_TRUE(rate.admit("k", t0).admitted);  // 100 ms
  EXPECT_TRUE(rate.admit("k", t0).admitted);  // 200 ms
  EXPECT_TRUE(rate.admit("k", t0).admitted);  // 300 ms
  auto refused = rate.admit("k", t0);
  EXPECT_FALSE(refused.admitted);
  EXPECT_NEAR(std::chrono::duration<double>(refused.retryAfter).count(), 0.4, 1e-6);
  // A refusal costs nothing: once the debt is paid, requests go through again.
  auto later = rate.admit("k", t0 + 400ms);
  EXPECT_TRUE(later.admitted);
  EXPECT_EQ(later.wait, RateLimiter::Clock::duration::zero());
}

TEST(RateLimiter, TheBucketRefillsAtTheRateUpToTheBurstOnly) {
  RateLimiter rate(limits(100, 5));
  auto t0 = RateLimiter::Clock::time_point{} + 1h;
  for (int i = 0; i < 5; ++i) ASSERT_EQ(rate.admit("k", t0).wait, RateLimiter::Clock::duration::zero());
  // An hour idle refills 5, not 360,000.
  auto t1 = t0 + 1h;
  for (int i = 0; i < 5; ++i) ASSERT_EQ(rate.admit("k", t1).wait, RateLimiter::Clock::duration::zero()) << i;
  EXPECT_GT(rate.admit("k", t1).wait, RateLimiter::Clock::duration::zero());
  // A clock that steps back (another thread read it first) takes nothing.
  EXPECT_TRUE(rate.admit("k", t1 - 1s).admitted);
}

TEST(RateLimiter, EachKeyHasItsOwnBucket) {
  RateLimiter rate(limits(1, 1, 0s));
  auto t0 = RateLimiter::Clock::time_point{} + 1h;
  EXPECT_TRUE(rate.admit("flooder", t0).admitted);
  EXPECT_FALSE(rate.admit("flooder", t0).admitted);
  EXPECT_TRUE(rate.admit("neighbour", t0).admitted);
}

TEST(RateLimiter, RateZeroIsNoLimit) {
  RateLimiter rate(limits(0, 0));
  EXPECT_FALSE(rate.enabled());
  auto t0 = RateLimiter::Clock::time_point{} + 1h;
  for (int i = 0; i < 100000; ++i) {
    auto a = rate.admit("k", t0);
    ASSERT_TRUE(a.admitted);
    ASSERT_EQ(a.wait, RateLimiter::Clock::duration::zero());
  }
}
