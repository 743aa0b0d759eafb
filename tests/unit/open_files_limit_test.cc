// os::raiseOpenFilesLimit (moatd's start: docs/BENCHMARKS.md, "1,000 idle
// environments"): a hard limit lower than what --max-environments needs is
// raised where the caller may (CAP_SYS_RESOURCE), and otherwise the soft
// limit is raised to the hard one without an error. Run in a child: a
// lowered hard limit cannot be taken back without the capability.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "os/file.h"
#include "os/process.h"

namespace {

bool mayRaiseLimits() {
  auto status = moat::os::readFile("/proc/self/status");
  if (!status.ok()) return false;
  const auto at = status->find("CapEff:");
  if (at == std::string::npos) return false;
  const unsigned long long eff = std::strtoull(status->c_str() + at + 7, nullptr, 16);
  return (eff >> CAP_SYS_RESOURCE) & 1;
}

}  // namespace

TEST(OpenFilesLimit, AHardLimitTooLowIsRaisedWhereTheCallerMayAndTheSoftOneMeetsIt) {
  const bool may = mayRaiseLimits();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    struct rlimit low = {100, 256};
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) ::_exit(10);
    auto before = moat::os::raiseOpenFilesLimit(4032);
    if (!before.ok()) ::_exit(11);
    if (before->rlim_cur != 100 || before->rlim_max != 256) ::_exit(12);  // what it was, to give environments
    struct rlimit now;
    if (::getrlimit(RLIMIT_NOFILE, &now) != 0) ::_exit(13);
    if (now.rlim_cur != now.rlim_max) ::_exit(14);
    if (may && now.rlim_max < 4032) ::_exit(15);
    if (!may && now.rlim_max != 256) ::_exit(16);
    // Asked for less than it has: the hard limit stays.
    if (!moat::os::raiseOpenFilesLimit(10).ok()) ::_exit(17);
    struct rlimit again;
    if (::getrlimit(RLIMIT_NOFILE, &again) != 0 || again.rlim_max != now.rlim_max) ::_exit(18);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's check that failed (10-18); CAP_SYS_RESOURCE: " << may;
}
