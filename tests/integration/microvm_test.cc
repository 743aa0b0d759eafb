// The microVM guest (issue 29's first part): moat-init boots as the pid 1
// of a QEMU microvm from the guest kernel, makes its root from a template's
// erofs image, and serves the guest protocol over virtio-serial, as it does
// in every namespace environment. TCG here (this host's /dev/kvm cannot
// boot a stock kernel): a boot takes seconds.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>
#include <string>

#include "backend/microvm/vm.h"
#include "init/protocol.h"
#include "moat_process.h"
#include "os/file.h"
#include "os/process.h"
#include "os/security.h"

namespace moat::test {
namespace {

using backend::microvm::Vm;
using backend::microvm::VmSpec;

constexpr int kBootWaitMs = 120000;  // TCG under a loaded ctest -j2: seconds, rarely tens

struct Ran {
  std::string out, err;
  int exitCode = -1;
};

class MicroVm : public ::testing::Test {
 protected:
  void SetUp() override {
    // make deps installs all three; a missing one is a failure, not a skip.
    auto kernel = backend::microvm::findGuestKernel();
    ASSERT_TRUE(kernel.ok()) << kernel.error().message();
    ASSERT_EQ(::access("/usr/bin/qemu-system-x86_64", X_OK), 0) << "apt-get install qemu-system-x86 (make deps)";
    char tmpl[] = "/tmp/moat-microvm-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    spec_.kernel = kernel.value();
    spec_.initBinary = binDir() + "/moat-init";
    spec_.rootImage = dir_ + "/root.img";
    spec_.workDir = dir_;
    spec_.memoryMb = 256;
    spec_.storageBytes = 64ull << 20;
  }
  void TearDown() override { (void)os::removeTree(dir_); }

  // A root file system of one program, /bin/tool.
  void buildRoot() {
    const std::string root = dir_ + "/tree";
    ASSERT_TRUE(os::makeDirs(root + "/bin", 0755).ok());
    auto tool = os::readFile(binDir() + "/moat-guest-tool", 64 << 20);
    ASSERT_TRUE(tool.ok()) << tool.error().message();
    ASSERT_TRUE(os::writeFile(root + "/bin/tool", tool.value(), 0755).ok());
    auto tree = os::open(root, O_PATH | O_DIRECTORY);
    ASSERT_TRUE(tree.ok());
    auto built = backend::microvm::buildRootImage(tree->get(), spec_.rootImage);
    ASSERT_TRUE(built.ok()) << built.error().message();
  }

  // The next frame, waiting at most kBootWaitMs. One that came in the
  // same read as the frame before it is not waited for: the socket has
  // nothing more to say then (the wait that made two CI runs fail, when a
  // command's Output and Exited arrived together).
  Result<init::Frame> next(Vm& vm) {
    init::Frame frame;
    auto have = reader_.next(frame);
    if (!have.ok()) return have.error();
    if (have.value()) return frame;
    pollfd p{vm.control(), POLLIN, 0};
    if (::poll(&p, 1, kBootWaitMs) != 1) return Error::fromErrno("no frame within the wait", ETIMEDOUT);
    return init::readFrame(vm.control(), reader_);
  }

  Ran run(Vm& vm, std::vector<std::string> argv) {
    init::SpawnRequest spawn;
    spawn.id = ++lastId_;
    spawn.argv = std::move(argv);
    spawn.env = {"PATH=/bin"};
    EXPECT_TRUE(init::writeFrames(vm.control(), init::encodeFrame(init::MsgType::kSpawn, spawn.encode())).ok());
    Ran ran;
    for (;;) {
      auto f = next(vm);
      if (!f.ok()) {
        ADD_FAILURE() << f.error().message() << "\n" << vm.consoleTail();
        return ran;
      }
      if (f->type == init::MsgType::kOutput) {
        auto o = init::Output::decode(f->payload);
        if (o.ok()) (o->stream == init::Stream::kStdout ? ran.out : ran.err) += o->data;
      } else if (f->type == init::MsgType::kExited) {
        auto e = init::Exited::decode(f->payload);
        if (e.ok()) ran.exitCode = e->exitCode;
        return ran;
      } else if (f->type == init::MsgType::kSpawnFailed) {
        auto e = init::SpawnFailed::decode(f->payload);
        ADD_FAILURE() << "spawn failed: " << (e.ok() ? e->stage + " " + std::to_string(e->err) : "?");
        return ran;
      }
    }
  }

  std::string dir_;
  VmSpec spec_;
  init::FrameReader reader_;
  uint32_t lastId_ = 0;
};

TEST_F(MicroVm, MoatInitServesTheGuestProtocolFromTheGuestKernel) {
  buildRoot();
  auto vm = Vm::start(spec_);
  ASSERT_TRUE(vm.ok()) << vm.error().message();
  auto hello = next(vm.value());
  ASSERT_TRUE(hello.ok()) << hello.error().message() << "\n" << vm->consoleTail();
  ASSERT_EQ(hello->type, init::MsgType::kHello);
  auto h = init::Hello::decode(hello->payload);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->initPid, 1u) << "moat-init is the guest's pid 1";
  // The guest's own kernel, not the host's.
  Ran uname = run(vm.value(), {"/bin/tool", "uname"});
  EXPECT_EQ(uname.exitCode, 0) << uname.err;
  EXPECT_EQ(uname.out, spec_.kernel.version + "\n");
  // The root is the template's image under a writable layer.
  Ran wrote = run(vm.value(), {"/bin/tool", "write", "/workspace/note", "kept"});
  EXPECT_EQ(wrote.exitCode, 0) << wrote.err;
  Ran read = run(vm.value(), {"/bin/tool", "cat", "/workspace/note"});
  EXPECT_EQ(read.out, "kept");
  Ran cmdline = run(vm.value(), {"/bin/tool", "cat", "/proc/1/cmdline"});
  EXPECT_EQ(cmdline.out, std::string("/init\0--guest\0", 14));
  // Shutdown ends moat-init, so the guest's kernel, so QEMU.
  ASSERT_TRUE(init::writeFrames(vm->control(), init::encodeFrame(init::MsgType::kShutdown, "")).ok());
  pollfd p{vm->pidfd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, kBootWaitMs), 1) << "QEMU ended with its guest\n" << vm->consoleTail();
}

// What the guest prints is the guest's to choose: its console log on the
// host stops at 1 MiB, and QEMU and the guest go on.
// The bound is the spec's (1 MiB by default): a small one here, since the
// guest's serial port takes TCG a few seconds a MiB on a quiet machine
// and many times that under a loaded ctest -j2.
TEST_F(MicroVm, AGuestFloodingItsConsoleFillsNothingOnTheHost) {
  buildRoot();
  spec_.consoleBytes = 64 << 10;
  auto vm = Vm::start(spec_);
  ASSERT_TRUE(vm.ok()) << vm.error().message();
  auto hello = next(vm.value());
  ASSERT_TRUE(hello.ok()) << hello.error().message() << "\n" << vm->consoleTail();
  Ran flood = run(vm.value(), {"/bin/tool", "flood", "/dev/console", "256K"});
  EXPECT_EQ(flood.exitCode, 0) << flood.err;
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/console.log").c_str(), &st), 0);
  EXPECT_LE(st.st_size, 64 << 10) << "the console log is bounded";
  EXPECT_GE(st.st_size, 32 << 10) << "the flood reached it";
  Ran after = run(vm.value(), {"/bin/tool", "uname"});
  EXPECT_EQ(after.out, spec_.kernel.version + "\n") << "the guest still serves";
}

TEST_F(MicroVm, AGuestThatCannotMakeItsRootEndsAndSaysWhy) {
  ASSERT_TRUE(os::writeFile(spec_.rootImage, std::string(1 << 20, '\0'), 0600).ok());  // not erofs
  auto vm = Vm::start(spec_);
  ASSERT_TRUE(vm.ok()) << vm.error().message();
  pollfd p{vm->pidfd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, kBootWaitMs), 1) << "QEMU ended with its guest\n" << vm->consoleTail();
  auto frame = next(vm.value());
  EXPECT_FALSE(frame.ok() && frame->type == init::MsgType::kHello) << "no Hello from a guest without a root";
  EXPECT_NE(vm->consoleTail().find("moat-init: mount erofs on /moat/lower"), std::string::npos) << vm->consoleTail();
}

// mkfs.erofs reads the tree as root by its paths: Landlock keeps it to the
// tree, its program and libraries, and the image's directory, so a link
// swapped in while it reads reaches nothing else of the host's. A stand-in
// for mkfs.erofs reports what it could read.
TEST_F(MicroVm, TheImageMakerReadsTheTreeAndNothingElseOfTheHosts) {
  const std::string root = dir_ + "/tree";
  ASSERT_TRUE(os::makeDirs(root, 0755).ok());
  ASSERT_TRUE(os::writeFile(root + "/inside", "tree's\n", 0644).ok());
  const std::string script = dir_ + "/fake-mkfs";
  ASSERT_TRUE(os::writeFile(script,
                            "#!/bin/sh\n"
                            "# mkfs.erofs -T0 IMAGE TREE\n"
                            "{ /usr/bin/cat \"$3/inside\" || echo no-tree; /usr/bin/cat /etc/passwd >/dev/null 2>&1 && "
                            "echo host-read || echo host-denied; } > \"$2\"\n",
                            0755)
                  .ok());
  ::setenv("MOAT_MKFS_EROFS", script.c_str(), 1);
  auto tree = os::open(root, O_PATH | O_DIRECTORY);
  ASSERT_TRUE(tree.ok());
  auto built = backend::microvm::buildRootImage(tree->get(), spec_.rootImage);
  ::unsetenv("MOAT_MKFS_EROFS");
  ASSERT_TRUE(built.ok()) << built.error().message();
  auto image = os::readFile(spec_.rootImage);
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(image.value(), "tree's\nhost-denied\n");
}

// QEMU runs under Landlock: a process restricted by the same ruleset (a
// QEMU taken over by its guest) runs programs from /usr and reads the
// guest kernel, its given files and libraries, and writes its console;
// nothing of the host's beyond: not /etc/passwd, not /tmp, not its root
// image for writing.
TEST_F(MicroVm, QemuReachesOnlyItsOwnFilesOfTheHosts) {
  buildRoot();
  const std::string secret = dir_ + "/secret";
  ASSERT_TRUE(os::writeFile(secret, "host's\n", 0644).ok());
  const std::string console = dir_ + "/console.log";
  ASSERT_TRUE(os::writeFile(console, "", 0600).ok());
  auto root = os::open(spec_.rootImage, O_RDONLY | O_CLOEXEC);
  auto log = os::open(console, O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_TRUE(root.ok() && log.ok());
  auto paths = backend::microvm::qemuPaths(spec_, "/usr/bin/qemu-system-x86_64", false);
  ASSERT_TRUE(paths.ok()) << paths.error().message();
  auto ruleset = backend::microvm::qemuRuleset(paths.value(), {root->get()}, log->get());
  ASSERT_TRUE(ruleset.ok()) << ruleset.error().message();
  int pipeFds[2];
  ASSERT_EQ(::pipe(pipeFds), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipeFds[0]);
    std::string report;
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || os::landlockRestrictInChild(ruleset->get()) != 0) {
      report = "restrict failed";
    } else {
      auto tryOpen = [&](const std::string& path, int flags) {
        int fd = ::open(path.c_str(), flags | O_CLOEXEC);
        report += path + (fd >= 0 ? ":ok " : ":" + std::to_string(errno) + " ");
        if (fd >= 0) ::close(fd);
      };
      tryOpen("/usr/bin/qemu-system-x86_64", O_RDONLY);
      tryOpen(spec_.kernel.image, O_RDONLY);
      tryOpen("/proc/self/fd/" + std::to_string(root->get()), O_RDONLY);
      tryOpen("/proc/self/fd/" + std::to_string(log->get()), O_WRONLY | O_APPEND);
      tryOpen("/etc/passwd", O_RDONLY);
      tryOpen(secret, O_RDONLY);
      tryOpen("/proc/self/fd/" + std::to_string(root->get()), O_WRONLY);
      tryOpen("/tmp", O_RDONLY | O_DIRECTORY);
    }
    (void)!::write(pipeFds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipeFds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipeFds[0], buf, sizeof buf)) > 0;) report.append(buf, static_cast<size_t>(n));
  ::close(pipeFds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::string denied = ":" + std::to_string(EACCES) + " ";
  EXPECT_NE(report.find("/usr/bin/qemu-system-x86_64:ok"), std::string::npos) << report;
  EXPECT_NE(report.find(spec_.kernel.image + ":ok"), std::string::npos) << report;
  EXPECT_NE(report.find("/proc/self/fd/" + std::to_string(root->get()) + ":ok"), std::string::npos) << report;
  EXPECT_NE(report.find("/proc/self/fd/" + std::to_string(log->get()) + ":ok"), std::string::npos) << report;
  EXPECT_NE(report.find("/etc/passwd" + denied), std::string::npos) << report;
  EXPECT_NE(report.find(secret + denied), std::string::npos) << report;
  EXPECT_NE(report.find("/tmp" + denied), std::string::npos) << report;
  // The root image is read only to it: the second open of it, for writing.
  const std::string rootLink = "/proc/self/fd/" + std::to_string(root->get());
  EXPECT_NE(report.find(rootLink + denied), std::string::npos) << report;
}

// moat's seccomp profile for QEMU (policy/seccomp/qemu.policy) is in force
// from QEMU's first instruction: a stand-in started in QEMU's place, as a
// QEMU taken over by its guest, cannot make a user namespace, an io_uring,
// a key or a userfaultfd (each works without the profile, even under
// Landlock and no_new_privs); it is pid 1 of a pid namespace of its own
// (no host process can be signalled or traced by its pid from it); and its
// root is its own: no /etc/passwd of the host's to find by a stat (which
// Landlock allows), no host pid in its proc.
TEST_F(MicroVm, QemuRunsUnderMoatsSeccompProfile) {
  ASSERT_TRUE(os::writeFile(spec_.rootImage, "", 0644).ok());
  ASSERT_TRUE(os::makeDirs(dir_ + "/bin", 0755).ok());
  const std::string standIn = dir_ + "/bin/qemu-system-x86_64";
  auto tool = os::readFile(binDir() + "/moat-guest-tool", 64 << 20);
  ASSERT_TRUE(tool.ok()) << tool.error().message();
  ASSERT_TRUE(os::writeFile(standIn, tool.value(), 0755).ok());
  ::setenv("MOAT_QEMU", standIn.c_str(), 1);
  auto vm = Vm::start(spec_);
  ::unsetenv("MOAT_QEMU");
  ASSERT_TRUE(vm.ok()) << vm.error().message();
  pollfd p{vm->pidfd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000), 1) << "the stand-in did not end";
  const std::string eperm = std::to_string(EPERM);
  // The first process of pid and mount namespaces of its own (root makes
  // them), whose root has no /etc/passwd and whose proc no host pid.
  const bool root = ::geteuid() == 0;
  const std::string pid = root ? "1" : std::to_string(vm->pid());
  const std::string absent = root ? std::to_string(ENOENT) : "0";
  EXPECT_NE(vm->consoleTail().find("jail: pid=" + pid + " unshare-user=" + eperm + " io_uring=" + eperm + " keyctl=" +
                                   eperm + " userfaultfd=" + eperm + " passwd=" + absent + " proc-2=" + absent),
            std::string::npos)
      << vm->consoleTail();
}

// `moat run --isolation microvm`: the same command line, the command in a
// guest of its own.
class MicroVmRun : public MicroVm {
 protected:
  void SetUp() override {
    MicroVm::SetUp();
    if (!isRoot()) GTEST_SKIP() << "needs root: moat run leases a host id range for QEMU (CI runs as root)";
    tree_ = dir_ + "/tree";
    ASSERT_TRUE(os::makeDirs(tree_ + "/bin", 0755).ok());
    auto tool = os::readFile(binDir() + "/moat-guest-tool", 64 << 20);
    ASSERT_TRUE(tool.ok());
    ASSERT_TRUE(os::writeFile(tree_ + "/bin/tool", tool.value(), 0755).ok());
  }
  // moat run with this test's own directory of guests.
  ProcessResult moatRun(const std::vector<std::string>& args) { return runMoat(args, "", {{"MOAT_VMS_DIR", vms()}}); }
  std::string vms() const { return dir_ + "/vms"; }
  std::vector<std::string> runArgs(std::vector<std::string> command) {
    std::vector<std::string> args = {"run", "--isolation", "microvm", "--template", tree_, "--memory", "256", "--"};
    args.insert(args.end(), command.begin(), command.end());
    return args;
  }
  std::string tree_;
};

// The children of `parent` named `comm`.
std::vector<pid_t> childrenNamed(pid_t parent, const std::string& comm) {
  std::vector<pid_t> found;
  DIR* d = ::opendir("/proc");
  while (dirent* e = d ? ::readdir(d) : nullptr) {
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    if (statusOf(pid, "PPid") == std::to_string(parent) && statusOf(pid, "Name").rfind(comm, 0) == 0) {
      found.push_back(pid);
    }
  }
  if (d) ::closedir(d);
  return found;
}

size_t entriesIn(const std::string& path) {
  size_t n = 0;
  DIR* d = ::opendir(path.c_str());
  while (dirent* e = d ? ::readdir(d) : nullptr) n += e->d_name[0] != '.';
  if (d) ::closedir(d);
  return n;
}

TEST_F(MicroVmRun, TheCommandRunsOnTheGuestsKernelAndItsExitCodeIsMoatRuns) {
  // What a run killed with SIGKILL left: its directory, its lock free.
  ASSERT_TRUE(os::makeDirs(vms() + "/run-0123456789ab", 0700).ok());
  ASSERT_TRUE(os::writeFile(vms() + "/run-0123456789ab/console.log", "old\n", 0600).ok());
  auto r = moatRun(runArgs({"/bin/tool", "uname"}));
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, spec_.kernel.version + "\n") << r.err;
  // A program the command starts runs too (a guest's moat-init gates every
  // exec; moat run lets every one go).
  auto nested = moatRun(runArgs({"/bin/tool", "exec", "/bin/tool", "uname"}));
  EXPECT_EQ(nested.exitCode, 0) << nested.err;
  EXPECT_EQ(nested.out, spec_.kernel.version + "\n") << nested.err;
  auto missing = moatRun(runArgs({"/bin/tool", "cat", "/nope"}));
  EXPECT_EQ(missing.exitCode, 1) << missing.err;
  EXPECT_NE(missing.err.find("/nope: No such file or directory"), std::string::npos) << missing.err;
  EXPECT_EQ(entriesIn(vms()), 0u) << "each guest's directory goes with it, and a dead run's with the next run";
}

// QEMU is jailed before it runs a guest: a host id range's root (not host
// root), no_new_privs, and its seccomp sandbox; it ends with moat run.
TEST_F(MicroVmRun, QemuRunsAsAnUnprivilegedIdWithNoNewPrivsAndASandbox) {
  std::vector<std::string> argv = {binDir() + "/moat"};
  for (auto& a : runArgs({"/bin/tool", "echo"})) argv.push_back(a);
  argv.insert(argv.begin() + 2, "-i");
  RunningProcess run(argv, {{"MOAT_STATE", testStateDir()}, {"MOAT_VMS_DIR", vms()}});
  ASSERT_TRUE(run.write("ping\n"));
  ASSERT_EQ(run.readLine(kBootWaitMs), "ping\n") << "the guest answers";
  auto qemus = childrenNamed(run.pid(), "qemu-system");
  ASSERT_EQ(qemus.size(), 1u);
  pid_t qemu = qemus[0];
  std::istringstream uids(statusOf(qemu, "Uid"));
  for (int i = 0; i < 4; ++i) {
    long uid = -1;
    uids >> uid;
    EXPECT_GE(uid, 0x40000000L) << "real, effective, saved and fs uid: a host id range's";
  }
  EXPECT_EQ(statusOf(qemu, "NoNewPrivs"), "1");
  auto cgroups = os::readFile("/proc/" + std::to_string(qemu) + "/cgroup");
  ASSERT_TRUE(cgroups.ok());
  EXPECT_NE(cgroups->find("/moat-vm-run-"), std::string::npos) << "a cgroup of its own: " << cgroups.value();
  EXPECT_EQ(statusOf(qemu, "Seccomp"), "2") << "QEMU's -sandbox filter";
  EXPECT_EQ(statusOf(qemu, "CapEff"), "0000000000000000");
  // A session of its own (a terminal's Ctrl-C is for the command), and
  // network, IPC and pid namespaces of its own (pid 1 in its own).
  EXPECT_EQ(::getsid(qemu), qemu);
  EXPECT_EQ(statusOf(qemu, "NSpid"), std::to_string(qemu) + "\t1");
  for (const char* ns : {"net", "ipc", "pid"}) {
    char mine[128] = {}, its[128] = {};
    ASSERT_GT(::readlink((std::string("/proc/self/ns/") + ns).c_str(), mine, sizeof mine - 1), 0);
    ASSERT_GT(::readlink(("/proc/" + std::to_string(qemu) + "/ns/" + ns).c_str(), its, sizeof its - 1), 0);
    EXPECT_STRNE(mine, its) << ns;
  }
  run.closeInput();
  auto done = run.wait();
  EXPECT_EQ(done.exitCode, 0) << done.err;
  EXPECT_NE(::kill(qemu, 0), 0) << "QEMU ended with the run";
  EXPECT_EQ(entriesIn(vms()), 0u);
}

TEST_F(MicroVmRun, WhatAGuestCannotDoYetIsRefusedByName) {
  auto host = moatRun({"run", "--isolation", "microvm", "--", "/bin/true"});
  EXPECT_EQ(host.exitCode, 125);
  EXPECT_NE(host.err.find("needs a root file system"), std::string::npos) << host.err;
  auto volume = moatRun({"run", "--isolation", "microvm", "--template", tree_, "-v", "/tmp:/x", "--", "/bin/tool"});
  EXPECT_EQ(volume.exitCode, 125);
  EXPECT_NE(volume.err.find("-v: host paths cannot be shown inside a microVM"), std::string::npos) << volume.err;
  auto small = moatRun({"run", "--isolation", "microvm", "--template", tree_, "--memory", "64", "--", "/bin/tool"});
  EXPECT_EQ(small.exitCode, 125);
  EXPECT_NE(small.err.find("at least 128 MB"), std::string::npos) << small.err;
  // The tree imaged is the one opened, through no link (a link in the
  // path could be swapped to lead to the host's files while it is imaged).
  ASSERT_EQ(::symlink(tree_.c_str(), (dir_ + "/link").c_str()), 0);
  auto link = moatRun({"run", "--isolation", "microvm", "--template", dir_ + "/link", "--", "/bin/tool", "uname"});
  EXPECT_EQ(link.exitCode, 125);
  EXPECT_NE(link.err.find("is a symlink"), std::string::npos) << link.err;
  // A template someone other than root may write could be rewritten while
  // it is imaged as root: refused.
  ASSERT_EQ(::chmod(tree_.c_str(), 0775), 0);
  auto writable = moatRun(runArgs({"/bin/tool", "uname"}));
  EXPECT_EQ(writable.exitCode, 125);
  EXPECT_NE(writable.err.find("must be root's and writable by root alone"), std::string::npos) << writable.err;
  ASSERT_EQ(::chmod(tree_.c_str(), 0755), 0);
  auto bad = runMoat({"run", "--isolation", "vm", "--", "/bin/true"});
  EXPECT_EQ(bad.exitCode, 2);
  EXPECT_NE(bad.err.find("--isolation: 'vm' is not one of namespaces, microvm"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace moat::test
