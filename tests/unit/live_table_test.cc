#include "manager/live_table.h"

#include <gtest/gtest.h>

namespace moat::manager {
namespace {

LiveEnvironment liveFor(const std::string& owner, int64_t expiresAtMs) {
  LiveEnvironment live;
  live.owner = owner;
  live.ramMb = 256;
  live.expiresAtMs = expiresAtMs;
  return live;
}

TEST(LiveTable, ADestroyDuringACreateIsRecordedForTheCreateNotDone) {
  LiveTable table;
  table.beginCreate("a");
  EXPECT_TRUE(table.runsOrIsBeingCreated("a"));
  EXPECT_FALSE(table.runs("a"));
  LiveEnvironment taken;
  EXPECT_EQ(table.takeForDestroy("a", "key1", taken), LiveTable::Destroy::kRequested);
  EXPECT_EQ(table.destroyRequestedBy("a"), "key1");
  table.abandonCreate("a");  // the create honoured it
  EXPECT_EQ(table.destroyRequestedBy("a"), "");
  EXPECT_FALSE(table.runsOrIsBeingCreated("a"));
  EXPECT_EQ(table.takeForDestroy("a", "key1", taken), LiveTable::Destroy::kAbsent);
}

TEST(LiveTable, ACreateThatEndsRunsAndADestroyTakesItOnce) {
  LiveTable table;
  table.beginCreate("a");
  table.put("a", liveFor("key1", 1000));
  EXPECT_TRUE(table.runs("a"));
  ASSERT_TRUE(table.find("a").has_value());
  EXPECT_EQ(table.find("a")->owner, "key1");
  LiveEnvironment taken;
  EXPECT_EQ(table.takeForDestroy("a", "master", taken), LiveTable::Destroy::kTaken);
  EXPECT_EQ(taken.owner, "key1");
  EXPECT_EQ(taken.ramMb, 256u);
  EXPECT_EQ(table.takeForDestroy("a", "master", taken), LiveTable::Destroy::kAbsent) << "taken once";
  EXPECT_FALSE(table.find("a").has_value());
}

TEST(LiveTable, ExpiryIsFoundOnceDueAndAgainWhileItStays) {
  LiveTable table;
  table.put("soon", liveFor("m", 1000));
  table.put("later", liveFor("m", 5000));
  EXPECT_TRUE(table.expired(999).empty());
  EXPECT_EQ(table.expired(1000), std::vector<std::string>{"soon"});
  // Its destroy failed: still there, found again.
  EXPECT_EQ(table.expired(1001), std::vector<std::string>{"soon"});
  table.take("soon");
  EXPECT_TRUE(table.expired(4999).empty());
  table.setExpiry("later", 2000);  // shortened: due earlier than the scan thought
  EXPECT_EQ(table.expired(2000), std::vector<std::string>{"later"});
}

TEST(LiveTable, UpdateChangesOnlyWhatRuns) {
  LiveTable table;
  EXPECT_FALSE(table.update("a", [](LiveEnvironment& live) { live.env["X"] = "1"; }));
  table.put("a", liveFor("m", 1000));
  EXPECT_TRUE(table.update("a", [](LiveEnvironment& live) { live.env["X"] = "1"; }));
  EXPECT_EQ(table.find("a")->env.at("X"), "1");
  EXPECT_FALSE(table.connected("a")) << "no connection";
  EXPECT_EQ(table.ids(), std::vector<std::string>{"a"});
  EXPECT_EQ(table.takeAll().size(), 1u);
  EXPECT_TRUE(table.ids().empty());
}

}  // namespace
}  // namespace moat::manager
