// os::raiseOpenFilesLimit (moatd's start: docs/BENCHMARKS.md, "1,000 idle
// environments"): a hard limit lower than what --max-environments needs is
// raised where the caller may (CAP_SYS_RESOURCE in the first user
// namespace), and otherwise the soft limit is raised to the hard one
// without an error. Run in a child: a
// lowered hard limit cannot be taken back without the capability.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "os/file.h"
#include "os/process.h"

namespace {

// uid 0 of the first user namespace (a container's root may show the
// capability and still not raise a hard limit).
bool initialUserNamespace() {
  auto map = moat::os::readFile("/proc/self/uid_map");
  if (!map.ok()) return false;
  unsigned long long inside = 1, outside = 1, count = 0;
  return std::sscanf(map->c_str(), "%llu %llu %llu", &inside, &outside, &count) == 3 && inside == 0 && outside == 0 &&
         count == 4294967295ULL;
}

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
  const bool must = may && initialUserNamespace();
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
    // Raised, or (not allowed: no CAP_SYS_RESOURCE, or a user namespace's
    // root, which shows it but may not) left as it was: nothing between.
    const bool raised = now.rlim_max >= 4032;
    if (!raised && now.rlim_max != 256) ::_exit(15);
    if (!may && raised) ::_exit(16);
    if (must && !raised) ::_exit(19);
    // Asked for less than it has: the hard limit stays.
    if (!moat::os::raiseOpenFilesLimit(10).ok()) ::_exit(17);
    struct rlimit again;
    if (::getrlimit(RLIMIT_NOFILE, &again) != 0 || again.rlim_max != now.rlim_max) ::_exit(18);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's check that failed (10-19); CAP_SYS_RESOURCE: " << may
                                    << ", first user namespace: " << initialUserNamespace();
}
