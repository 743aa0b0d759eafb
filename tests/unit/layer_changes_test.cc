#include "isolation/fs/layer_changes.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <map>
#include <string>

#include "os/file.h"

namespace moat::isolation::fs {
namespace {

class LayerChangesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "layers-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    (void)os::removeTree(dir_);
    ASSERT_TRUE(os::makeDirs(dir_ + "/lower/etc").ok());
    ASSERT_TRUE(os::makeDirs(dir_ + "/upper").ok());
    ASSERT_TRUE(os::makeDirs(dir_ + "/old").ok());
    file("lower/etc/motd", "hello\n");
    file("lower/etc/keep", "kept\n");
    file("lower/etc/gone", "bye\n");
    ASSERT_TRUE(os::makeDirs(dir_ + "/lower/opt/tool").ok());
    file("lower/opt/tool/a", "a\n");
    file("lower/opt/tool/b", "b\n");
  }
  void TearDown() override { (void)os::removeTree(dir_); }

  void file(const std::string& rel, const std::string& data, mode_t mode = 0644) {
    auto slash = rel.rfind('/');
    if (slash != std::string::npos) {
      ASSERT_TRUE(os::makeDirs(dir_ + "/" + rel.substr(0, slash)).ok());
    }
    ASSERT_TRUE(os::writeFile(dir_ + "/" + rel, data, mode).ok()) << rel;
    ASSERT_EQ(::chmod((dir_ + "/" + rel).c_str(), mode), 0);
  }
  int fd(const std::string& rel) {
    int f = ::open((dir_ + "/" + rel).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    EXPECT_GE(f, 0) << rel;
    fds_.push_back(f);
    return f;
  }
  // path -> "kind type" (+ " mode" when the mode changed).
  std::map<std::string, LayerChange> compare(LayerView before, LayerView after, LayerChangeLimits limits = {}) {
    auto changes = compareLayers(before, after, limits);
    EXPECT_TRUE(changes.ok());
    std::map<std::string, LayerChange> byPath;
    for (auto& c : changes->changes) byPath[c.path] = c;
    truncated_ = changes->truncated;
    for (int f : fds_) ::close(f);
    fds_.clear();
    return byPath;
  }
  static std::string kindOf(const LayerChange& c) {
    const char* k = c.kind == LayerChange::Kind::kAdded      ? "added"
                    : c.kind == LayerChange::Kind::kModified ? "modified"
                                                             : "deleted";
    return std::string(k) + " " + c.type;
  }

  std::string dir_;
  std::vector<int> fds_;
  bool truncated_ = false;
};

TEST_F(LayerChangesTest, AgainstTheTemplateTheWritableLayerIsWhatChanged) {
  file("upper/etc/motd", "hello\nworld\n");
  file("upper/etc/keep", "kept\n", 0755);  // copied up for a chmod: only its mode changed
  file("upper/workspace/new.py", "print(1)\n");
  file("upper/workspace/blob.bin", std::string("\0\1\2", 3));
  ASSERT_EQ(::symlink("/etc/shadow", (dir_ + "/upper/workspace/evil").c_str()), 0);
  auto c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")});
  ASSERT_EQ(c.size(), 6u);
  EXPECT_EQ(kindOf(c["/etc/motd"]), "modified f");
  EXPECT_EQ(c["/etc/motd"].diff, "@@ -1 +1,2 @@\n hello\n+world\n");
  EXPECT_EQ(c["/etc/motd"].size, 12u);
  EXPECT_EQ(c["/etc/motd"].sizeBefore, 6u);
  EXPECT_EQ(kindOf(c["/etc/keep"]), "modified f");
  EXPECT_EQ(c["/etc/keep"].modeChange, "0644 -> 0755");
  EXPECT_EQ(c["/etc/keep"].diff, "");
  EXPECT_EQ(kindOf(c["/workspace"]), "added d");
  EXPECT_EQ(c["/workspace/new.py"].diff, "@@ -0,0 +1 @@\n+print(1)\n");
  EXPECT_EQ(c["/workspace/blob.bin"].diffOmitted, "binary");
  // A planted link is reported as a link, with its target's length; what
  // it names is never read.
  EXPECT_EQ(kindOf(c["/workspace/evil"]), "added l");
  EXPECT_EQ(c["/workspace/evil"].size, 11u);
  EXPECT_EQ(c["/workspace/evil"].target, "/etc/shadow");
  EXPECT_EQ(c["/workspace/evil"].diff, "");
  EXPECT_FALSE(truncated_);
}

TEST_F(LayerChangesTest, ACopiedUpFileWithTheSameBytesAndModeIsNoChange) {
  file("upper/etc/motd", "hello\n");
  auto c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")});
  EXPECT_TRUE(c.empty()) << c.begin()->first;
}

TEST_F(LayerChangesTest, WhiteoutsAndOpaqueDirectoriesAreDeletions) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: whiteouts are character devices 0/0, opaque marks trusted xattrs";
  ASSERT_TRUE(os::makeDirs(dir_ + "/upper/etc").ok());
  ASSERT_EQ(::mknod((dir_ + "/upper/etc/gone").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  // rm -rf /opt/tool; mkdir /opt/tool; echo c > /opt/tool/c
  file("upper/opt/tool/c", "c\n");
  ASSERT_EQ(::setxattr((dir_ + "/upper/opt/tool").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  auto c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")});
  EXPECT_EQ(kindOf(c["/etc/gone"]), "deleted f");
  EXPECT_EQ(c["/etc/gone"].sizeBefore, 4u);
  EXPECT_EQ(c["/etc/gone"].diff, "@@ -1 +0,0 @@\n-bye\n");
  EXPECT_EQ(kindOf(c["/opt/tool/a"]), "deleted f");
  EXPECT_EQ(kindOf(c["/opt/tool/b"]), "deleted f");
  EXPECT_EQ(kindOf(c["/opt/tool/c"]), "added f");
  EXPECT_EQ(c.count("/opt/tool"), 0u) << "the directory itself is still there";
  EXPECT_EQ(c.size(), 4u);
}

TEST_F(LayerChangesTest, AgainstASnapshotOnlyWhatChangedSinceIsReported) {
  // The snapshot: motd changed, notes.txt written. Now: notes.txt changed,
  // motd as the snapshot had it, todo.txt new, old.txt (snapshot only) gone.
  file("old/etc/motd", "hi\n");
  file("old/workspace/notes.txt", "one\n");
  file("old/workspace/old.txt", "old\n");
  file("upper/etc/motd", "hi\n");
  file("upper/workspace/notes.txt", "one\ntwo\n");
  file("upper/workspace/todo.txt", "x\n");
  auto c = compare(LayerView{fd("old"), fd("lower")}, LayerView{fd("upper"), fd("lower")});
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(kindOf(c["/workspace/notes.txt"]), "modified f");
  EXPECT_EQ(c["/workspace/notes.txt"].diff, "@@ -1 +1,2 @@\n one\n+two\n");
  EXPECT_EQ(kindOf(c["/workspace/todo.txt"]), "added f");
  EXPECT_EQ(kindOf(c["/workspace/old.txt"]), "deleted f");
}

TEST_F(LayerChangesTest, ADirectoryReplacedByAFileIsADeletionAndAnAddition) {
  file("old/workspace/x/inner", "in\n");
  file("upper/workspace/x", "now a file\n");
  auto c = compare(LayerView{fd("old"), fd("lower")}, LayerView{fd("upper"), fd("lower")});
  EXPECT_EQ(kindOf(c["/workspace/x"]), "added f");
  EXPECT_EQ(kindOf(c["/workspace/x/inner"]), "deleted f");
}

TEST_F(LayerChangesTest, WhatMoatWroteItselfIsNoChangeUntilTheEnvironmentChangesIt) {
  file("upper/etc/hostname", "abc\n");
  file("upper/etc/hosts", "changed by the environment\n");
  file("upper/workspace/mine", "x\n");
  LayerChangeLimits limits;
  limits.baseline = {{"/etc/hostname", "abc\n"}, {"/etc/hosts", "moat's\n"}, {"/workspace", "/"}};
  auto c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")}, limits);
  EXPECT_EQ(c.count("/etc/hostname"), 0u);
  EXPECT_EQ(c.count("/workspace"), 0u);
  EXPECT_EQ(kindOf(c["/etc/hosts"]), "added f");
  EXPECT_EQ(kindOf(c["/workspace/mine"]), "added f");
  EXPECT_EQ(c.size(), 2u);
}

TEST_F(LayerChangesTest, ASameSizeEditAnywhereInALargeFileIsAChange) {
  // Edits at every 64 KiB window of a 300 KiB file, the size unchanged.
  const std::string original(300 << 10, 'a');
  file("lower/opt/big", original);
  for (size_t at : {size_t{10}, size_t{70000}, size_t{140000}, size_t{200000}, size_t{307000}}) {
    std::string edited = original;
    edited[at] = 'b';
    file("upper/opt/big", edited);
    auto c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")});
    EXPECT_EQ(kindOf(c["/opt/big"]), "modified f") << "an edit at " << at;
  }
  file("upper/opt/big", original);
  EXPECT_TRUE(compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")}).empty());
}

TEST_F(LayerChangesTest, FilesBeyondTheReadingBudgetAreListedAsNotCompared) {
  const std::string same(200 << 10, 'z');
  file("lower/opt/one", same);
  file("lower/opt/two", same);
  file("upper/opt/one", same);  // copied up, unchanged
  file("upper/opt/two", same);
  LayerChangeLimits limits;
  limits.maxCompareBytes = 500 << 10;  // enough for one of them, not both
  auto c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")}, limits);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c.begin()->first, "/opt/two");
  EXPECT_EQ(kindOf(c.begin()->second), "modified f");
  EXPECT_EQ(c.begin()->second.diffOmitted, "not_compared");
}

TEST_F(LayerChangesTest, AnOpaqueMarkTheEnvironmentCanSetDoesNotHideTheTemplate) {
  // user.* attributes are the environment's to set; the overlay reads trusted.*.
  file("upper/opt/tool/c", "c\n");
  if (::setxattr((dir_ + "/upper/opt/tool").c_str(), "user.overlay.opaque", "y", 1, 0) != 0) {
    GTEST_SKIP() << "this file system takes no user.* attributes";
  }
  auto c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")});
  EXPECT_EQ(c.count("/opt/tool/a"), 0u);
  EXPECT_EQ(kindOf(c["/opt/tool/c"]), "added f");
  EXPECT_EQ(c.size(), 1u);
}

TEST_F(LayerChangesTest, LimitsTruncateAndBoundTheDiffs) {
  for (int i = 0; i < 20; ++i) file("upper/workspace/f" + std::to_string(100 + i), std::string(100, 'x') + "\n");
  file("upper/workspace/big", std::string(300 << 10, 'y'));
  LayerChangeLimits limits;
  limits.maxChanges = 5;
  auto c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")}, limits);
  EXPECT_EQ(c.size(), 5u);
  EXPECT_TRUE(truncated_);
  limits.maxChanges = 100;
  limits.maxDiffBytes = 500;  // about four of the small files' diffs
  c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")}, limits);
  EXPECT_FALSE(truncated_);
  EXPECT_EQ(c["/workspace/big"].diffOmitted, "too_large");
  size_t withDiff = 0;
  size_t overBudget = 0;
  for (auto& [path, change] : c) {
    if (!change.diff.empty()) ++withDiff;
    if (change.diffOmitted == "budget") ++overBudget;
  }
  EXPECT_EQ(withDiff, 4u);
  EXPECT_EQ(overBudget, 16u);
  // Paths and link targets have their budget too.
  limits.maxListBytes = 100;
  c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")}, limits);
  EXPECT_TRUE(truncated_);
  EXPECT_LT(c.size(), 10u);
  // And the walk its time.
  limits = LayerChangeLimits{};
  limits.deadline = std::chrono::milliseconds(0);
  c = compare(LayerView{-1, fd("lower")}, LayerView{fd("upper"), fd("lower")}, limits);
  EXPECT_TRUE(truncated_);
  EXPECT_TRUE(c.empty());
}

}  // namespace
}  // namespace moat::isolation::fs
