#include <errno.h>
#include <gtest/gtest.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "isolation/seccomp/policy.h"
#include "os/security.h"

#ifndef MOAT_SOURCE_DIR
#error "MOAT_SOURCE_DIR must be defined by tests/unit/CMakeLists.txt"
#endif

namespace moat::isolation::seccomp {
namespace {

const Rule* findRule(const Policy& policy, const std::string& name) {
  for (const auto& r : policy.rules) {
    if (r.syscall == name) return &r;
  }
  return nullptr;
}

Policy defaultPolicy() {
  auto p = parsePolicy(defaultPolicyText());
  EXPECT_TRUE(p.ok()) << p.error().message();
  return p.ok() ? p.value() : Policy{};
}

TEST(SeccompPolicy, DefaultPolicyParses) {
  auto p = parsePolicy(defaultPolicyText());
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_GE(p->rules.size(), 20u);
}

TEST(SeccompPolicy, DefaultDeniesTheDangerousSyscalls) {
  Policy policy = defaultPolicy();
  const char* mustDeny[] = {"keyctl",          "add_key",    "request_key",     "bpf",         "userfaultfd",
                            "perf_event_open", "kexec_load", "kexec_file_load", "init_module", "finit_module",
                            "delete_module",   "mount",      "umount2",         "pivot_root",  "open_by_handle_at",
                            "io_uring_setup",  "unshare",    "setns",           "clone3"};
  for (const char* name : mustDeny) {
    const Rule* r = findRule(policy, name);
    ASSERT_NE(r, nullptr) << name << " is not in the default policy";
    EXPECT_TRUE(r->conditions.empty()) << name << " must be denied unconditionally";
    EXPECT_TRUE(r->kill || r->errnoValue != 0) << name << " has no action";
  }
  // clone3 must fail with ENOSYS so libc falls back to clone (which the
  // filter can inspect); the rest are EPERM.
  EXPECT_EQ(findRule(policy, "clone3")->errnoValue, ENOSYS);
  EXPECT_EQ(findRule(policy, "keyctl")->errnoValue, EPERM);
  EXPECT_EQ(findRule(policy, "unshare")->errnoValue, EPERM);
}

TEST(SeccompPolicy, CloneRuleCoversNewUser) {
  Policy policy = defaultPolicy();
  const Rule* clone = findRule(policy, "clone");
  ASSERT_NE(clone, nullptr);
  ASSERT_EQ(clone->conditions.size(), 1u);
  const Condition& flags = clone->conditions[0];
  EXPECT_EQ(flags.argIndex, 0);
  EXPECT_NE(flags.anyBits & 0x10000000ull, 0u) << "CLONE_NEWUSER";
  // And the other namespace flags: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWPID, NEWNET.
  for (uint64_t flag : {0x00020000ull, 0x02000000ull, 0x04000000ull, 0x08000000ull, 0x20000000ull, 0x40000000ull}) {
    EXPECT_NE(flags.anyBits & flag, 0u) << std::hex << flag;
  }
  // But not CLONE_THREAD/CLONE_VM: threads and fork must keep working.
  EXPECT_EQ(flags.anyBits & 0x00010100ull, 0u);
  EXPECT_EQ(clone->errnoValue, EPERM);
}

TEST(SeccompPolicy, EveryRuleSaysWhy) {
  Policy policy = defaultPolicy();
  std::set<std::string> seen;
  for (const auto& r : policy.rules) {
    EXPECT_NE(r.why.find_first_not_of(" \t"), std::string::npos)
        << r.syscall << " (line " << r.line << ") has no reason";
    EXPECT_GT(r.line, 0);
    std::string key = r.syscall;
    for (const auto& c : r.conditions) {
      key += " " + std::to_string(c.argIndex) +
             (c.equals ? "==" + std::to_string(c.value) : "&" + std::to_string(c.anyBits));
    }
    EXPECT_TRUE(seen.insert(key).second) << key << " appears twice";
  }
}

TEST(SeccompPolicy, PolicyFileIsWhatTheBinaryEmbeds) {
  std::string path = std::string(MOAT_SOURCE_DIR) + "/policy/seccomp/default.policy";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), defaultPolicyText());
  EXPECT_FALSE(defaultPolicyText().empty());
}

// Syscalls the x86_64 ABI does not have (or libseccomp does not know there).
const std::set<std::string> kMayBeMissingOnX86_64 = {
    "create_module", "query_module", "get_kernel_syms", "nfsservctl", "uselib",
};

TEST(SeccompPolicy, CompilesWithNothingImportantSkipped) {
  Policy policy = defaultPolicy();
  auto program = compile(policy);
  ASSERT_TRUE(program.ok()) << program.error().message();
  EXPECT_GT(program->filter.size(), policy.rules.size()) << "BPF program looks too short";
#if defined(__x86_64__)
  for (const auto& name : program->skipped) {
    EXPECT_TRUE(kMayBeMissingOnX86_64.count(name)) << name << " was skipped on x86_64: the filter does not deny it";
  }
#endif
  // defaultProgram() is the filter embedded at build time: exactly this compilation.
  auto embedded = defaultProgram();
  ASSERT_TRUE(embedded.ok()) << embedded.error().message();
  ASSERT_EQ(embedded->filter.size(), program->filter.size());
  for (size_t i = 0; i < program->filter.size(); ++i) {
    const auto& a = embedded->filter[i];
    const auto& b = program->filter[i];
    EXPECT_TRUE(a.code == b.code && a.jt == b.jt && a.jf == b.jf && a.k == b.k) << "instruction " << i;
  }
}

TEST(SeccompPolicy, CompileSkipsUnknownSyscall) {
  auto policy = parsePolicy("no_such_syscall_xyz EPERM # test\nkeyctl EPERM # test\n");
  ASSERT_TRUE(policy.ok()) << policy.error().message();
  auto program = compile(policy.value());
  ASSERT_TRUE(program.ok()) << program.error().message();
  ASSERT_EQ(program->skipped.size(), 1u);
  EXPECT_EQ(program->skipped[0], "no_such_syscall_xyz");
  EXPECT_FALSE(program->filter.empty());
}

TEST(SeccompPolicy, ParsesActionsAndArgRules) {
  auto policy = parsePolicy(
      "# comment only\n"
      "\n"
      "   keyctl   KILL   # kill it\n"
      "clone EACCES arg2 has-any 0x30 # two bits\n"
      "bpf ENOTSUP#tight comment\n"
      "socket EPERM arg0 == 40 # one value\n"
      "socket EPERM arg0 == 16 arg2 == 15 # two conditions\n");
  ASSERT_TRUE(policy.ok()) << policy.error().message();
  ASSERT_EQ(policy->rules.size(), 5u);
  ASSERT_EQ(policy->rules[3].conditions.size(), 1u);
  EXPECT_TRUE(policy->rules[3].conditions[0].equals);
  EXPECT_EQ(policy->rules[3].conditions[0].value, 40u);
  EXPECT_EQ(policy->rules[3].conditions[0].argIndex, 0);
  ASSERT_EQ(policy->rules[4].conditions.size(), 2u);
  EXPECT_EQ(policy->rules[4].conditions[1].argIndex, 2);
  EXPECT_EQ(policy->rules[4].conditions[1].value, 15u);
  EXPECT_FALSE(policy->rules[1].conditions[0].equals);
  EXPECT_EQ(policy->rules[0].syscall, "keyctl");
  EXPECT_TRUE(policy->rules[0].kill);
  EXPECT_EQ(policy->rules[0].line, 3);
  EXPECT_TRUE(policy->rules[0].conditions.empty());
  EXPECT_EQ(policy->rules[1].errnoValue, EACCES);
  ASSERT_EQ(policy->rules[1].conditions.size(), 1u);
  EXPECT_EQ(policy->rules[1].conditions[0].argIndex, 2);
  EXPECT_EQ(policy->rules[1].conditions[0].anyBits, 0x30u);
  EXPECT_EQ(policy->rules[1].line, 4);
  EXPECT_EQ(policy->rules[2].errnoValue, ENOTSUP);
  EXPECT_NE(policy->rules[2].why.find("tight comment"), std::string::npos);
}

struct BadPolicy {
  const char* what;
  std::string line;
  std::string mustMention;
};

TEST(SeccompPolicy, ParseErrorsNameLineAndProblem) {
  const BadPolicy cases[] = {
      {"unknown action", "keyctl EFOO # why", "unknown action 'EFOO'"},
      {"missing action", "keyctl # why", "missing action"},
      {"bad argN (index)", "clone EPERM arg6 has-any 0x1 # why", "argN"},
      {"bad argN (name)", "clone EPERM flags has-any 0x1 # why", "argN"},
      {"missing has-any", "clone EPERM arg0 any-of 0x1 # why", "has-any"},
      {"zero mask", "clone EPERM arg0 has-any 0x0 # why", "bad mask"},
      {"value beyond 32 bits", "socket EPERM arg0 == 0x100000028 # why", "bad value"},
      {"non-numeric value", "socket EPERM arg0 == vsock # why", "bad value"},
      {"non-numeric mask", "clone EPERM arg0 has-any 0xZZ # why", "bad mask"},
      {"missing comment", "keyctl EPERM", "no comment"},
      {"blank comment", "keyctl EPERM #   ", "no comment"},
      {"bad syscall name", "KeyCtl EPERM # why", "bad syscall name"},
      {"bad syscall name (punctuation)", "key-ctl EPERM # why", "bad syscall name"},
      {"extra fields", "keyctl EPERM extra # why", "unexpected fields"},
      {"half a second condition", "socket EPERM arg0 == 16 arg2 # why", "unexpected fields"},
  };
  for (const auto& c : cases) {
    // Two good lines and a blank one first: the bad one is line 4.
    std::string text = "# header\nbpf EPERM # ok\n\n" + c.line + "\nmount EPERM # ok\n";
    auto p = parsePolicy(text);
    ASSERT_FALSE(p.ok()) << c.what << ": accepted";
    EXPECT_EQ(p.error().code, Code::kInvalidArgument) << c.what;
    EXPECT_NE(p.error().context.find("line 4"), std::string::npos) << c.what << ": " << p.error().context;
    EXPECT_NE(p.error().context.find(c.mustMention), std::string::npos) << c.what << ": " << p.error().context;
  }
}

// --- the filter in a real process ---------------------------------------------

// Runs `body` in a forked child after installing the default filter; the
// child reports failures as text on a pipe and exits 0 when all checks pass.
// Returns the child's wait status and what it wrote.
struct ChildOutcome {
  int status = 0;
  std::string report;
};

template <class Body>
ChildOutcome runFiltered(const std::vector<sock_filter>& filter, Body body, bool install = true) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, "pipe failed"};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string report;
    if (install) {
      if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) report += "no_new_privs failed; ";
      Status s = os::installSeccomp(filter);
      if (!s.ok()) report += "install failed: " + s.error().message() + "; ";
    }
    if (report.empty()) body(report);
    ssize_t ignored = ::write(fds[1], report.data(), report.size());
    (void)ignored;
    ::_exit(report.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  ChildOutcome outcome;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) outcome.report.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  ::waitpid(pid, &outcome.status, 0);
  return outcome;
}

// Threads still start under the filter (clone without namespace flags).
void expectAThreadRuns(std::string& report) {
  bool ran = false;
  std::thread t([&] { ran = true; });
  t.join();
  if (!ran) report += "thread did not run; ";
}

void expectErrno(std::string& report, const char* what, long rc, int want) {
  int got = errno;
  if (rc != -1 || got != want) {
    report += std::string(what) + ": rc=" + std::to_string(rc) + " errno=" + std::to_string(got) + " (want " +
              std::to_string(want) + "); ";
  }
}

TEST(SeccompFilter, DefaultFilterDeniesInARealProcess) {
  auto program = defaultProgram();
  ASSERT_TRUE(program.ok()) << program.error().message();
  auto outcome = runFiltered(program->filter, [](std::string& report) {
    errno = 0;
    long rc = ::syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3 /* session */, 0);
    expectErrno(report, "keyctl", rc, EPERM);
    errno = 0;
    rc = ::unshare(CLONE_NEWUSER);
    expectErrno(report, "unshare(CLONE_NEWUSER)", rc, EPERM);
    errno = 0;
    rc = ::syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, nullptr, 0);
    expectErrno(report, "bpf", rc, EPERM);
    errno = 0;
    rc = ::syscall(SYS_clone3, nullptr, 0);
    expectErrno(report, "clone3", rc, ENOSYS);
    // AF_VSOCK (40), also with the high half of the int argument set: the
    // kernel reads only the low 32 bits.
    errno = 0;
    rc = ::syscall(SYS_socket, 40, SOCK_STREAM, 0);
    expectErrno(report, "socket(AF_VSOCK)", rc, EPERM);
    errno = 0;
    rc = ::syscall(SYS_socket, 0x100000000L | 40, SOCK_STREAM, 0);
    expectErrno(report, "socket(AF_VSOCK | 1 << 32)", rc, EPERM);
    // A kernel-uevent netlink socket; a route one still works.
    errno = 0;
    rc = ::syscall(SYS_socket, 16, SOCK_DGRAM, 15);
    expectErrno(report, "socket(AF_NETLINK, NETLINK_KOBJECT_UEVENT)", rc, EPERM);
    int route = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (route < 0)
      report += "socket(AF_NETLINK, NETLINK_ROUTE) failed; ";
    else
      ::close(route);
    int unixSocket = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (unixSocket < 0)
      report += "socket(AF_UNIX) failed; ";
    else
      ::close(unixSocket);
    errno = 0;
    rc = ::syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (rc == 0) ::_exit(0);  // the filter let it through: the parent reports it
    expectErrno(report, "clone(CLONE_NEWUSER)", rc, EPERM);

    // Ordinary calls still work.
    if (::getpid() <= 0) report += "getpid failed; ";
    if (::syscall(SYS_personality, 0 /* PER_LINUX */) == -1) report += "personality(0) failed; ";
    int p[2];
    if (::pipe(p) != 0 || ::write(p[1], "ok", 2) != 2) report += "write failed; ";
    // fork (plain clone) works and so do threads (clone3 falls back to clone).
    pid_t child = ::fork();
    if (child == 0) ::_exit(42);
    int st = 0;
    if (child < 0 || ::waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 42) {
      report += "fork failed; ";
    }
    expectAThreadRuns(report);
  });
  ASSERT_TRUE(WIFEXITED(outcome.status)) << "child died: status " << outcome.status;
  EXPECT_EQ(WEXITSTATUS(outcome.status), 0) << outcome.report;
  EXPECT_EQ(outcome.report, "");
}

// moatd's own profile (policy/seccomp/moatd.policy): the exploit primitives
// and other processes are out of reach; what moatd itself does (mounts and
// network namespaces for egress, sockets, threads, exec of mkfs) is not.
TEST(SeccompPolicy, MoatdProfileDeniesPrimitivesAndKeepsWhatMoatdNeeds) {
  auto p = parsePolicy(moatdPolicyText());
  ASSERT_TRUE(p.ok()) << p.error().message();
  std::set<std::string> denied;
  for (const auto& r : p->rules) {
    denied.insert(r.syscall);
    EXPECT_FALSE(r.why.empty()) << r.syscall << " (line " << r.line << ") says not why";
  }
  for (const char* must :
       {"bpf", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "keyctl", "kexec_load", "init_module",
        "finit_module", "userfaultfd", "perf_event_open", "io_uring_setup", "open_by_handle_at"}) {
    EXPECT_TRUE(denied.count(must)) << must << " is not denied to moatd";
  }
  // pivot_root: a QEMU's child enters a root of its own (vm.cc).
  for (const char* needed :
       {"mount", "umount2", "unshare", "setns", "clone", "clone3", "socket", "ioctl", "execve", "openat", "sendmsg",
        "seccomp", "pidfd_open", "pidfd_send_signal", "pivot_root", "move_mount", "fsopen", "fsmount"}) {
    EXPECT_FALSE(denied.count(needed)) << needed << " is denied but moatd uses it";
  }
  auto program = compile(p.value());
  ASSERT_TRUE(program.ok()) << program.error().message();
  auto outcome = runFiltered(program->filter, [](std::string& report) {
    errno = 0;
    long rc = ::syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, nullptr, 0);
    expectErrno(report, "bpf", rc, EPERM);
    errno = 0;
    rc = ::syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, ::getppid(), 0, 0);
    expectErrno(report, "ptrace", rc, EPERM);
    errno = 0;
    rc = ::syscall(SYS_pidfd_getfd, 0, 0, 0);
    expectErrno(report, "pidfd_getfd", rc, EPERM);
    // Allowed: a mount attempt fails for its own reasons, not EPERM from the filter.
    errno = 0;
    rc = ::syscall(SYS_mount, "none", "/nonexistent-moat-test", "tmpfs", 0, nullptr);
    if (rc == 0 || (errno == EPERM && ::geteuid() == 0)) {
      report += "mount: rc=" + std::to_string(rc) + " errno=" + std::to_string(errno) + "; ";
    }
    int p2[2];
    if (::pipe(p2) != 0 || ::write(p2[1], "ok", 2) != 2) report += "write failed; ";
    expectAThreadRuns(report);
  });
  ASSERT_TRUE(WIFEXITED(outcome.status)) << "child died: status " << outcome.status;
  EXPECT_EQ(outcome.report, "");
}

// QEMU's profile (policy/seccomp/qemu.policy, docs/MICROVM.md "QEMU's
// jail"): the build embeds exactly what the file says; it takes the
// exploit primitives, namespaces and mounts, and keeps what QEMU does as it
// starts and runs (threads, its own seccomp sandbox, Landlock, ioctls on
// /dev/kvm, sockets for user-mode networking).
TEST(SeccompPolicy, QemuProfileDeniesPrimitivesAndKeepsWhatQemuNeeds) {
  std::ifstream in(std::string(MOAT_SOURCE_DIR) + "/policy/seccomp/qemu.policy", std::ios::binary);
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  auto p = parsePolicy(text.str());
  ASSERT_TRUE(p.ok()) << p.error().message();
  std::set<std::string> denied;
  for (const auto& r : p->rules) {
    if (r.conditions.empty()) denied.insert(r.syscall);
    EXPECT_NE(r.why.find_first_not_of(" \t"), std::string::npos)
        << r.syscall << " (line " << r.line << ") says not why";
  }
  for (const char* must :
       {"bpf", "ptrace", "process_vm_readv", "pidfd_getfd", "keyctl", "userfaultfd", "perf_event_open",
        "io_uring_setup", "unshare", "setns", "mount", "init_module", "open_by_handle_at", "kexec_load"}) {
    EXPECT_TRUE(denied.count(must)) << must << " is not denied to QEMU";
  }
  for (const char* needed : {"clone", "socket", "ioctl", "execve", "openat", "seccomp", "prctl",
                             "landlock_restrict_self", "mmap", "madvise", "eventfd2", "timerfd_create"}) {
    EXPECT_FALSE(denied.count(needed)) << needed << " is denied but QEMU uses it";
  }
  auto program = compile(p.value());
  ASSERT_TRUE(program.ok()) << program.error().message();
  auto embedded = qemuProgram();
  ASSERT_TRUE(embedded.ok());
  ASSERT_EQ(embedded->filter.size(), program->filter.size()) << "the build embeds another qemu.policy";
  for (size_t i = 0; i < program->filter.size(); ++i) {
    const auto& a = embedded->filter[i];
    const auto& b = program->filter[i];
    EXPECT_TRUE(a.code == b.code && a.jt == b.jt && a.jf == b.jf && a.k == b.k) << "instruction " << i;
  }
  auto outcome = runFiltered(embedded->filter, [](std::string& report) {
    errno = 0;
    long rc = ::syscall(SYS_io_uring_setup, 8, nullptr);
    expectErrno(report, "io_uring_setup", rc, EPERM);
    // The rules with conditions: a clone with a namespace flag and the
    // uevent socket are refused, clone3 says ENOSYS (glibc falls back),
    // the sockets QEMU's user-mode network uses are made.
    errno = 0;
    rc = ::syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, nullptr, nullptr, nullptr, 0);
    if (rc == 0) ::_exit(0);
    expectErrno(report, "clone(CLONE_NEWUSER)", rc, EPERM);
    errno = 0;
    rc = ::syscall(SYS_clone3, nullptr, 0);
    expectErrno(report, "clone3", rc, ENOSYS);
    errno = 0;
    rc = ::socket(AF_NETLINK, SOCK_RAW, 15 /* NETLINK_KOBJECT_UEVENT */);
    expectErrno(report, "uevent socket", rc, EPERM);
    for (int family : {AF_INET, AF_UNIX}) {
      int fd = ::socket(family, SOCK_DGRAM, 0);
      if (fd < 0) report += "socket(" + std::to_string(family) + "): errno " + std::to_string(errno) + "; ";
      if (fd >= 0) ::close(fd);
    }
    errno = 0;
    rc = ::syscall(SYS_unshare, CLONE_NEWUSER);
    expectErrno(report, "unshare", rc, EPERM);
    errno = 0;
    rc = ::syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3 /* session */, 0);
    expectErrno(report, "keyctl", rc, EPERM);
    // QEMU puts its own sandbox on top: a second filter may still be added.
    std::vector<sock_filter> allowAll = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    Status again = os::installSeccomp(allowAll, true);
    if (!again.ok()) report += "a second filter: " + again.error().message() + "; ";
    expectAThreadRuns(report);
  });
  ASSERT_TRUE(WIFEXITED(outcome.status)) << "child died: status " << outcome.status;
  EXPECT_EQ(outcome.report, "");
}

TEST(SeccompFilter, PersonalityQueryIsAllowed) {
  // personality(0xffffffff) only reads the persona (gdb, setarch do it before
  // changing ADDR_NO_RANDOMIZE); it sets no bit and must not be denied.
  auto program = defaultProgram();
  ASSERT_TRUE(program.ok()) << program.error().message();
  auto outcome = runFiltered(program->filter, [](std::string& report) {
    errno = 0;
    long rc = ::syscall(SYS_personality, 0xffffffffUL);
    if (rc == -1) report += "personality(0xffffffff): errno " + std::to_string(errno);
  });
  ASSERT_TRUE(WIFEXITED(outcome.status)) << "child died: status " << outcome.status;
  EXPECT_EQ(outcome.report, "");
}

#if defined(__x86_64__)
long int80Getpid() {
  long ret = 20;  // __NR_getpid in the i386 table
  asm volatile("int $0x80" : "+a"(ret) : : "memory");
  return ret;
}

TEST(SeccompFilter, ForeignAbisAreKilled) {
  auto program = defaultProgram();
  ASSERT_TRUE(program.ok()) << program.error().message();
  // Without a filter: does this kernel serve the i386 ABI at all?
  auto baseline = runFiltered(
      program->filter,
      [](std::string& report) {
        if (int80Getpid() != ::getpid()) report += "int80 getpid mismatch";
      },
      /*install=*/false);
  if (!WIFEXITED(baseline.status) || WEXITSTATUS(baseline.status) != 0) {
    GTEST_SKIP() << "kernel without IA32 emulation (status " << baseline.status << ")";
  }
  auto i386 = runFiltered(program->filter, [](std::string& report) {
    long r = int80Getpid();
    report += "int 0x80 returned " + std::to_string(r);
  });
  ASSERT_TRUE(WIFSIGNALED(i386.status)) << "i386 syscall was not killed: " << i386.report;
  EXPECT_EQ(WTERMSIG(i386.status), SIGSYS);

  auto x32 = runFiltered(program->filter, [](std::string& report) {
    long r = ::syscall(0x40000000L | 39 /* x32 getpid */);
    report += "x32 syscall returned " + std::to_string(r);
  });
  ASSERT_TRUE(WIFSIGNALED(x32.status)) << "x32 syscall was not killed: " << x32.report;
  EXPECT_EQ(WTERMSIG(x32.status), SIGSYS);
}
#endif

}  // namespace
}  // namespace moat::isolation::seccomp
