// What code inside an environment makes the audit log record: paced per
// type, within a share of the log, the rest counted and summarized.
#include "audit/environment_share.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace moat::audit {
namespace {

struct Written {
  std::string type, environment;
  nlohmann::json data;
};

class Share : public ::testing::Test {
 protected:
  EnvironmentShare make(uint64_t share) {
    return EnvironmentShare(
        [this](const std::string& type, const std::string& env, nlohmann::json data) {
          written.push_back({type, env, std::move(data)});
        },
        {share, 60'000, [this] { return nowMs; }});
  }
  size_t count(const std::string& type, const std::string& env) const {
    size_t n = 0;
    for (const auto& w : written) n += w.type == type && w.environment == env;
    return n;
  }
  std::vector<Written> written;
  int64_t nowMs = 1'000'000;
};

TEST_F(Share, ABurstIsPacedAndTheRestCountedOnTheNextOneKept) {
  auto share = make(0);
  for (int i = 0; i < 1000; ++i) share.record("gate.denied", "a", {{"i", i}}, {10, 50});
  EXPECT_EQ(count("gate.denied", "a"), 50u) << "the burst, nothing beyond it at the same instant";
  nowMs += 1000;  // 10 more tokens
  share.record("gate.denied", "a", {{"i", 1000}}, {10, 50});
  ASSERT_EQ(count("gate.denied", "a"), 51u);
  EXPECT_EQ(written.back().data["suppressed"], 950) << "what was left out since the last one kept";
  // Another type and another environment have their own pace.
  share.record("egress.denied", "a", {}, {10, 50});
  share.record("gate.denied", "b", {}, {10, 50});
  EXPECT_EQ(count("egress.denied", "a"), 1u);
  EXPECT_EQ(count("gate.denied", "b"), 1u);
}

TEST_F(Share, BeyondItsShareAnEnvironmentIsOnlySummarized) {
  auto share = make(100);
  for (int second = 0; second < 600; ++second) {  // 10 minutes at 50 a second
    for (int i = 0; i < 50; ++i) share.record("egress.denied", "noisy", {}, {1000, 1000});
    share.record("egress.allowed", "quiet", {}, {1000, 1000});
    nowMs += 1000;
  }
  EXPECT_EQ(count("egress.denied", "noisy"), 100u) << "its share, one by one";
  size_t summaries = count("audit.summarized", "noisy");
  EXPECT_GE(summaries, 9u);
  EXPECT_LE(summaries, 10u) << "at most one a minute";
  uint64_t summarized = 0;
  for (const auto& w : written) {
    if (w.type == "audit.summarized") summarized += w.data["counts"].value("egress.denied", uint64_t{0});
  }
  share.close("noisy");
  for (const auto& w : written) {
    if (w.type == "audit.summarized" && w.data["reason"] == "the environment ended") {
      summarized += w.data["counts"].value("egress.denied", uint64_t{0});
    }
  }
  EXPECT_EQ(100 + summarized, 600u * 50) << "every event kept or counted";
  EXPECT_EQ(count("egress.allowed", "quiet"), 100u) << "the quiet one keeps its own share";
}

TEST_F(Share, TheEndWritesWhatWasOnlyCounted) {
  auto share = make(0);
  for (int i = 0; i < 30; ++i) share.record("gate.denied", "a", {}, {1, 10});
  share.close("a");
  ASSERT_EQ(written.back().type, "audit.summarized");
  EXPECT_EQ(written.back().data["counts"]["gate.denied"], 20);
  written.clear();
  share.close("a");  // nothing left
  EXPECT_TRUE(written.empty());
}

}  // namespace
}  // namespace moat::audit
