// os::copyTree's link mode: a hard link only for what only root can change,
// a copy for everything else, a copy across file systems.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "os/file.h"

namespace moat::os {
namespace {

class CopyTreeLinks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: makes files owned by other users (CI runs as root)";
    char tmpl[] = "/tmp/moat-copytree-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) (void)removeTree(dir_);
  }
  ino_t inode(const std::string& path) {
    struct stat st;
    EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
    return st.st_ino;
  }
  void file(const std::string& name, mode_t mode, uid_t uid = 0, gid_t gid = 0) {
    ASSERT_TRUE(writeFile(dir_ + "/from/" + name, "bytes of " + name).ok());
    // chown before chmod: a chown clears the set-id bits.
    ASSERT_EQ(::lchown((dir_ + "/from/" + name).c_str(), uid, gid), 0);
    ASSERT_EQ(::chmod((dir_ + "/from/" + name).c_str(), mode), 0);
  }
  std::string dir_;
};

TEST_F(CopyTreeLinks, LinksOnlyWhatOnlyRootCanChangeAndCopiesTheRest) {
  ASSERT_TRUE(makeDirs(dir_ + "/from/sub").ok());
  file("root-owned", 0644);
  file("sub/nested", 0600);
  file("group-writable", 0664);
  file("world-writable", 0646);
  file("user-owned", 0644, 1000, 0);
  file("group-owned", 0644, 0, 1000);
  file("setuid", 04755);
  ASSERT_TRUE(symlink("root-owned", dir_ + "/from/link").ok());
  ASSERT_TRUE(symlink("root-owned", dir_ + "/from/user-link").ok());
  ASSERT_EQ(::lchown((dir_ + "/from/user-link").c_str(), 1000, 1000), 0);

  ASSERT_TRUE(copyTree(dir_ + "/from", dir_ + "/to", CopyMode::kLinkRootOwned).ok());
  for (const char* shared : {"root-owned", "sub/nested", "link"}) {
    EXPECT_EQ(inode(dir_ + "/to/" + shared), inode(dir_ + "/from/" + shared)) << shared << " is not linked";
  }
  for (const char* copied : {"group-writable", "world-writable", "user-owned", "group-owned", "setuid", "user-link"}) {
    EXPECT_NE(inode(dir_ + "/to/" + copied), inode(dir_ + "/from/" + copied)) << copied << " is linked";
  }
  // Copies carry the bytes and the permission bits, never set-id ones.
  EXPECT_EQ(readFile(dir_ + "/to/user-owned").value(), "bytes of user-owned");
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/to/setuid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07000, 0u);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(readLink(dir_ + "/to/user-link").value(), "root-owned");
}

TEST_F(CopyTreeLinks, AnExistingTargetIsAnErrorNeverAWriteThroughIt) {
  // Were a failed link followed by a copy, the copy would open the existing
  // target (here a link to the source) and rewrite the source's inode.
  ASSERT_TRUE(makeDirs(dir_ + "/from").ok());
  ASSERT_TRUE(makeDirs(dir_ + "/to").ok());
  file("root-owned", 0644);
  ASSERT_EQ(::link((dir_ + "/from/root-owned").c_str(), (dir_ + "/to/root-owned").c_str()), 0);
  ASSERT_TRUE(writeFile(dir_ + "/from/other", "x").ok());
  Status s = copyTree(dir_ + "/from", dir_ + "/to", CopyMode::kLinkRootOwned);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ok() ? 0 : s.error().sysErrno, EEXIST);
  EXPECT_EQ(readFile(dir_ + "/from/root-owned").value(), "bytes of root-owned");
}

TEST_F(CopyTreeLinks, TheDefaultModeAlwaysCopies) {
  ASSERT_TRUE(makeDirs(dir_ + "/from").ok());
  file("root-owned", 0644);
  ASSERT_TRUE(copyTree(dir_ + "/from", dir_ + "/to").ok());
  EXPECT_NE(inode(dir_ + "/to/root-owned"), inode(dir_ + "/from/root-owned"));
  EXPECT_EQ(readFile(dir_ + "/to/root-owned").value(), "bytes of root-owned");
}

TEST_F(CopyTreeLinks, AnotherFileSystemGetsACopy) {
  struct stat shm, tmp;
  if (::stat("/dev/shm", &shm) != 0 || ::stat(dir_.c_str(), &tmp) != 0 || shm.st_dev == tmp.st_dev) {
    GTEST_SKIP() << "needs /dev/shm on another file system than /tmp";
  }
  char tmpl[] = "/dev/shm/moat-copytree-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string from = tmpl;
  ASSERT_TRUE(writeFile(from + "/f", "across").ok());
  Status s = copyTree(from, dir_ + "/to", CopyMode::kLinkRootOwned);
  (void)removeTree(from);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(readFile(dir_ + "/to/f").value(), "across");
}

}  // namespace
}  // namespace moat::os
