// The exec gate's second look (os/exec_trace.h): whether what a process
// runs after its exec is what was judged, and what a tracee's stop is.
#include <signal.h>
#include <sys/ptrace.h>

#include <gtest/gtest.h>

#include "os/exec_trace.h"

namespace moat::os {
namespace {

using Args = std::vector<std::string>;

TEST(ExecTrace, TheSameExecIsTheSame) {
  EXPECT_TRUE(sameExec("/bin/true", {"true", "a"}, true, {"/bin/true", {"true", "a"}}));
  // No arguments: the kernel gives the program an empty argv[0].
  EXPECT_TRUE(sameExec("/bin/true", {}, true, {"/bin/true", {""}}));
}

TEST(ExecTrace, ANameOrAnArgumentChangedAfterTheCheckIsNotTheSame) {
  EXPECT_FALSE(sameExec("/bin/true", {"x", "/f"}, true, {"/usr/bin/rm", {"x", "/f"}}));
  EXPECT_FALSE(sameExec("/bin/ls", {"ls", "/tmp"}, true, {"/bin/ls", {"ls", "/etc"}}));
  EXPECT_FALSE(sameExec("/bin/ls", {"ls"}, true, {"/bin/ls", {"ls", "-R", "/"}})) << "an argument added";
  EXPECT_FALSE(sameExec("/bin/ls", {"ls", "a"}, true, {"/bin/ls", {"ls"}})) << "an argument gone";
}

// A script runs as [interpreter, (its argument), the script, the rest].
TEST(ExecTrace, AScriptRunsUnderItsInterpreter) {
  EXPECT_TRUE(sameExec("/tmp/s", {"s", "a", "b"}, true, {"/tmp/s", {"/bin/sh", "/tmp/s", "a", "b"}}));
  EXPECT_TRUE(sameExec("./s", {"./s"}, true, {"./s", {"/usr/bin/env", "python3", "./s"}}));
  EXPECT_FALSE(sameExec("/tmp/s", {"s", "a"}, true, {"/tmp/s", {"/bin/sh", "/tmp/t", "a"}}));
  EXPECT_FALSE(sameExec("/tmp/s", {"s", "a"}, true, {"/tmp/s", {"/bin/sh", "/tmp/s", "b"}}));
}

// What was judged was cut (at most 256 arguments, 64 KiB): what was read
// must be where it was, the rest is not compared.
TEST(ExecTrace, ACutRequestIsComparedAsFarAsItWasRead) {
  EXPECT_TRUE(sameExec("/bin/rm", {"rm", "a", "bb"}, false, {"/bin/rm", {"rm", "a", "bbbb", "c"}}));
  EXPECT_FALSE(sameExec("/bin/rm", {"rm", "a", "bb"}, false, {"/bin/rm", {"rm", "z", "bbbb", "c"}}));
  EXPECT_FALSE(sameExec("/bin/rm", {"rm", "a", "bb"}, false, {"/bin/rm", {"rm", "a"}}));
  EXPECT_TRUE(sameExec("/tmp/s", {"s", "a"}, false, {"/tmp/s", {"/bin/sh", "/tmp/s", "a", "more"}}));
}

TEST(ExecTrace, StopsAreToldApart) {
  auto stopped = [](int sig, int event) { return (event << 16) | (sig << 8) | 0x7f; };
  EXPECT_EQ(classifyStop(stopped(SIGTRAP, PTRACE_EVENT_EXEC)), TraceStop::kExec);
  EXPECT_EQ(classifyStop(stopped(SIGSTOP, PTRACE_EVENT_STOP)), TraceStop::kGroup);
  EXPECT_EQ(classifyStop(stopped(SIGUSR1, 0)), TraceStop::kSignal);
  EXPECT_EQ(classifyStop(stopped(SIGTRAP, PTRACE_EVENT_FORK)), TraceStop::kOther);
}

}  // namespace
}  // namespace moat::os
