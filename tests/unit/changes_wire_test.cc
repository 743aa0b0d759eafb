// The changes a microVM guest sends (FileOp kChanges): read back as sent,
// and a guest's malformed or oversized list refused by name.
#include "init/changes_wire.h"

#include <gtest/gtest.h>

#include "init/protocol.h"

namespace moat::init {
namespace {

using isolation::fs::LayerChange;
using isolation::fs::LayerChanges;

TEST(ChangesWire, LimitsAndListsComeBackAsSent) {
  isolation::fs::LayerChangeLimits limits;
  limits.maxChanges = 7;
  limits.deadline = std::chrono::milliseconds(1234);
  limits.diffs = false;
  limits.baseline["/workspace"] = "/";
  auto back = decodeChangeLimits(encodeChangeLimits(limits));
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->maxChanges, 7u);
  EXPECT_EQ(back->deadline.count(), 1234);
  EXPECT_FALSE(back->diffs);
  EXPECT_EQ(back->baseline.at("/workspace"), "/");

  LayerChanges changes;
  changes.truncated = true;
  LayerChange c;
  c.path = "/workspace/a";
  c.kind = LayerChange::Kind::kModified;
  c.type = 'f';
  c.size = 3;
  c.sizeBefore = 2;
  c.diff = "-a\n+b\n";
  changes.changes.push_back(c);
  auto list = decodeChanges(encodeChanges(changes), 7);
  ASSERT_TRUE(list.ok()) << list.error().message();
  EXPECT_TRUE(list->truncated);
  ASSERT_EQ(list->changes.size(), 1u);
  EXPECT_EQ(list->changes[0].path, "/workspace/a");
  EXPECT_EQ(list->changes[0].kind, LayerChange::Kind::kModified);
  EXPECT_EQ(list->changes[0].diff, "-a\n+b\n");
}

TEST(ChangesWire, AGuestsMalformedListIsRefusedByName) {
  LayerChange good;
  good.path = "/a";
  auto encoded = [](std::vector<LayerChange> list) {
    LayerChanges changes;
    changes.changes = std::move(list);
    return encodeChanges(changes);
  };
  auto refusal = [](const std::string& data, size_t max) {
    auto r = decodeChanges(data, max);
    return r.ok() ? std::string("accepted") : r.error().message();
  };
  EXPECT_NE(refusal(encoded({good, good}), 1).find("more than the 1 asked for"), std::string::npos);
  LayerChange relative = good;
  relative.path = "etc/passwd";
  EXPECT_NE(refusal(encoded({relative}), 10).find("not absolute"), std::string::npos);
  LayerChange kind = good;
  kind.kind = static_cast<LayerChange::Kind>(9);
  EXPECT_NE(refusal(encoded({kind}), 10).find("unknown kind"), std::string::npos);
  LayerChange type = good;
  type.type = 'x';
  EXPECT_NE(refusal(encoded({type}), 10).find("unknown type"), std::string::npos);
  EXPECT_NE(refusal(encoded({good}) + "x", 10).find("trailing"), std::string::npos);
  const std::string whole = encoded({good});
  EXPECT_NE(refusal(whole.substr(0, whole.size() - 3), 10), "accepted") << "cut short";
  // A count far beyond the bytes that follow: refused before anything is
  // made for it.
  EXPECT_NE(refusal(Encoder().u8(0).u32(0xffffffffu).take(), 100000).find("more than"), std::string::npos);
}

}  // namespace
}  // namespace moat::init
