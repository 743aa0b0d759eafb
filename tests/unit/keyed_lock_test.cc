// KeyedLock: shared holders together, an exclusive one alone, keys apart.
#include "common/keyed_lock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>

namespace moat {
namespace {

// How long a waiter that must stay blocked is watched: it cannot be waited
// for (it must not happen), so this bounds the look.
constexpr auto kStillBlocked = std::chrono::milliseconds(100);

// Takes `key` on another thread; the future is ready once it holds it.
std::future<void> takeLater(KeyedLock& locks, const std::string& key, bool exclusive,
                            std::shared_future<void> releaseWhen) {
  return std::async(std::launch::async, [&locks, key, exclusive, releaseWhen] {
    auto held = exclusive ? locks.exclusive(key) : locks.shared(key);
    releaseWhen.wait();
  });
}

TEST(KeyedLock, SharedHoldersGoTogetherAndAnExclusiveOneWaitsForAllOfThem) {
  KeyedLock locks;
  auto first = locks.shared("snap");
  auto second = locks.shared("snap");  // not blocked by the first
  EXPECT_TRUE(locks.held("snap"));
  std::promise<void> release;
  auto deleter = takeLater(locks, "snap", true, release.get_future().share());
  EXPECT_EQ(deleter.wait_for(kStillBlocked), std::future_status::timeout);
  first.run();  // released now
  EXPECT_EQ(deleter.wait_for(kStillBlocked), std::future_status::timeout) << "one shared holder is left";
  second.run();
  release.set_value();
  deleter.get();  // it took the key once both were gone, and gave it back
  EXPECT_FALSE(locks.held("snap"));
}

TEST(KeyedLock, AnExclusiveHolderKeepsEveryoneElseOutOfItsKeyOnly) {
  KeyedLock locks;
  auto destroying = locks.exclusive("env-a");
  std::promise<void> release;
  auto releaseWhen = release.get_future().share();
  auto other = takeLater(locks, "env-a", true, releaseWhen);
  auto reader = takeLater(locks, "env-a", false, releaseWhen);
  {
    auto elsewhere = locks.exclusive("env-b");  // another key: at once
    EXPECT_TRUE(locks.held("env-b"));
  }
  EXPECT_FALSE(locks.held("env-b"));
  EXPECT_EQ(other.wait_for(kStillBlocked), std::future_status::timeout);
  EXPECT_EQ(reader.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  destroying.run();
  release.set_value();
  other.get();
  reader.get();
  EXPECT_FALSE(locks.held("env-a"));
}

// tryExclusive never waits: it takes a key no one holds, and gives nothing
// for one held shared or exclusively.
TEST(KeyedLock, TryExclusiveTakesAFreeKeyAndNeverWaitsForAHeldOne) {
  KeyedLock locks;
  {
    auto reading = locks.shared("image");
    EXPECT_FALSE(locks.tryExclusive("image").has_value());
  }
  auto taken = locks.tryExclusive("image");
  ASSERT_TRUE(taken.has_value());
  EXPECT_TRUE(locks.held("image"));
  EXPECT_FALSE(locks.tryExclusive("image").has_value());
  EXPECT_TRUE(locks.tryExclusive("other").has_value()) << "another key is free";
  taken->run();
  EXPECT_FALSE(locks.held("image"));
  EXPECT_TRUE(locks.tryExclusive("image").has_value());
}

}  // namespace
}  // namespace moat
