// The exec gate's second look (os/exec_trace.h): whether what a process
// runs after its exec is what was judged, what a script runs as, and what a
// tracee's stop is.
#include "os/exec_trace.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace moat::os {
namespace {

const FileId kTrue{1, 10};
const FileId kRm{1, 11};
const FileId kSh{1, 12};

ExecFile binary(FileId id) {
  ExecFile f;
  f.id = id;
  return f;
}

ExecFile script(FileId id, std::string interpreter, std::string arg, FileId interpreterId) {
  ExecFile f;
  f.id = id;
  f.script = true;
  f.interpreter = std::move(interpreter);
  f.hasInterpreterArg = !arg.empty();
  f.interpreterArg = std::move(arg);
  f.interpreterId = interpreterId;
  return f;
}

TEST(ExecTrace, TheSameExecIsTheSame) {
  EXPECT_TRUE(sameExec("/bin/true", {"true", "a"}, binary(kTrue), kTrue, {"/bin/true", {"true", "a"}}));
  // No arguments: the kernel gives the program an empty argv[0].
  EXPECT_TRUE(sameExec("/bin/true", {}, binary(kTrue), kTrue, {"/bin/true", {""}}));
}

TEST(ExecTrace, ANameAFileOrAnArgumentChangedAfterTheCheckIsNotTheSame) {
  EXPECT_FALSE(sameExec("/bin/true", {"x", "/f"}, binary(kTrue), kRm, {"/usr/bin/rm", {"x", "/f"}}));
  // The name the same (a descriptor, a renamed file), the file another.
  EXPECT_FALSE(sameExec("/dev/fd/3", {"x", "/f"}, binary(kTrue), kRm, {"/dev/fd/3", {"x", "/f"}}));
  EXPECT_FALSE(sameExec("/bin/ls", {"ls", "/tmp"}, binary(kTrue), kTrue, {"/bin/ls", {"ls", "/etc"}}));
  EXPECT_FALSE(sameExec("/bin/ls", {"ls"}, binary(kTrue), kTrue, {"/bin/ls", {"ls", "-R", "/"}}));
  EXPECT_FALSE(sameExec("/bin/ls", {"ls", "a"}, binary(kTrue), kTrue, {"/bin/ls", {"ls"}}));
}

// A script runs as [interpreter, (its argument), the script, the rest], and
// only under the interpreter its line names: words put before the script's
// name by a racing thread are not a script's interpreter.
TEST(ExecTrace, AScriptRunsUnderItsInterpreterAndNothingElse) {
  ExecFile s = script({1, 20}, "/bin/sh", "", kSh);
  EXPECT_TRUE(sameExec("/tmp/s", {"s", "a", "b"}, s, kSh, {"/tmp/s", {"/bin/sh", "/tmp/s", "a", "b"}}));
  EXPECT_FALSE(sameExec("/tmp/s", {"s", "a"}, s, kRm, {"/tmp/s", {"/bin/sh", "/tmp/s", "a"}})) << "another interpreter";
  EXPECT_FALSE(sameExec("/tmp/s", {"s", "a"}, s, kSh, {"/tmp/s", {"/bin/sh", "-c", "rm -rf /", "/tmp/s", "a"}}));
  EXPECT_FALSE(sameExec("/tmp/s", {"s", "a"}, s, kSh, {"/tmp/s", {"/bin/sh", "/tmp/s", "b"}}));
  ExecFile env = script({1, 21}, "/usr/bin/env", "python3 -u", {1, 30});
  EXPECT_EQ(scriptArgv(env, "./s", {"./s", "x"}), (std::vector<std::string>{"/usr/bin/env", "python3 -u", "./s", "x"}));
  EXPECT_TRUE(sameExec("./s", {"./s", "x"}, env, {1, 30}, {"./s", {"/usr/bin/env", "python3 -u", "./s", "x"}}));
}

// The file and its "#!" line as the kernel reads them.
TEST(ExecTrace, AFileIsIdentifiedWithItsInterpreter) {
  auto dir = std::filesystem::temp_directory_path() / ("moat-exec-trace-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "s") << "#!  /bin/sh   -e  \t\necho hi\n";
  std::ofstream(dir / "plain") << "\x7f"
                                  "ELF...";
  std::ofstream(dir / "empty") << "#!   \n";
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/root";
  auto s = identifyExecFile(::getpid(), self + (dir / "s").string());
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_TRUE(s->script);
  EXPECT_EQ(s->interpreter, "/bin/sh");
  EXPECT_EQ(s->interpreterArg, "-e");
  EXPECT_TRUE(runningFile(::getpid()).ok());
  EXPECT_NE(s->interpreterId, FileId{}) << "found through the process's root";
  auto plain = identifyExecFile(::getpid(), self + (dir / "plain").string());
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->script);
  EXPECT_NE(plain->id, s->id);
  // Lines without a newline, as the kernel reads them: an argument keeps
  // its trailing blank, and a blank after the name is an empty argument.
  std::ofstream(dir / "nonl-arg") << "#!/bin/sh -x ";
  std::ofstream(dir / "nonl-blank") << "#!/bin/sh ";
  auto nonlArg = identifyExecFile(::getpid(), self + (dir / "nonl-arg").string());
  ASSERT_TRUE(nonlArg.ok());
  EXPECT_EQ(nonlArg->interpreterArg, "-x ");
  auto nonlBlank = identifyExecFile(::getpid(), self + (dir / "nonl-blank").string());
  ASSERT_TRUE(nonlBlank.ok());
  EXPECT_TRUE(nonlBlank->hasInterpreterArg);
  EXPECT_EQ(nonlBlank->interpreterArg, "");
  EXPECT_EQ(scriptArgv(nonlBlank.value(), "/s", {"s"}), (std::vector<std::string>{"/bin/sh", "", "/s"}));
  // A FIFO at the name: refused without waiting for a writer.
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0755), 0);
  auto fifo = identifyExecFile(::getpid(), self + (dir / "fifo").string());
  EXPECT_FALSE(fifo.ok());
  auto empty = identifyExecFile(::getpid(), self + (dir / "empty").string());
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->script) << "no interpreter: the kernel refuses it";
  EXPECT_FALSE(identifyExecFile(::getpid(), self + (dir / "missing").string()).ok());
  std::filesystem::remove_all(dir);
}

TEST(ExecTrace, StopsAreToldApart) {
  auto stopped = [](int sig, int event) { return (event << 16) | (sig << 8) | 0x7f; };
  EXPECT_EQ(classifyStop(stopped(SIGTRAP, PTRACE_EVENT_EXEC)), TraceStop::kExec);
  EXPECT_EQ(classifyStop(stopped(SIGSTOP, PTRACE_EVENT_STOP)), TraceStop::kGroup);
  EXPECT_EQ(classifyStop(stopped(SIGUSR1, 0)), TraceStop::kSignal);
  EXPECT_EQ(classifyStop(stopped(SIGTRAP, PTRACE_EVENT_FORK)), TraceStop::kOther);
}

TEST(ExecTrace, NobodyTracesThisTest) { EXPECT_EQ(tracerOf(::getpid()), 0); }

}  // namespace
}  // namespace moat::os
