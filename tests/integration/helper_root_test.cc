// A root of its own for a program moat runs on the host side (QEMU's):
// what a child that entered it finds of the host's files and processes,
// and that nothing of it reaches the host's mounts.

#include "isolation/fs/helper_root.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "moat_process.h"
#include "os/file.h"
#include "os/process.h"

namespace moat::test {
namespace {

class HelperRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-helper-root-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)os::removeTree(dir_); }
  std::string dir_;
};

// What the child found: each check's errno, 0 when it worked.
struct Found {
  int readShown;  // open <dir>/shown/file for reading, and its byte
  char shownByte;
  int writeShown;  // create a file in <dir>/shown
  int statHidden;  // <dir>/hidden: not named
  int readLinkAt;  // <dir>/link, made again as the same symlink
  char linkTarget[8];
  int writeDevice;  // /dev/null, named writable
  int statPasswd;   // /etc/passwd: not named
  int statOwnPid;   // /proc/1: the child, first of its pid namespace
  int statHostPid;  // /proc/2: the host's kthreadd
  int statProcSys;  // /proc/sys: not in a proc of subset=pid
  int entered;      // enterRootInChild
};

TEST_F(HelperRoot, AChildFindsTheNamedPathsAndNothingElseOfTheHosts) {
  MOAT_REQUIRE_ROOT();
  ASSERT_TRUE(os::makeDirs(dir_ + "/shown", 0755).ok());
  ASSERT_TRUE(os::writeFile(dir_ + "/shown/file", "x", 0644).ok());
  ASSERT_TRUE(os::writeFile(dir_ + "/hidden", "host's", 0644).ok());
  ASSERT_TRUE(os::symlink("shown", dir_ + "/link").ok());
  ASSERT_TRUE(os::makeDirs(dir_ + "/attach", 0700).ok());
  auto shown = os::open(dir_ + "/shown", O_PATH | O_CLOEXEC);
  auto link = os::open(dir_ + "/link", O_PATH | O_CLOEXEC);
  auto null = os::open("/dev/null", O_PATH | O_CLOEXEC);
  ASSERT_TRUE(shown.ok() && link.ok() && null.ok());
  auto root = isolation::fs::HelperRoot::make(
      {{dir_ + "/shown", shown->get()}, {dir_ + "/link", link->get()}, {"/dev/null", null->get(), true}},
      dir_ + "/attach");
  ASSERT_TRUE(root.ok()) << root.error().message();
  const os::RootPlan plan = root->plan();
  const std::string file = dir_ + "/shown/file", created = dir_ + "/shown/new", hidden = dir_ + "/hidden",
                    linkPath = dir_ + "/link";
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  auto child = os::clone3({CLONE_NEWNS | CLONE_NEWPID, -1});
  ASSERT_TRUE(child.ok()) << child.error().message();
  if (child->pid == 0) {
    Found found{};
    auto result = [](int rc) { return rc < 0 ? errno : 0; };
    const char* step = "";
    found.entered = os::enterRootInChild(plan, &step);
    int fd = ::open(file.c_str(), O_RDONLY);
    found.readShown = result(fd);
    if (fd >= 0 && ::read(fd, &found.shownByte, 1) != 1) found.readShown = EIO;
    fd = ::open(created.c_str(), O_WRONLY | O_CREAT, 0644);
    found.writeShown = result(fd);
    struct stat st;
    found.statHidden = result(::stat(hidden.c_str(), &st));
    const ssize_t n = ::readlink(linkPath.c_str(), found.linkTarget, sizeof found.linkTarget - 1);
    found.readLinkAt = result(static_cast<int>(n));
    found.writeDevice = result(::open("/dev/null", O_WRONLY));
    found.statPasswd = result(::stat("/etc/passwd", &st));
    found.statOwnPid = result(::stat("/proc/1", &st));
    found.statHostPid = result(::stat("/proc/2", &st));
    found.statProcSys = result(::stat("/proc/sys", &st));
    ::_exit(::write(report[1], &found, sizeof found) == sizeof found ? 0 : 1);
  }
  ::close(report[1]);
  Found found{};
  const ssize_t got = ::read(report[0], &found, sizeof found);
  ::close(report[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child->pid, &status, 0), child->pid);
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof found));
  EXPECT_EQ(found.entered, 0);
  EXPECT_EQ(found.readShown, 0);
  EXPECT_EQ(found.shownByte, 'x');
  EXPECT_EQ(found.writeShown, EROFS) << "named paths are read only";
  EXPECT_EQ(found.statHidden, ENOENT) << "a host file beside a named one";
  EXPECT_EQ(found.readLinkAt, 0);
  EXPECT_STREQ(found.linkTarget, "shown");
  EXPECT_EQ(found.writeDevice, 0) << "a device named writable";
  EXPECT_EQ(found.statPasswd, ENOENT);
  EXPECT_EQ(found.statOwnPid, 0);
  EXPECT_EQ(found.statHostPid, ENOENT) << "a host pid in the child's proc";
  EXPECT_EQ(found.statProcSys, ENOENT) << "proc's subset=pid";
  // Nothing of it reached the host: no mount on the directory it was
  // attached on, no file made in the named one.
  auto mounts = os::readFile("/proc/self/mountinfo");
  ASSERT_TRUE(mounts.ok());
  EXPECT_EQ(mounts->find(dir_), std::string::npos) << mounts.value();
  EXPECT_FALSE(os::exists(created));
}

TEST_F(HelperRoot, RefusesWhatCannotBeARoot) {
  MOAT_REQUIRE_ROOT();
  auto all = os::open("/", O_PATH | O_CLOEXEC);
  ASSERT_TRUE(all.ok());
  auto whole = isolation::fs::HelperRoot::make({{"/", all->get()}}, dir_);
  ASSERT_FALSE(whole.ok());
  EXPECT_NE(whole.error().message().find("all of the host's"), std::string::npos) << whole.error().message();
  auto relative = isolation::fs::HelperRoot::make({{"usr", all->get()}}, dir_);
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(relative.error().message().find("not an absolute path"), std::string::npos);
  ASSERT_TRUE(os::symlink("/", dir_ + "/to-root").ok());
  auto linked = isolation::fs::HelperRoot::make({}, dir_ + "/to-root");
  ASSERT_FALSE(linked.ok());
  EXPECT_NE(linked.error().message().find("not a directory to attach"), std::string::npos);
}

}  // namespace
}  // namespace moat::test
