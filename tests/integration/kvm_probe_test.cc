// Which accelerator microVMs get (docs/MICROVM.md, "KVM or TCG"): KVM only
// where a probe boot under it ends as it should, TCG with the reason
// otherwise, the answer kept for the host's boot. QEMU is a stand-in here
// (this host's /dev/kvm, where it has one, boots nothing): a script that
// ends at once, fails, or never ends.
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

TEST_F(KvmProbe, TheOperatorsWordIsTakenAndNoDeviceMeansTcg) {
  qemuIs("exit 0");
  EXPECT_TRUE(chooseAccel("kvm", kernel_, probe_).kvm);
  EXPECT_FALSE(chooseAccel("tcg", kernel_, probe_).kvm);
  probe_.device = dir_ + "/none";
  auto none = chooseAccel("auto", kernel_, probe_);
  EXPECT_FALSE(none.kvm);
  EXPECT_NE(none.why.find(dir_ + "/none cannot be opened"), std::string::npos) << none.why;
}

TEST_F(KvmProbe, KvmOnlyWhereTheProbeBootEndsAsItShould) {
  qemuIs("exit 0");
  auto booted = chooseAccel("auto", kernel_, probe_);
  EXPECT_TRUE(booted.kvm) << booted.why;
  EXPECT_NE(booted.why.find("ended as it should"), std::string::npos) << booted.why;

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
  qemuIs("exit 0");
  EXPECT_TRUE(chooseAccel("auto", kernel_, probe_).kvm);
  auto kept = os::readFile(probe_.keptIn);
  ASSERT_TRUE(kept.ok());
  EXPECT_NE(kept->find("\nkvm\n"), std::string::npos) << *kept;
  // QEMU would now fail: the kept answer holds, and says it is an earlier one.
  qemuIs("exit 1");
  auto again = chooseAccel("auto", kernel_, probe_);
  EXPECT_TRUE(again.kvm);
  EXPECT_NE(again.why.find("at an earlier start"), std::string::npos) << again.why;
  // Another kernel: booted again.
  ASSERT_TRUE(os::writeFile(dir_ + "/vmlinuz-2", "not a kernel either", 0644).ok());
  GuestKernel other = kernel_;
  other.image = dir_ + "/vmlinuz-2";
  EXPECT_FALSE(chooseAccel("auto", other, probe_).kvm);
  // A device made again (its module loaded again): booted again.
  ASSERT_EQ(::unlink(probe_.device.c_str()), 0);
  ASSERT_TRUE(os::writeFile(dir_ + "/spare", "", 0644).ok());  // keeps the old inode number from coming back
  ASSERT_TRUE(os::writeFile(probe_.device, "", 0644).ok());
  EXPECT_FALSE(chooseAccel("auto", kernel_, probe_).kvm);
  // Whatever is kept, nothing but its own lines: a half-written file is no answer.
  ASSERT_TRUE(os::writeFile(probe_.keptIn, "garbage", 0644).ok());
  EXPECT_FALSE(chooseAccel("auto", kernel_, probe_).kvm);
}

}  // namespace
}  // namespace moat::test
