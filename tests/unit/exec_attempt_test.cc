// What the exec gate reads of an exec: its program and argv, from another
// process's memory. The reads end where the process's mappings end, so an
// argv placed against an unmapped page is read whole when it is whole and
// refused when its end is missing.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "os/exec_notify.h"

namespace moat::os {
namespace {

constexpr size_t kPage = 4096;

// A forked copy of this process (same addresses) that waits to be read.
class Copy {
 public:
  Copy() {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (;;) ::pause();
    }
  }
  ~Copy() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// Two pages, the second unmapped: whatever is put at the first one's end
// has nothing readable after it.
char* pageBeforeAHole() {
  void* p = ::mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  ::munmap(static_cast<char*>(p) + kPage, kPage);
  return static_cast<char*>(p);
}

ExecNotification execveOf(pid_t pid, const char* path, const void* argv) {
  ExecNotification n;
  n.pid = pid;
  n.nr = SYS_execve;
  n.args[0] = reinterpret_cast<uint64_t>(path);
  n.args[1] = reinterpret_cast<uint64_t>(argv);
  return n;
}

TEST(ExecAttempt, ReadsTheProgramAndEveryArgument) {
  static const char* argv[] = {"rm", "-rf", "/workspace/d", nullptr};
  Copy copy;
  auto a = readExecAttempt(execveOf(copy.pid(), "/usr/bin/rm", argv));
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ(a->filename, "/usr/bin/rm");
  EXPECT_EQ(a->argv, (std::vector<std::string>{"rm", "-rf", "/workspace/d"}));
}

// The argv array and a string end where the mapping ends: read whole (a
// read that does not stop at the page's end loses them).
TEST(ExecAttempt, AnArgvAgainstTheEndOfAMappingIsReadWhole) {
  char* page = pageBeforeAHole();
  ASSERT_NE(page, nullptr);
  // "sh\0" in the page's last three bytes, the pointer array just before.
  char* name = page + kPage - 3;
  std::memcpy(name, "sh", 3);
  auto* ptrs = reinterpret_cast<const char**>(page + kPage - 8 - 3 * sizeof(char*));
  ptrs[0] = name;
  ptrs[1] = "-c";
  ptrs[2] = nullptr;
  Copy copy;
  auto a = readExecAttempt(execveOf(copy.pid(), name, ptrs));
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ(a->filename, "sh");
  EXPECT_EQ(a->argv, (std::vector<std::string>{"sh", "-c"}));
  ::munmap(page, kPage);
}

// No NULL before the mapping ends: the kernel would fail this exec with
// EFAULT; the gate does not judge a cut argv as if it were whole.
TEST(ExecAttempt, AnArgvWithoutItsEndIsRefused) {
  char* page = pageBeforeAHole();
  ASSERT_NE(page, nullptr);
  auto* ptrs = reinterpret_cast<const char**>(page + kPage - 2 * sizeof(char*));
  ptrs[0] = "rm";
  ptrs[1] = "-rf";
  Copy copy;
  auto a = readExecAttempt(execveOf(copy.pid(), "/usr/bin/rm", ptrs));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message().find("read exec argv"), std::string::npos) << a.error().message();
  ::munmap(page, kPage);
  // A string without its NUL likewise.
  char* other = pageBeforeAHole();
  ASSERT_NE(other, nullptr);
  std::memcpy(other + kPage - 2, "rm", 2);
  static const char* argv[] = {"rm", nullptr};
  Copy second;
  auto b = readExecAttempt(execveOf(second.pid(), other + kPage - 2, argv));
  EXPECT_FALSE(b.ok());
  ::munmap(other, kPage);
}

TEST(ExecAttempt, AGoneProcessIsAnError) {
  pid_t pid;
  {
    Copy copy;
    pid = copy.pid();
  }
  static const char* argv[] = {"true", nullptr};
  EXPECT_FALSE(readExecAttempt(execveOf(pid, "/bin/true", argv)).ok());
}

}  // namespace
}  // namespace moat::os
