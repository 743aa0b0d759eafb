// os/users: /etc/passwd and /etc/group read as moat reads them (no NSS).
#include "os/users.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "os/process.h"

namespace moat::os {
namespace {

const char* kPasswd =
    "root:x:0:0:root:/root:/bin/bash\n"
    "# a comment\n"
    "\n"
    "alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash\n"
    "short:x:7\n"
    "bad:x:notanumber:1:b:/home/bad:/bin/sh\n"
    "bob:x:1001:100::/srv/bob:/bin/sh";  // no newline at the end

const char* kGroup =
    "root:x:0:\n"
    "users:x:100:alice\n"
    "moat:x:998:alice,bob\n"
    "docker:x:999:bobby,xalice\n";

TEST(Users, UsersAreFoundByNameOrNumber) {
  auto alice = userIn(kPasswd, "alice");
  ASSERT_TRUE(alice.ok()) << alice.error().message();
  EXPECT_EQ(alice->uid, 1000u);
  EXPECT_EQ(alice->gid, 1000u);
  EXPECT_EQ(alice->home, "/home/alice");
  auto bob = userIn(kPasswd, "1001");
  ASSERT_TRUE(bob.ok());
  EXPECT_EQ(bob->name, "bob");
  EXPECT_EQ(bob->home, "/srv/bob");
  EXPECT_EQ(bob->gid, 100u);
}

TEST(Users, MalformedLinesAndUnknownNamesAreNotFound) {
  for (const char* name : {"short", "bad", "carol", "", "x", "# a comment"}) {
    auto r = userIn(kPasswd, name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().code, Code::kNotFound);
  }
  EXPECT_NE(userIn(kPasswd, "carol").error().message().find("no user carol in /etc/passwd"), std::string::npos);
  EXPECT_FALSE(userIn(kPasswd, "0x3e8").ok()) << "a number is decimal digits only";
  // 2^32 wraps to root in a uid_t: not an id at all.
  auto wrapped = userIn("evil:x:4294967296:0::/home/evil:/bin/sh\n", "evil");
  EXPECT_FALSE(wrapped.ok()) << "uid " << (wrapped.ok() ? wrapped->uid : 0);
  EXPECT_FALSE(userIn("minus:x:4294967295:0::/h:/bin/sh\n", "minus").ok()) << "-1 means unchanged";
}

TEST(Users, GroupsAndTheirMembers) {
  EXPECT_EQ(groupIn(kGroup, "moat").value(), 998u);
  EXPECT_EQ(groupIn(kGroup, "999").value(), 999u);
  EXPECT_FALSE(groupIn(kGroup, "nogroup").ok());
  EXPECT_EQ(groupsOfIn(kGroup, "alice"), (std::vector<gid_t>{100, 998}));
  EXPECT_EQ(groupsOfIn(kGroup, "bob"), (std::vector<gid_t>{998})) << "bobby is another user";
  EXPECT_TRUE(groupsOfIn(kGroup, "carol").empty());
}

// os::runInChild (what runAsUser runs in): the child's answer comes back,
// and a child that does not finish (stuck, or stopped by the user it acts
// as) is killed at the limit.
TEST(RunInChild, AnswersWithWhatTheChildReturnedAndEndsOneThatDoesNotFinish) {
  EXPECT_TRUE(runInChild([] { return Status{}; }).ok());
  auto failed = runInChild([] { return Status(Error::make(Code::kNotFound, "the child's own words")); });
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message().find("the child's own words"), std::string::npos) << failed.error().message();
  for (int stop : {0, SIGSTOP}) {
    auto started = std::chrono::steady_clock::now();
    auto stuck = runInChild(
        [stop] {
          if (stop != 0) ::raise(stop);
          ::pause();
          return Status{};
        },
        std::chrono::milliseconds(300));
    ASSERT_FALSE(stuck.ok()) << "signal " << stop;
    EXPECT_EQ(stuck.error().code, Code::kTimeout);
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  }
}

// What `moat keys create --for-user` holds its interrupts with: one that
// comes while the work runs acts once it is done, not halfway, and what the
// work printed (buffered: stdout is a pipe) is out before it does.
TEST(TerminationSignalsHeld, AnInterruptWaitsForTheEndOfTheWork) {
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::signal(signo, SIG_DFL);
      struct rlimit noCore = {0, 0};  // SIGQUIT's default would dump one
      ::setrlimit(RLIMIT_CORE, &noCore);
      ::dup2(out[1], STDOUT_FILENO);
      {
        TerminationSignalsHeld held;
        ::raise(signo);
        std::printf("done");  // the work, finished
      }
      ::_exit(0);  // not reached: the held signal ends it here
    }
    ::close(out[1]);
    char done[4] = {};
    EXPECT_EQ(::read(out[0], done, sizeof done), 4) << "signal " << signo << " ended the work halfway";
    ::close(out[0]);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signo) << "signal " << signo << " was lost: " << status;
  }
}

}  // namespace
}  // namespace moat::os
