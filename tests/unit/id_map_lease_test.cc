// Host id ranges: one per live environment, host-wide, given back when the
// holder lets go or dies.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <set>

#include "isolation/namespaces/user_namespace.h"
#include "os/file_lock.h"

namespace moat {
namespace {

using isolation::namespaces::leaseIdMap;

class IdMapLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-idmap-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(IdMapLeaseTest, LiveLeasesNeverShareARange) {
  std::vector<isolation::namespaces::IdMapLease> leases;
  std::set<uint32_t> bases;
  for (int i = 0; i < 200; ++i) {
    auto lease = leaseIdMap(dir_);
    ASSERT_TRUE(lease.ok()) << lease.error().message();
    EXPECT_GE(lease->map.hostBase, 0x40000000u);
    EXPECT_EQ(lease->map.hostBase % 65536u, 0u);
    EXPECT_TRUE(bases.insert(lease->map.hostBase).second) << "range given twice: " << lease->map.hostBase;
    leases.push_back(std::move(lease.value()));
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 200);
  leases.clear();
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 0) << "released ranges leave no files";
}

TEST_F(IdMapLeaseTest, ARangeHeldElsewhereIsSkipped) {
  // Another moatd (or `moat run`) holds ranges 5 and 6.
  auto five = os::FileLock::tryAcquire(dir_ + "/5");
  auto six = os::FileLock::tryAcquire(dir_ + "/6");
  ASSERT_TRUE(five.ok() && six.ok());
  auto lease = leaseIdMap(dir_, 5);
  ASSERT_TRUE(lease.ok()) << lease.error().message();
  EXPECT_EQ(lease->map.hostBase, 0x40000000u + 7 * 65536u);
  auto again = os::FileLock::tryAcquire(dir_ + "/7");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().sysErrno, EWOULDBLOCK);
  // The last range is followed by the first.
  auto wrapped = leaseIdMap(dir_, isolation::namespaces::kIdMapSlots - 1);
  ASSERT_TRUE(wrapped.ok());
  auto next = leaseIdMap(dir_, isolation::namespaces::kIdMapSlots - 1);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->map.hostBase, 0x40000000u);
}

TEST_F(IdMapLeaseTest, ADeadHoldersRangeIsFreeAgain) {
  std::string path = dir_ + "/7";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lock = os::FileLock::tryAcquire(path);
    char byte = lock.ok() ? 1 : 0;
    (void)!::write(ready[1], &byte, 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(byte, 1);
  auto whileAlive = os::FileLock::tryAcquire(path);
  ASSERT_FALSE(whileAlive.ok());
  EXPECT_EQ(whileAlive.error().sysErrno, EWOULDBLOCK);
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto afterDeath = os::FileLock::tryAcquire(path);  // a crash leaves the file, not the lock
  EXPECT_TRUE(afterDeath.ok()) << afterDeath.error().message();
}

TEST_F(IdMapLeaseTest, ALockFileThatIsASymlinkIsRefused) {
  std::filesystem::create_symlink("/etc/passwd", dir_ + "/3");
  auto lock = os::FileLock::tryAcquire(dir_ + "/3");
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.error().sysErrno, ELOOP);
}

}  // namespace
}  // namespace moat
