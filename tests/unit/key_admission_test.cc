// KeyAdmission: a key's requests in progress and its rate, before any body.
#include "api/key_admission.h"

#include <gtest/gtest.h>

namespace moat::api {
namespace {

TEST(KeyAdmission, AKeyHasAtMostItsRequestsInProgressAndAnEndedOneMakesRoom) {
  ApiMetrics metrics;
  KeyAdmission admission(2, 0, metrics);  // no rate limit
  auto a = admission.admit("k1");
  auto b = admission.admit("k1");
  ASSERT_FALSE(a.refusal);
  ASSERT_FALSE(b.refusal);
  auto c = admission.admit("k1");
  ASSERT_TRUE(c.refusal);
  EXPECT_EQ(c.refusal->status, 429);
  EXPECT_EQ(c.refusal->code, "capacity");
  EXPECT_EQ(c.refusal->message, "at capacity: this key has 2 requests in progress; retry when some have ended");
  EXPECT_EQ(c.retryAfter, "1");
  EXPECT_FALSE(admission.admit("k2").refusal) << "another key has its own";
  a.hold.reset();  // answered
  EXPECT_FALSE(admission.admit("k1").refusal);
}

// With moatd stopping nobody waits: a request whose turn is a moment away
// is told so at once (503), and one whose turn is too far away is refused
// with when to come back.
TEST(KeyAdmission, BeyondItsRateARequestWaitsItsTurnOrIsToldWhenToComeBack) {
  ApiMetrics metrics;
  KeyAdmission admission(100, 1, metrics);  // 1 a second, bursts of 2
  admission.stop();
  EXPECT_FALSE(admission.admit("k").refusal);
  EXPECT_FALSE(admission.admit("k").refusal);
  auto waited = admission.admit("k");  // its turn in 1 s
  ASSERT_TRUE(waited.refusal);
  EXPECT_EQ(waited.refusal->status, 503);
  EXPECT_FALSE(waited.hold);
  (void)admission.admit("k");  // in 2 s: the longest wait there is
  auto refused = admission.admit("k");
  ASSERT_TRUE(refused.refusal);
  EXPECT_EQ(refused.refusal->status, 429);
  EXPECT_NE(refused.refusal->message.find("may send 1 requests per second (moatd --key-rate)"), std::string::npos)
      << refused.refusal->message;
  EXPECT_FALSE(refused.retryAfter.empty());
  EXPECT_GE(std::stoi(refused.retryAfter), 1);
}

}  // namespace
}  // namespace moat::api
