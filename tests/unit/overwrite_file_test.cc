// os::overwriteFile: writes over a file's start in place (no truncation, so
// a `discard` file system frees no block), makes it when missing, and
// follows no symlink.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "os/file.h"

namespace moat::os {
namespace {

class OverwriteFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-overwrite-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)removeTree(dir_); }
  std::string dir_;
};

TEST_F(OverwriteFile, MakesAMissingFileWithItsMode) {
  const std::string path = dir_ + "/record";
  ASSERT_TRUE(overwriteFile(path, "abc", 0600).ok());
  EXPECT_EQ(readFile(path).value(), "abc");
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(OverwriteFile, WritesOverTheStartAndKeepsTheRestAndTheBlocks) {
  const std::string path = dir_ + "/record";
  ASSERT_TRUE(writeFile(path, std::string(64, 'x'), 0600).ok());
  struct stat before;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  ASSERT_TRUE(overwriteFile(path, "12:34").ok());
  EXPECT_EQ(readFile(path).value(), "12:34" + std::string(59, 'x'));
  struct stat after;
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the same file, not a new one";
  EXPECT_EQ(after.st_size, 64);
  EXPECT_EQ(after.st_blocks, before.st_blocks) << "no block freed";
}

TEST_F(OverwriteFile, FollowsNoSymlink) {
  const std::string target = dir_ + "/target";
  const std::string link = dir_ + "/link";
  ASSERT_TRUE(writeFile(target, "kept", 0600).ok());
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  auto written = overwriteFile(link, "planted");
  EXPECT_FALSE(written.ok()) << "a symlink at the path was followed";
  EXPECT_EQ(readFile(target).value(), "kept");
}

}  // namespace
}  // namespace moat::os
