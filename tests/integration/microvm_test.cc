// The microVM guest (issue 29's first part): moat-init boots as the pid 1
// of a QEMU microvm from the guest kernel, makes its root from a template's
// erofs image, and serves the guest protocol over virtio-serial, as it does
// in every namespace environment. TCG here (this host's /dev/kvm cannot
// boot a stock kernel): a boot takes seconds.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "backend/microvm/vm.h"
#include "init/protocol.h"
#include "moat_process.h"
#include "os/file.h"
#include "os/process.h"

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
    auto built = backend::microvm::buildRootImage(root, spec_.rootImage);
    ASSERT_TRUE(built.ok()) << built.error().message();
  }

  // The next frame, waiting at most kBootWaitMs.
  Result<init::Frame> next(Vm& vm) {
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

}  // namespace
}  // namespace moat::test
