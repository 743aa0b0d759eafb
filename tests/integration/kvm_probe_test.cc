// Which accelerator microVMs get (docs/MICROVM.md, "KVM or TCG"): KVM only
// where a probe boot under it ends as it should, TCG with the reason
// otherwise, the answer kept for the host's boot. QEMU is a stand-in here
// (this host's /dev/kvm, where it has one, boots nothing): a script that
// prints the kernel's panic and ends, ends without it (a reset), fails, or
// never ends.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "backend/microvm/accel.h"
#include "os/file.h"

namespace moat::test {
namespace {

using backend::microvm::AccelProbe;
using backend::microvm::chooseAccel;
using backend::microvm::GuestKernel;

class KvmProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-kvm-probe-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_TRUE(os::makeDirs(dir_ + "/bin", 0755).ok());
    ASSERT_TRUE(os::writeFile(dir_ + "/vmlinuz", "not a kernel", 0644).ok());
    ASSERT_TRUE(os::writeFile(dir_ + "/kvm", "", 0644).ok());  // the device, as far as this side looks
    kernel_.image = dir_ + "/vmlinuz";
    probe_.device = dir_ + "/kvm";
    probe_.keptIn = "";
    probe_.wait = std::chrono::seconds(5);
  }
  void TearDown() override {
    ::unsetenv("MOAT_QEMU");
    (void)os::removeTree(dir_);
  }
  // QEMU is this script from now on (written anew: a new inode, same path).
  void qemuIs(const std::string& body) {
    const std::string path = dir_ + "/bin/qemu";
    (void)::unlink(path.c_str());
    ASSERT_TRUE(os::writeFile(path, "#!/bin/sh\n" + body + "\n", 0755).ok());
    ::setenv("MOAT_QEMU", path.c_str(), 1);
  }
  std::string dir_;
  GuestKernel kernel_;
  AccelProbe probe_;
};

// What a kernel that found no root prints on the console QEMU gives it.
const char kBooted[] = "echo 'Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)'; exit 0";

TEST_F(KvmProbe, TheOperatorsWordIsTakenAndNoDeviceMeansTcg) {
  qemuIs(kBooted);
  EXPECT_TRUE(chooseAccel("kvm", kernel_, probe_).kvm);
  EXPECT_FALSE(chooseAccel("tcg", kernel_, probe_).kvm);
  probe_.device = dir_ + "/none";
  auto none = chooseAccel("auto", kernel_, probe_);
  EXPECT_FALSE(none.kvm);
  EXPECT_NE(none.why.find(dir_ + "/none cannot be opened (No such file or directory)"), std::string::npos) << none.why;
}

TEST_F(KvmProbe, KvmOnlyWhereTheProbeBootEndsAsItShould) {
  qemuIs(kBooted);
  auto booted = chooseAccel("auto", kernel_, probe_);
  EXPECT_TRUE(booted.kvm) << booted.why;
  EXPECT_NE(booted.why.find("ended as it should"), std::string::npos) << booted.why;

  // Ended, but no kernel said anything: a reset (a triple fault ends QEMU
  // the same way under -no-reboot) is no boot.
  qemuIs("exit 0");
  auto reset = chooseAccel("auto", kernel_, probe_);
  EXPECT_FALSE(reset.kvm);
  EXPECT_NE(reset.why.find("without the guest kernel's panic"), std::string::npos) << reset.why;

  // What it is asked to boot (said on stderr: it may write no file): the
  // kernel under KVM, with nothing to run. QEMU's words are the reason.
  qemuIs("echo \"$@\" >&2; echo 'Could not access KVM kernel module: Permission denied' >&2; exit 1");
  auto failed = chooseAccel("auto", kernel_, probe_);
  EXPECT_FALSE(failed.kvm);
  EXPECT_NE(failed.why.find("Could not access KVM kernel module"), std::string::npos) << failed.why;
  EXPECT_NE(failed.why.find("-accel kvm"), std::string::npos) << failed.why;
  EXPECT_NE(failed.why.find("-kernel " + kernel_.image), std::string::npos) << failed.why;
  EXPECT_NE(failed.why.find("-no-reboot"), std::string::npos) << failed.why;

  // A guest that never gets anywhere (a nested /dev/kvm that runs nothing).
  qemuIs("exec sleep 60");
  probe_.wait = std::chrono::milliseconds(300);
  auto stalled = chooseAccel("auto", kernel_, probe_);
  EXPECT_FALSE(stalled.kvm);
  EXPECT_NE(stalled.why.find("failed"), std::string::npos) << stalled.why;
}

TEST_F(KvmProbe, TheAnswerIsKeptForTheSameDeviceQemuAndKernel) {
  probe_.keptIn = dir_ + "/kept";
  qemuIs(kBooted);
  // A kept answer says it is one; a probe does not.
  auto kept = [&](const GuestKernel& kernel) {
    auto choice = chooseAccel("auto", kernel, probe_);
    EXPECT_TRUE(choice.kvm) << choice.why;
    return choice.why.find("at an earlier start") != std::string::npos;
  };
  EXPECT_FALSE(kept(kernel_));
  auto file = os::readFile(probe_.keptIn);
  ASSERT_TRUE(file.ok());
  EXPECT_NE(file->find("\nkvm\n"), std::string::npos) << *file;
  EXPECT_TRUE(kept(kernel_)) << "the same device, QEMU and kernel";
  // Half of it (a writer that stopped): no answer.
  const std::string whole = file.value();
  ASSERT_TRUE(os::writeFile(probe_.keptIn, whole.substr(0, whole.find("\nkvm\n") + 5), 0644).ok());
  EXPECT_FALSE(kept(kernel_)) << "half a file was taken for an answer";
  // Another kernel.
  ASSERT_TRUE(os::writeFile(dir_ + "/vmlinuz-2", "not a kernel either", 0644).ok());
  GuestKernel other = kernel_;
  other.image = dir_ + "/vmlinuz-2";
  EXPECT_FALSE(kept(other)) << "another kernel";
  EXPECT_TRUE(kept(other));
  // QEMU replaced (an upgrade: a new file at the same path).
  qemuIs(kBooted);
  EXPECT_FALSE(kept(other)) << "another QEMU";
  // The device made again (its module loaded again).
  ASSERT_EQ(::unlink(probe_.device.c_str()), 0);
  ASSERT_TRUE(os::writeFile(dir_ + "/spare", "", 0644).ok());  // keeps the old inode number from coming back
  ASSERT_TRUE(os::writeFile(probe_.device, "", 0644).ok());
  EXPECT_FALSE(kept(other)) << "another device";
}

}  // namespace
}  // namespace moat::test
