#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gate/permissions.h"

// An action on a whole tree (a recursive remove, a move, a restore, a
// snapshot) gets the strictest decision any path below it could get, so a
// rule that protects /workspace/locked/** also stops removing /workspace.
namespace moat::gate {
namespace {

Permissions writes(const nlohmann::json& rules) {
  auto p = Permissions::parse({{"write_file", rules}}, Permissions::defaults());
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message());
  return p.ok() ? p.value() : Permissions::defaults();
}

Permissions::Verdict treeVerdict(const Permissions& p, const std::string& path, bool tree = true) {
  Action a;
  a.scope = Scope::kWriteFile;
  a.path = path;
  a.tree = tree;
  return p.evaluate(a);
}

TEST(GateTree, ARuleBelowThePathCounts) {
  Permissions p = writes({{{"path", "/workspace/locked/**"}, {"action", "deny"}}, {{"action", "allow"}}});
  EXPECT_EQ(treeVerdict(p, "/workspace", false).decision, Decision::kAllow) << "the directory alone";
  for (const char* path : {"/workspace", "/", "/workspace/locked", "/workspace/locked/a"}) {
    auto v = treeVerdict(p, path);
    EXPECT_EQ(v.decision, Decision::kDeny) << path;
    EXPECT_EQ(v.rule, 0) << path;
  }
  for (const char* path : {"/workspace/other", "/tmp", "/workspace/lockedx"}) {
    EXPECT_EQ(treeVerdict(p, path).decision, Decision::kAllow) << path;
  }
}

TEST(GateTree, AskBelowAsksAndAnEarlierRuleCoveringTheTreeDecidesAlone) {
  Permissions ask = writes({{{"path", "/workspace/*/secrets/*"}, {"action", "ask"}}, {{"action", "allow"}}});
  EXPECT_EQ(treeVerdict(ask, "/workspace").decision, Decision::kAsk);
  EXPECT_EQ(treeVerdict(ask, "/workspace/app").decision, Decision::kAsk);
  EXPECT_EQ(treeVerdict(ask, "/etc").decision, Decision::kAllow);
  // /scratch/** allows everything below before the deny is reached.
  Permissions covered = writes({{{"path", "/scratch/**"}, {"action", "allow"}}, {{"action", "deny"}}});
  EXPECT_EQ(treeVerdict(covered, "/scratch/build").decision, Decision::kAllow);
  EXPECT_EQ(treeVerdict(covered, "/scratch").decision, Decision::kDeny) << "/scratch itself is not under /scratch/**";
  EXPECT_EQ(treeVerdict(covered, "/").decision, Decision::kDeny);
}

TEST(GateTree, AGlobbedDirectoryFollowedByStarStarCoversItsTree) {
  Permissions p = writes({{{"path", "/tmp/ask-*"}, {"action", "ask"}}, {{"path", "/tmp/ask-*/**"}, {"action", "ask"}}});
  EXPECT_EQ(treeVerdict(p, "/tmp/ask-moved").decision, Decision::kAsk);
  EXPECT_EQ(treeVerdict(p, "/tmp/ask-moved/deeper").decision, Decision::kAsk);
  EXPECT_EQ(treeVerdict(p, "/tmp/other").decision, Decision::kDeny);
}

TEST(GateTree, OnlyAllOfItCoversTheWholeFileSystem) {
  // "/*/**" covers every directory's tree but misses /secret itself;
  // "//**" matches no normalized path: neither ends the scan at "/".
  for (const char* first : {"/*/**", "//**"}) {
    Permissions p = writes(
        {{{"path", first}, {"action", "allow"}}, {{"path", "/secret"}, {"action", "deny"}}, {{"action", "allow"}}});
    auto v = treeVerdict(p, "/");
    EXPECT_EQ(v.decision, Decision::kDeny) << first;
    EXPECT_EQ(v.rule, 1) << first;
  }
}

TEST(GateTree, PathsBelowThatNoRuleMatchesAreDenied) {
  // Only .txt files may be written: a directory may hold anything else.
  Permissions p = writes({{{"path", "/workspace/*.txt"}, {"action", "allow"}}});
  EXPECT_EQ(treeVerdict(p, "/workspace/a.txt", false).decision, Decision::kAllow);
  EXPECT_EQ(treeVerdict(p, "/workspace/a.txt").decision, Decision::kDeny);
}

TEST(GateTree, ALiteralRuleForThePathItselfIsNotBelowIt) {
  Permissions p = writes({{{"path", "/workspace/keep"}, {"action", "deny"}}, {{"action", "allow"}}});
  EXPECT_EQ(treeVerdict(p, "/workspace").decision, Decision::kDeny);  // keep is below /workspace
  EXPECT_EQ(treeVerdict(p, "/workspace/kee").decision, Decision::kAllow);
  EXPECT_EQ(treeVerdict(p, "/workspace/keep").decision, Decision::kDeny);  // the path itself
}

TEST(GateTree, TreeIsPartOfWhatAnApprovalGrants) {
  Action a;
  a.scope = Scope::kWriteFile;
  a.path = "/workspace";
  Action tree = a;
  tree.tree = true;
  EXPECT_FALSE(a.same(tree));
  EXPECT_EQ(tree.toJson()["tree"], true);
  EXPECT_FALSE(a.toJson().contains("tree"));
}

}  // namespace
}  // namespace moat::gate
