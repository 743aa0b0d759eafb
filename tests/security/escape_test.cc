// Escape attempts: each test runs moat-probe (probe.cc) inside a fresh
// environment with one attempt and checks its verdict. The probe prints
// "blocked: ..." (exit 0) when the attempt failed as it should and
// "ESCAPED: ..." (exit 1) when it got through; sanity attempts print "ok:".
//
// Tests that need host-side state (a canary file, a listener, an IPC key)
// create it here, pass what the probe needs on its command line, and check
// the host side afterwards too.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/random.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "moat_process.h"

namespace moat::test {
namespace {

// The build's bin directory (moat-probe among the build outputs), bound
// read-only into every environment.
constexpr const char* kProbeDir = "/opt/moat-probe";

std::string probePath() { return std::string(kProbeDir) + "/moat-probe"; }

// MOAT_ESCAPE_ISOLATION=microvm (make test-escape-microvm, docs/MICROVM.md,
// "Tests"): every attempt runs in a microVM guest (moat run --isolation
// microvm) whose template holds the probe at the same path, a few of the
// host's /etc files and nothing else; what needs the host's own template
// is skipped there, saying so.
bool inMicroVm() {
  const char* isolation = std::getenv("MOAT_ESCAPE_ISOLATION");
  return isolation && std::string(isolation) == "microvm";
}

// An attempt whose meaning is another in a guest, skipped there saying why.
#define MOAT_SKIP_IN_MICROVM(why) \
  if (inMicroVm()) GTEST_SKIP() << why
// Why: what it checks is the host template's (its layout, its /usr, moat's
// template copy, a -v volume), which a guest's own template is not.
constexpr const char* kHostTemplates =
    "checks the host template's layout, which a microVM guest's own template is not (docs/MICROVM.md)";
// Why: what it reaches is the guest's own kernel, whose whole surface a
// guest's commands have by design (namespaces, io_uring, bpf, keys, its
// devices and kernel files); the host's is behind QEMU's jail.
constexpr const char* kGuestKernel =
    "reaches the guest's own kernel, whose surface a microVM's commands have by design (docs/MICROVM.md, "
    "\"What a guest's commands may do\")";

// The guest's template, made once per run (root's, writable by root alone:
// docs/MICROVM.md).
class ProbeTree {
 public:
  ProbeTree() {
    char dir[] = "/tmp/moat-escape-vm-XXXXXX";
    if (!::mkdtemp(dir)) return;
    path_ = dir;
    ::chmod(dir, 0755);
    for (const char* sub : {"/opt", "/opt/moat-probe", "/etc", "/root", "/var", "/var/tmp", "/tmp", "/workspace"}) {
      ::mkdir((path_ + sub).c_str(), 0755);
    }
    copy(binDir() + "/moat-probe", path_ + probePath(), 0755);
    for (const char* file : {"/etc/passwd", "/etc/group", "/etc/debian_version"}) copy(file, path_ + file, 0644);
  }
  ~ProbeTree() {
    if (!path_.empty()) (void)std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }

 private:
  static void copy(const std::string& from, const std::string& to, mode_t mode) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream out(to, std::ios::binary);
    out << in.rdbuf();
    out.close();
    ::chmod(to.c_str(), mode);
  }
  std::string path_;
};

const std::string& probeTree() {
  static ProbeTree tree;
  return tree.path();
}

ProcessResult runProbe(const std::vector<std::string>& probeArgs, const std::map<std::string, std::string>& env = {},
                       const std::vector<std::string>& moatOptions = {}) {
  std::vector<std::string> args = {"run", "-v", binDir() + ":" + kProbeDir + ":ro"};
  if (inMicroVm()) args = {"run", "--isolation", "microvm", "--template", probeTree()};
  args.insert(args.end(), moatOptions.begin(), moatOptions.end());
  args.push_back("--");
  args.push_back(probePath());
  args.insert(args.end(), probeArgs.begin(), probeArgs.end());
  return runMoat(args, "", env);
}

std::string describe(const ProcessResult& r) {
  return "moat exit " + std::to_string(r.exitCode) + "\n--- stdout ---\n" + r.out + "--- stderr ---\n" + r.err;
}

bool startsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

::testing::AssertionResult Blocked(const ProcessResult& r) {
  if (startsWith(r.out, "ESCAPED:")) {
    return ::testing::AssertionFailure() << "SANDBOX ESCAPE: " << describe(r);
  }
  if (r.exitCode != 0 || !startsWith(r.out, "blocked:")) {
    return ::testing::AssertionFailure() << "the probe did not report 'blocked': " << describe(r);
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Succeeded(const ProcessResult& r) {
  if (r.exitCode != 0 || !startsWith(r.out, "ok:")) {
    return ::testing::AssertionFailure() << "the probe did not report 'ok': " << describe(r);
  }
  return ::testing::AssertionSuccess();
}

#define EXPECT_BLOCKED(...)          \
  do {                               \
    MOAT_REQUIRE_ROOT();             \
    auto r_ = runProbe(__VA_ARGS__); \
    EXPECT_TRUE(Blocked(r_));        \
  } while (0)

// pid 1 comes about in two ways (backend/namespaces InitMode): moat-init
// exec'd from its host binary, or the moat process itself continuing in the
// cloned child (the CLI's default). Everything about pid 1 is tried in both.
const std::map<std::string, std::string> kInitModes[] = {
    {{"MOAT_INIT_MODE", "in-process"}},
    {{"MOAT_INIT_MODE", "exec"}},
};

#define EXPECT_BLOCKED_IN_BOTH_INIT_MODES(...)            \
  do {                                                    \
    MOAT_REQUIRE_ROOT();                                  \
    for (const auto& mode_ : kInitModes) {                \
      SCOPED_TRACE(mode_.at("MOAT_INIT_MODE") + " init"); \
      auto r_ = runProbe(__VA_ARGS__, mode_);             \
      EXPECT_TRUE(Blocked(r_));                           \
    }                                                     \
  } while (0)

std::string randomHex(size_t bytes = 12) {
  std::vector<unsigned char> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : buf) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

std::string readHostFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file with a random secret on the host, removed at the end of the test.
class Canary {
 public:
  explicit Canary(const std::string& dir)
      : path_(dir + "/moat-canary-" + randomHex(6)), secret_("moat-secret-" + randomHex()) {
    std::ofstream(path_) << secret_ << "\n";
    ::chmod(path_.c_str(), 0644);
  }
  ~Canary() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }
  const std::string& secret() const { return secret_; }
  bool intact() const { return readHostFile(path_) == secret_ + "\n"; }

 private:
  std::string path_, secret_;
};

void expectCanaryUnreachable(const std::string& dir) {
  MOAT_REQUIRE_ROOT();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) GTEST_SKIP() << dir << " does not exist on this host";
  Canary canary(dir);
  ASSERT_TRUE(canary.intact());
  // Both init modes: the attempt also goes through /proc/1/root.
  for (const auto& mode : kInitModes) {
    SCOPED_TRACE(mode.at("MOAT_INIT_MODE") + " init");
    auto r = runProbe({"host-file", canary.path()}, mode);
    EXPECT_TRUE(Blocked(r));
    EXPECT_NE(r.out.find(canary.path() + " ENOENT"), std::string::npos) << describe(r);
    EXPECT_EQ(r.out.find(canary.secret()), std::string::npos) << describe(r);
    EXPECT_EQ(r.err.find(canary.secret()), std::string::npos) << describe(r);
  }
  EXPECT_TRUE(canary.intact());
}

// --- host files ---------------------------------------------------------------

TEST(Escape, HostFileUnderRootUnreachable) { expectCanaryUnreachable("/root"); }

TEST(Escape, HostFileUnderHomeUnreachable) { expectCanaryUnreachable("/home"); }

// The "shocker" breakout: the host file's handle, decoded against the /usr
// bind (the same host file system), would open it without any path lookup.
TEST(Escape, OpenByHandleOfHostFileDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  MOAT_REQUIRE_ROOT();
  Canary canary("/root");
  std::vector<unsigned char> storage(sizeof(file_handle) + MAX_HANDLE_SZ);
  auto* fh = reinterpret_cast<file_handle*>(storage.data());
  fh->handle_bytes = MAX_HANDLE_SZ;
  int mountId = 0;
  ASSERT_EQ(::name_to_handle_at(AT_FDCWD, canary.path().c_str(), fh, &mountId, 0), 0) << std::strerror(errno);
  struct stat usr, root;
  ASSERT_EQ(::stat("/usr", &usr), 0);
  ASSERT_EQ(::stat("/root", &root), 0);
  if (usr.st_dev != root.st_dev) {
    GTEST_SKIP() << "/root and /usr are different file systems here: the handle could not resolve";
  }
  std::string hex;
  for (unsigned i = 0; i < fh->handle_bytes; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", fh->f_handle[i]);
    hex += b;
  }
  auto r = runProbe({"open-by-handle", std::to_string(fh->handle_type), hex});
  EXPECT_TRUE(Blocked(r));
  EXPECT_EQ(r.out.find(canary.secret()), std::string::npos) << describe(r);
}

TEST(Escape, ShadowHoldsNoHostEntry) {
  MOAT_REQUIRE_ROOT();
  auto r = runProbe({"shadow"});
  EXPECT_TRUE(Blocked(r));
  std::istringstream host(readHostFile("/etc/shadow"));
  std::string line;
  while (std::getline(host, line)) {
    if (startsWith(line, "root:")) {
      EXPECT_EQ(r.out.find(line), std::string::npos) << "the host's root entry is visible inside";
    }
  }
}

TEST(Escape, MountinfoHostPathsUnreachable) {
  MOAT_SKIP_IN_MICROVM(kHostTemplates);
  MOAT_REQUIRE_ROOT();
  auto r = runProbe({"mountinfo-paths"});
  EXPECT_TRUE(Blocked(r));
  // The attempt is only meaningful if it found host paths to try.
  EXPECT_NE(r.out.find("/dev/"), std::string::npos) << describe(r);
}

TEST(Escape, OverlayOptionsNameNoHostPaths) {
  MOAT_SKIP_IN_MICROVM(kHostTemplates);
  MOAT_REQUIRE_ROOT();
  auto r = runMoat({"run", "--", "cat", "/proc/self/mountinfo"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  bool sawOverlay = false;
  while (std::getline(lines, line)) {
    if (line.find(" - overlay ") == std::string::npos) continue;
    sawOverlay = true;
    for (const char* option : {"lowerdir=/", "upperdir=/", "workdir=/"}) {
      EXPECT_EQ(line.find(option), std::string::npos) << line;
    }
    EXPECT_EQ(line.find(testStateDir()), std::string::npos) << line;
  }
  EXPECT_TRUE(sawOverlay) << r.out;
}

// No mount inside names where moat keeps its state: each line's root (the
// path within its file system) and options. The /dev skeleton and the
// /proc masks bound from it named <state>/templates/dev-v1 here.
TEST(Escape, MountinfoNamesNoStatePath) {
  MOAT_SKIP_IN_MICROVM(kHostTemplates);
  MOAT_REQUIRE_ROOT();
  auto r = runMoat({"run", "--", "cat", "/proc/self/mountinfo"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  ASSERT_NE(r.out.find(" /dev "), std::string::npos) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line)) {
    EXPECT_EQ(line.find(testStateDir()), std::string::npos) << line;
    EXPECT_EQ(line.find("/storage/"), std::string::npos) << line;
  }
  // And /dev is no handle on the storage pool (a bind from its btrfs would
  // answer btrfs ioctls listing every environment's subvolume).
  auto fs = runMoat({"run", "--", "stat", "-f", "-c", "%T", "/dev"});
  EXPECT_EQ(fs.out, "tmpfs\n") << describe(fs);
}

// The host's /usr is bound read-only; root inside must get no more of it
// than an unprivileged host user: not a file in a root-only directory, nor
// the names in it. Bound id-mapped, root inside was the owner of host
// root's files there and read them with CAP_DAC_OVERRIDE.
TEST(Escape, UsrShowsOnlyWhatUnprivilegedHostUsersRead) {
  MOAT_SKIP_IN_MICROVM(kHostTemplates);
  MOAT_REQUIRE_ROOT();
  std::string dir = "/usr/local/moat-private-" + randomHex(6);
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << std::strerror(errno);
  Canary secret(dir);
  ::chmod(secret.path().c_str(), 0600);
  Canary open("/usr/local");  // 0644: readable by anyone, so inside too
  auto r = runProbe({"host-file", secret.path()});
  EXPECT_TRUE(Blocked(r));
  EXPECT_NE(r.out.find(secret.path() + " EACCES"), std::string::npos) << describe(r);
  EXPECT_EQ(r.out.find(secret.secret()), std::string::npos) << describe(r);
  auto list = runMoat({"run", "--", "ls", dir});
  EXPECT_NE(list.exitCode, 0) << "listed a root-only directory: " << list.out;
  EXPECT_EQ(list.out.find("moat-canary"), std::string::npos) << list.out;
  auto readable = runMoat({"run", "--", "cat", open.path()});
  EXPECT_EQ(readable.out, open.secret() + "\n") << readable.err;
  ::unlink(secret.path().c_str());
  ::rmdir(dir.c_str());
}

// --- mounts and namespaces ---------------------------------------------------------

TEST(Escape, MountTmpfsDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"mount-tmpfs"});
}

TEST(Escape, NewMountApiDenied) { EXPECT_BLOCKED({"new-mount-api"}); }

TEST(Escape, UmountOfProcMasksDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"umount-mask"});
}

TEST(Escape, PivotRootDenied) { EXPECT_BLOCKED({"pivot-root"}); }

TEST(Escape, ChrootDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"chroot"});
}

TEST(Escape, UnshareDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"unshare"});
}

TEST(Escape, CloneWithNamespaceFlagsDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"clone-ns"});
}

TEST(Escape, Clone3Enosys) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  MOAT_REQUIRE_ROOT();
  auto r = runProbe({"clone3"});
  EXPECT_TRUE(Blocked(r));
  EXPECT_NE(r.out.find("clone3 flags=CLONE_NEWUSER ENOSYS"), std::string::npos) << describe(r);
}

TEST(Escape, SetnsDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED_IN_BOTH_INIT_MODES({"setns"});
}

// --- processes ------------------------------------------------------------------------

TEST(Escape, PtraceOfInitDenied) { EXPECT_BLOCKED_IN_BOTH_INIT_MODES({"ptrace-init"}); }

// moat-init's control socket, executable (the host binary: CVE-2019-5736),
// memory and environment.
TEST(Escape, InitFdsExeAndEnvironUnreachable) { EXPECT_BLOCKED_IN_BOTH_INIT_MODES({"init-fds"}); }

TEST(Escape, PidfdGetfdAndProcessVmOfInitDenied) { EXPECT_BLOCKED_IN_BOTH_INIT_MODES({"pidfd-getfd"}); }

TEST(Escape, HostProcessesInvisible) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  MOAT_REQUIRE_ROOT();
  for (const auto& mode : kInitModes) {
    SCOPED_TRACE(mode.at("MOAT_INIT_MODE") + " init");
    auto r = runProbe({"proc-pids", std::to_string(::getpid())}, mode);
    EXPECT_TRUE(Blocked(r));
    EXPECT_NE(r.out.find(" 1=moat"), std::string::npos) << describe(r);
  }
}

TEST(Escape, KillInitIgnored) {
  MOAT_REQUIRE_ROOT();
  for (const auto& mode : kInitModes) {
    SCOPED_TRACE(mode.at("MOAT_INIT_MODE") + " init");
    auto r = runProbe({"kill-init"}, mode);
    EXPECT_TRUE(Blocked(r));
    // moat itself saw the command finish normally (a dead pid 1 is exit 125).
    EXPECT_EQ(r.exitCode, 0) << describe(r);
  }
}

// --- forbidden system calls -------------------------------------------------------------

TEST(Escape, KeyctlDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"keyctl"});
}
TEST(Escape, AddKeyDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"add-key"});
}
TEST(Escape, RequestKeyDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"request-key"});
}
TEST(Escape, BpfDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"bpf"});
}
TEST(Escape, UserfaultfdDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"userfaultfd"});
}
TEST(Escape, PerfEventOpenDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"perf-event-open"});
}
TEST(Escape, IoUringDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"io-uring"});
}
TEST(Escape, InitModuleDenied) { EXPECT_BLOCKED({"init-module"}); }
TEST(Escape, FinitModuleDenied) { EXPECT_BLOCKED({"finit-module"}); }
TEST(Escape, DeleteModuleDenied) { EXPECT_BLOCKED({"delete-module"}); }
TEST(Escape, KexecLoadDenied) { EXPECT_BLOCKED({"kexec-load"}); }
TEST(Escape, RebootDenied) { EXPECT_BLOCKED({"reboot"}); }
TEST(Escape, SwaponDenied) { EXPECT_BLOCKED({"swapon"}); }
TEST(Escape, SyslogDenied) { EXPECT_BLOCKED({"syslog"}); }
TEST(Escape, SettimeofdayDenied) { EXPECT_BLOCKED({"settimeofday"}); }
TEST(Escape, SethostnameDenied) { EXPECT_BLOCKED({"sethostname"}); }
TEST(Escape, IoplAndIopermDenied) { EXPECT_BLOCKED({"iopl"}); }
TEST(Escape, AcctDenied) { EXPECT_BLOCKED({"acct"}); }

// Whether this kernel serves the i386 entry at all (a kernel built or
// booted without IA32 emulation answers int $0x80 with SIGSEGV): asked in a
// child on the host, outside any filter.
bool kernelServesI386() {
  pid_t pid = ::fork();
  if (pid == 0) {
    long r;
    asm volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory", "cc", "r8", "r9", "r10", "r11");
    ::_exit(r == ::getpid() ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The i386 entry (int $0x80) numbers system calls differently: a filter
// that let it through would be bypassed entirely. Where the kernel serves
// it, the filter must be what kills it (SIGSYS); where it does not, the
// call never reaches a system call table and the probe only has to fail.
TEST(Escape, Int80SyscallKilled) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  MOAT_REQUIRE_ROOT();
  auto r = runProbe({"int80"});
  EXPECT_TRUE(Blocked(r));
  if (!kernelServesI386()) {
    GTEST_SKIP() << "this kernel has no IA32 emulation: int $0x80 fails before any filter (" << r.out
                 << "), so whether the filter kills i386 calls cannot be seen here; the probe was blocked";
  }
  EXPECT_NE(r.out.find("SIGSYS"), std::string::npos) << "expected the filter to kill: " << describe(r);
}

// The filter kills x32 calls (bit 30 set) before the kernel sees them: the
// probe requires SIGSYS, not the ENOSYS a kernel without x32 gives anyway.
TEST(Escape, X32SyscallKilled) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"x32"});
}

// --- network and IPC ----------------------------------------------------------------------

TEST(Escape, RawInetSocketDenied) { EXPECT_BLOCKED({"raw-inet"}); }

TEST(Escape, PacketSocketDenied) { EXPECT_BLOCKED({"raw-packet"}); }

TEST(Escape, VsockSocketDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"vsock"});
}

TEST(Escape, KernelUeventSocketDenied) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"uevent"});
}

TEST(Escape, OnlyLoopbackInterface) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  MOAT_REQUIRE_ROOT();
  auto r = runProbe({"net-ifaces"});
  EXPECT_TRUE(Blocked(r));
  EXPECT_NE(r.out.find("interfaces: lo"), std::string::npos) << describe(r);
}

// A listener on the host's loopback: the environment's 127.0.0.1 is its own.
TEST(Escape, HostTcpListenerUnreachable) {
  MOAT_REQUIRE_ROOT();
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  int port = ntohs(addr.sin_port);

  auto r = runProbe({"connect", std::to_string(port)});
  EXPECT_TRUE(Blocked(r));
  int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  EXPECT_LT(accepted, 0) << "the host listener accepted a connection from the environment";
  if (accepted >= 0) ::close(accepted);
  EXPECT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << std::strerror(errno);

  // The listener did work: a host connection reaches it.
  int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  pollfd pfd{listener, POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 2000), 1);
  accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  EXPECT_GE(accepted, 0);
  if (accepted >= 0) ::close(accepted);
  ::close(client);
  ::close(listener);
}

TEST(Escape, HostAbstractUnixSocketUnreachable) {
  MOAT_REQUIRE_ROOT();
  std::string name = "moat-security-" + randomHex(8);
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(listener, 16), 0);

  auto r = runProbe({"abstract-unix", name});
  EXPECT_TRUE(Blocked(r));
  int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  EXPECT_LT(accepted, 0) << "the host socket accepted a connection from the environment";
  if (accepted >= 0) ::close(accepted);

  int client = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), len), 0)
      << "the host socket does not work: " << std::strerror(errno);
  ::close(client);
  ::close(listener);
}

TEST(Escape, HostSysvIpcInvisible) {
  MOAT_REQUIRE_ROOT();
  key_t key = 0;
  int shm = -1, msg = -1;
  for (int i = 0; i < 16 && (shm < 0 || msg < 0); ++i) {
    if (shm >= 0) ::shmctl(shm, IPC_RMID, nullptr);
    if (msg >= 0) ::msgctl(msg, IPC_RMID, nullptr);
    key = static_cast<key_t>(std::stoul(randomHex(4), nullptr, 16) & 0x7fffffff);
    shm = ::shmget(key, 4096, IPC_CREAT | IPC_EXCL | 0666);
    msg = ::msgget(key, IPC_CREAT | IPC_EXCL | 0666);
  }
  ASSERT_GE(shm, 0);
  ASSERT_GE(msg, 0);
  auto r = runProbe({"sysv-ipc", std::to_string(key)});
  ::shmctl(shm, IPC_RMID, nullptr);
  ::msgctl(msg, IPC_RMID, nullptr);
  EXPECT_TRUE(Blocked(r));
}

TEST(Escape, HostnameIsolated) {
  MOAT_REQUIRE_ROOT();
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  EXPECT_BLOCKED({"hostname", name});
}

// --- /proc, /sys, cgroups -----------------------------------------------------------------

// Writes back what the file holds, so a success would change nothing.
TEST(Escape, CorePatternNotWritable) { EXPECT_BLOCKED({"write-back", "/proc/sys/kernel/core_pattern"}); }
TEST(Escape, ModprobePathNotWritable) { EXPECT_BLOCKED({"write-back", "/proc/sys/kernel/modprobe"}); }
TEST(Escape, HostnameSysctlNotWritable) { EXPECT_BLOCKED({"write-back", "/proc/sys/kernel/hostname"}); }
// "h" only prints help to the kernel log.
TEST(Escape, SysrqTriggerNotWritable) { EXPECT_BLOCKED({"write-back", "/proc/sysrq-trigger", "h"}); }

TEST(Escape, SysAbsentOrReadOnly) { EXPECT_BLOCKED({"sys-write"}); }

TEST(Escape, CgroupNamespaceRoot) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"cgroup"});
}

TEST(Escape, KernelInfoFilesReadEmpty) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"read-nothing", "/proc/kcore", "/proc/kallsyms", "/proc/keys", "/proc/timer_list", "/proc/kmsg",
                  "/proc/kpageflags", "/proc/kpagecount", "/proc/kpagecgroup", "/proc/vmallocinfo", "/proc/slabinfo"});
}

// --- devices ------------------------------------------------------------------------------

TEST(Escape, MknodBlockDeviceDenied) { EXPECT_BLOCKED({"mknod", "block"}); }
TEST(Escape, MknodCharDeviceDenied) { EXPECT_BLOCKED({"mknod", "char"}); }
TEST(Escape, DevHoldsOnlyMinimalSet) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"dev-list"});
}

TEST(Escape, HostDevicesCannotBeOpened) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"dev-open", "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg",
                  "/dev/console", "/dev/tty0", "/dev/tty1", "/dev/loop0", "/dev/loop-control", "/dev/mapper/control",
                  "/dev/net/tun", "/dev/fuse", "/dev/btrfs-control", "/dev/kvm", "/dev/vsock"});
}

// A descriptor the caller of moat leaves open (no close-on-exec) must not
// reach the command: a host directory fd is a way out of any root.
TEST(Escape, NoHostFileDescriptorsInherited) {
  MOAT_REQUIRE_ROOT();
  int leak = ::open("/root", O_RDONLY | O_DIRECTORY);  // deliberately inheritable
  ASSERT_GE(leak, 0);
  for (const auto& mode : kInitModes) {
    SCOPED_TRACE(mode.at("MOAT_INIT_MODE") + " init");
    auto r = runProbe({"fds"}, mode);
    EXPECT_TRUE(Blocked(r));
    EXPECT_EQ(r.out.find("/root"), std::string::npos) << describe(r);
  }
  ::close(leak);
}

// No controlling terminal: nothing to TIOCSTI into.

// Runs argv in a new session whose controlling terminal (and stdio) is a
// fresh pty, as a user at a terminal would; returns what the terminal showed.
ProcessResult runOnTerminal(std::vector<std::string> argv, const std::map<std::string, std::string>& extraEnv) {
  ProcessResult result;
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return result;
  std::string slave = ::ptsname(master);
  std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "MOAT_STATE=" + testStateDir(),
                                  "MOAT_STORAGE_GB=8", "TERM=xterm"};
  for (const auto& [k, v] : extraEnv) env.push_back(k + "=" + v);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    int tty = ::open(slave.c_str(), O_RDWR);  // becomes the controlling terminal
    if (tty < 0) ::_exit(120);
    ::ioctl(tty, TIOCSCTTY, 0);
    ::dup2(tty, 0);
    ::dup2(tty, 1);
    ::dup2(tty, 2);
    if (tty > 2) ::close(tty);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  char buf[4096];
  for (;;) {
    pollfd pfd{master, POLLIN, 0};
    if (::poll(&pfd, 1, 20000) <= 0) break;
    ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO once the last holder of the terminal is gone
    result.out.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(master);
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // The terminal turns "\n" into "\r\n".
  std::string out;
  for (char c : result.out) {
    if (c != '\r') out.push_back(c);
  }
  result.out = out;
  return result;
}

ProcessResult runMoatOnTerminal(const std::vector<std::string>& args,
                                const std::map<std::string, std::string>& extraEnv) {
  std::vector<std::string> argv = {binDir() + "/moat"};
  argv.insert(argv.end(), args.begin(), args.end());
  return runOnTerminal(argv, extraEnv);
}

// Run from a terminal, moat's command still cannot reach that terminal (a
// TIOCSTI there would type commands into the user's shell).
// Also what once was NoControllingTerminal: under ctest there is no terminal
// to inherit, so the "tty" attempt is only meaningful on one.
TEST(Escape, HostTerminalUnreachable) {
  MOAT_REQUIRE_ROOT();
  for (const auto& mode : kInitModes) {
    SCOPED_TRACE(mode.at("MOAT_INIT_MODE") + " init");
    for (const char* attempt : {"tty", "fds"}) {
      auto r = runMoatOnTerminal({"run", "-v", binDir() + ":" + kProbeDir + ":ro", "--", probePath(), attempt}, mode);
      EXPECT_TRUE(Blocked(r));
    }
  }
}

// --- identity and privileges --------------------------------------------------------------

TEST(Escape, UidMapUnprivileged) {
  MOAT_SKIP_IN_MICROVM(kGuestKernel);
  EXPECT_BLOCKED({"uid-map"});
}
TEST(Escape, DangerousCapabilitiesAbsent) { EXPECT_BLOCKED({"caps"}); }
TEST(Escape, NoNewPrivsAndSeccomp) { EXPECT_BLOCKED({"nnp-seccomp"}); }
// Setuid binaries (/usr/bin/su, passwd) gain nothing: every mount is nosuid.
TEST(Escape, AllMountsNosuid) {
  MOAT_SKIP_IN_MICROVM(kHostTemplates);
  EXPECT_BLOCKED({"nosuid"});
}

// --- read-only content --------------------------------------------------------------------

TEST(Escape, UsrIsReadOnly) {
  MOAT_SKIP_IN_MICROVM(kHostTemplates);
  MOAT_REQUIRE_ROOT();
  auto r = runProbe({"create-in", "/usr/bin", "/usr/lib", "/bin"});
  EXPECT_TRUE(Blocked(r));
  EXPECT_NE(r.out.find("create /usr/bin/moat-probe-file EROFS"), std::string::npos) << describe(r);
  // Its files are host root's, which root inside is not (no id mapping):
  // the permission check refuses before the read-only mount would.
  auto w = runProbe({"existing-file-write", "/usr/bin/env"});
  EXPECT_TRUE(Blocked(w));
  EXPECT_NE(w.out.find("open /usr/bin/env for writing EACCES"), std::string::npos) << describe(w);
}

TEST(Escape, ReadOnlyVolumeStaysReadOnly) {
  MOAT_SKIP_IN_MICROVM(kHostTemplates);
  MOAT_REQUIRE_ROOT();
  auto r = runProbe({"create-in", kProbeDir});
  EXPECT_TRUE(Blocked(r));
  EXPECT_NE(r.out.find("EROFS"), std::string::npos) << describe(r);
  // A file root inside owns (the volume is id-mapped) and nothing runs:
  // only the read-only mount stands in the way. (Not moat-init: every
  // environment on the host runs it, and a file being run refuses writers
  // with ETXTBSY before the mount is asked. The policy compiler runs only
  // at build time.)
  const std::string target = std::string(kProbeDir) + "/moat-seccomp-compile";
  auto w = runProbe({"existing-file-write", target});
  EXPECT_TRUE(Blocked(w));
  EXPECT_NE(w.out.find("for writing EROFS"), std::string::npos) << describe(w);
  EXPECT_NE(w.out.find("truncate " + target + " EROFS"), std::string::npos) << describe(w);
}

// Writes to files that come from the template (copied from the host's /etc)
// land in the environment's own layer: neither the host file nor the shared
// template changes, and the next environment does not see them.
TEST(Escape, OverlayWritesStayInside) {
  MOAT_SKIP_IN_MICROVM(kHostTemplates);
  MOAT_REQUIRE_ROOT();
  std::string marker = "moat-marker-" + randomHex();
  for (const char* file : {"/etc/debian_version", "/etc/passwd"}) {
    SCOPED_TRACE(file);
    auto r = runProbe({"write-file", file, marker + "\n"});
    ASSERT_TRUE(Succeeded(r));
    EXPECT_EQ(readHostFile(file).find(marker), std::string::npos) << "the host's " << file << " changed";
    std::string templateCopy = testStateDir() + "/templates/host-v2" + file;
    std::string content = readHostFile(templateCopy);
    EXPECT_FALSE(content.empty()) << "no template copy at " << templateCopy;
    EXPECT_EQ(content.find(marker), std::string::npos) << "the template's " << file << " changed";
    auto next = runMoat({"run", "--", "cat", file});
    EXPECT_EQ(next.exitCode, 0) << describe(next);
    EXPECT_EQ(next.out.find(marker), std::string::npos) << "the next environment sees the write";
  }
}

// Symlinks to host paths left in the writable layer (and /workspace itself
// replaced by one) must not be followed by the host when the environment is
// destroyed.
TEST(Escape, DestroyDoesNotFollowGuestSymlinks) {
  MOAT_REQUIRE_ROOT();
  std::string dir = "/root/moat-canary-dir-" + randomHex(6);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  {
    Canary canary(dir);
    auto r = runProbe({"plant-symlinks", dir});
    EXPECT_TRUE(Succeeded(r));
    EXPECT_TRUE(canary.intact()) << "the host canary behind a guest symlink was changed or removed";
    struct stat st;
    EXPECT_EQ(::stat("/etc/hostname", &st), 0) << "host /etc lost a file";
    EXPECT_EQ(::stat("/usr/bin/env", &st), 0) << "host /usr lost a file";
  }
  ::rmdir(dir.c_str());
}

// --- environment variables -----------------------------------------------------------------

// Neither the command's environment nor pid 1's (which, with in-process
// init, is the host moat process's own) shows the host's variables.
TEST(Escape, HostEnvironmentNotInherited) {
  MOAT_REQUIRE_ROOT();
  const std::set<std::string> allowed = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "HOSTNAME", "PWD"};
  for (const auto& mode : kInitModes) {
    SCOPED_TRACE(mode.at("MOAT_INIT_MODE") + " init");
    std::string secret = "moat-env-secret-" + randomHex();
    auto env = mode;
    env["MOAT_TEST_SECRET"] = secret;
    env["HOST_ONLY_VARIABLE"] = "1";
    auto r = runProbe({"env"}, env);
    EXPECT_TRUE(Blocked(r));
    EXPECT_EQ(r.out.find(secret), std::string::npos) << describe(r);
    std::string line = r.out.substr(0, r.out.find('\n'));
    auto start = line.find("environment: ");
    ASSERT_NE(start, std::string::npos) << describe(r);
    std::string list = line.substr(start + std::strlen("environment: "));
    std::set<std::string> keys;
    size_t pos = 0;
    while (pos < list.size()) {
      size_t end = list.find(" | ", pos);
      std::string entry = list.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      keys.insert(entry.substr(0, entry.find('=')));
      if (end == std::string::npos) break;
      pos = end + 3;
    }
    for (const auto& key : keys) EXPECT_TRUE(allowed.count(key)) << "unexpected variable " << key;
    EXPECT_TRUE(keys.count("PATH")) << describe(r);
  }
}

// --- sanity: the environment works at all ------------------------------------------------------

TEST(Sanity, WorkspaceAndTmpWritable) {
  MOAT_REQUIRE_ROOT();
  EXPECT_TRUE(Succeeded(runProbe({"workspace"})));
}

// Every attempt the probe has, run where nothing stands in its way: as host
// root, in mount, pid, uts and ipc namespaces of its own, so that what it
// does stays there (the two that only look at the host run without them).
// Each must report ESCAPED, so a "blocked" inside an environment is the
// environment's doing, not an attempt that cannot succeed. The few that
// cannot escape anywhere say why; a new attempt must be added here.
TEST(Sanity, EveryAttemptReportsItsEscapeWhereNothingStopsIt) {
  MOAT_REQUIRE_ROOT();
  auto listed = runProcess({binDir() + "/moat-probe", "--list"});
  ASSERT_EQ(listed.exitCode, 0) << describe(listed);
  std::vector<std::string> attempts;
  std::istringstream names(listed.out);
  for (std::string name; std::getline(names, name);) attempts.push_back(name);
  ASSERT_GE(attempts.size(), 60u) << listed.out;

  // What the attempts need: a canary, a host file's handle, listeners, an
  // IPC key, files the test owns.
  Canary canary("/root");
  std::string scratch = "/var/tmp/moat-probe-sanity-" + randomHex(6);
  ASSERT_EQ(::mkdir(scratch.c_str(), 0700), 0);
  std::string own = scratch + "/own-file";
  std::ofstream(own) << "test-owned\n";
  std::string fakeShadow = scratch + "/shadow";
  std::ofstream(fakeShadow) << "root:$6$salt$hash:20000:0:99999:7:::\n";
  std::vector<std::string> handle;
  {
    std::vector<unsigned char> storage(sizeof(file_handle) + MAX_HANDLE_SZ);
    auto* fh = reinterpret_cast<file_handle*>(storage.data());
    fh->handle_bytes = MAX_HANDLE_SZ;
    int mountId = 0;
    ASSERT_EQ(::name_to_handle_at(AT_FDCWD, canary.path().c_str(), fh, &mountId, 0), 0) << std::strerror(errno);
    std::string hex;
    for (unsigned i = 0; i < fh->handle_bytes; ++i) {
      char b[3];
      std::snprintf(b, sizeof b, "%02x", fh->f_handle[i]);
      hex += b;
    }
    handle = {std::to_string(fh->handle_type), hex};
  }
  int tcp = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t inLen = sizeof in;
  ASSERT_EQ(::bind(tcp, reinterpret_cast<sockaddr*>(&in), sizeof in), 0);
  ASSERT_EQ(::listen(tcp, 16), 0);
  ASSERT_EQ(::getsockname(tcp, reinterpret_cast<sockaddr*>(&in), &inLen), 0);
  std::string abstractName = "moat-sanity-" + randomHex(8);
  int unixListener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path + 1, abstractName.data(), abstractName.size());
  ASSERT_EQ(::bind(unixListener, reinterpret_cast<sockaddr*>(&un),
                   static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + abstractName.size())),
            0);
  ASSERT_EQ(::listen(unixListener, 16), 0);
  key_t key = static_cast<key_t>(std::stoul(randomHex(4), nullptr, 16) & 0x7fffffff);
  int shm = ::shmget(key, 4096, IPC_CREAT | 0600);
  ASSERT_GE(shm, 0) << std::strerror(errno);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);

  struct Plan {
    std::vector<std::string> args;
    std::string setup;          // shell commands first, in the same namespaces
    bool ownNamespaces = true;  // false: the host's own (attempts that only look)
    bool onTerminal = false;
  };
  const std::map<std::string, Plan> plans = {
      {"host-file", {{canary.path()}}},
      {"open-by-handle", {handle}},
      // The host's /etc/shadow may hold no hash to find: show it one.
      {"shadow", {{}, "mount --bind " + fakeShadow + " /etc/shadow && "}},
      {"proc-pids", {{std::to_string(::getpid())}, "", false}},
      {"connect", {{std::to_string(ntohs(in.sin_port))}}},
      {"abstract-unix", {{abstractName}}},
      {"sysv-ipc", {{std::to_string(key)}, "", false}},
      {"hostname", {{host}}},
      {"write-back", {{own}}},
      {"read-nothing", {{"/proc/kallsyms", "/proc/timer_list"}}},
      // Device nodes go to a tmpfs of the attempt's own, not the host's /dev.
      {"mknod", {{"char"}, "mount -t tmpfs none /dev && "}},
      {"dev-open", {{"/dev/null"}}},
      {"create-in", {{scratch}}},
      {"existing-file-write", {{own}}},
      {"fds", {{}, "exec 7</dev/null; "}},
      {"nosuid", {{}, "mount --bind /usr /usr && "}},
      {"tty", {{}, "", true, true}},
  };
  std::map<std::string, std::string> cannot = {
      {"kill-init",
       "the kernel ignores SIGKILL and SIGSTOP sent to a pid namespace's init from inside it; "
       "outside any pid namespace the attempt would kill the host (kill(-1, SIGKILL))"},
      {"workspace", "a sanity attempt: it reports ok: where the environment works"},
      {"write-file", "a sanity attempt: it writes a file it was told to"},
      {"plant-symlinks", "not an attempt on its own: plants links for DestroyDoesNotFollowGuestSymlinks"},
  };
  // A kernel booted without IA32 emulation answers int $0x80 with SIGSEGV
  // on the host too: nothing to escape from (Escape.Int80SyscallKilled
  // says the same and skips).
  if (!kernelServesI386()) cannot["int80"] = "this kernel has no IA32 emulation: int $0x80 fails everywhere";
  for (const auto& name : attempts) {
    SCOPED_TRACE(name);
    if (cannot.count(name)) {
      std::printf("%s: not run unsandboxed: %s\n", name.c_str(), cannot.at(name).c_str());
      continue;
    }
    Plan plan = plans.count(name) ? plans.at(name) : Plan{};
    std::vector<std::string> argv;
    if (plan.ownNamespaces) {
      argv = {"/usr/bin/unshare", "--mount", "--pid", "--fork", "--mount-proc", "--uts", "--ipc", "--"};
    }
    // sh stays pid 1 (the attempt is its child), as moat-init is inside.
    argv.insert(argv.end(), {"/bin/sh", "-c", plan.setup + "\"$0\" \"$@\"; exit $?", binDir() + "/moat-probe", name});
    argv.insert(argv.end(), plan.args.begin(), plan.args.end());
    auto r = plan.onTerminal ? runOnTerminal(argv, {}) : runProcess(argv, "", {{"MOAT_TEST_SECRET", "x"}});
    EXPECT_TRUE(startsWith(r.out, "ESCAPED:")) << name << " did not report its escape: " << describe(r);
  }
  for (const auto& [name, plan] : plans) {
    EXPECT_NE(std::find(attempts.begin(), attempts.end(), name), attempts.end()) << name << " is no attempt";
  }
  ::shmctl(shm, IPC_RMID, nullptr);
  ::close(tcp);
  ::close(unixListener);
  ::unlink(own.c_str());
  ::unlink(fakeShadow.c_str());
  ::rmdir(scratch.c_str());
}

}  // namespace
}  // namespace moat::test
