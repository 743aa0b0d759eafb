// The microVM backend's pure parts: the initramfs archive, the guest's
// module order, QEMU's command line.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/microvm/backend.h"
#include "backend/microvm/guest_kernel.h"
#include "backend/microvm/initramfs.h"
#include "backend/microvm/vm.h"

namespace moat::backend::microvm {
namespace {

struct Read {
  std::string name;
  unsigned mode = 0, size = 0, rdevMajor = 0, rdevMinor = 0;
  std::string data;
};

unsigned field(const std::string& a, size_t at, int i) {
  return static_cast<unsigned>(std::stoul(a.substr(at + 6 + 8 * i, 8), nullptr, 16));
}

// What the kernel's reader would take from the archive.
std::vector<Read> parse(const std::string& a) {
  std::vector<Read> out;
  size_t at = 0;
  while (at + 110 <= a.size()) {
    EXPECT_EQ(a.substr(at, 6), "070701");
    Read r;
    r.mode = field(a, at, 1);
    r.size = field(a, at, 6);
    r.rdevMajor = field(a, at, 9);
    r.rdevMinor = field(a, at, 10);
    unsigned nameSize = field(a, at, 11);
    r.name = a.substr(at + 110, nameSize - 1);
    EXPECT_EQ(a[at + 110 + nameSize - 1], '\0');
    at = (at + 110 + nameSize + 3) & ~size_t{3};
    r.data = a.substr(at, r.size);
    at = (at + r.size + 3) & ~size_t{3};
    out.push_back(r);
    if (r.name == "TRAILER!!!") break;
  }
  EXPECT_EQ(at, a.size()) << "nothing after the trailer";
  return out;
}

// A checkpoint or memory fork that would not fit is refused before the
// guest is stopped, saying what it needs and what is free.
TEST(SavedState, ItMustFitWithRoomToSpare) {
  constexpr uint64_t kMiB = 1ull << 20;
  EXPECT_TRUE(roomForState("x", 1024 * kMiB, 512 * kMiB).ok());
  EXPECT_TRUE(roomForState("x", 512 * kMiB + kStateHeadroomBytes, 512 * kMiB).ok());
  auto refused = roomForState("the checkpoint of microVM environment e1", 600 * kMiB, 512 * kMiB);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Code::kCapacity);
  EXPECT_NE(refused.error().message().find("up to 512 MiB"), std::string::npos) << refused.error().message();
  EXPECT_NE(refused.error().message().find("600 MiB free"), std::string::npos) << refused.error().message();
  EXPECT_NE(refused.error().message().find("environment e1"), std::string::npos) << refused.error().message();
}

TEST(Initramfs, EntriesAreNewcRecordsAlignedToFourBytesWithATrailer) {
  std::string archive = newcArchive({{"dev", S_IFDIR | 0755, "", 0, 0},
                                     {"dev/console", S_IFCHR | 0600, "", 5, 1},
                                     {"init", S_IFREG | 0755, "#!odd-length", 0, 0}});
  EXPECT_EQ(archive.size() % 4, 0u);
  auto read = parse(archive);
  ASSERT_EQ(read.size(), 4u);
  EXPECT_EQ(read[0].name, "dev");
  EXPECT_TRUE(S_ISDIR(read[0].mode));
  EXPECT_EQ(read[1].name, "dev/console");
  EXPECT_TRUE(S_ISCHR(read[1].mode));
  EXPECT_EQ(read[1].rdevMajor, 5u);
  EXPECT_EQ(read[1].rdevMinor, 1u);
  EXPECT_EQ(read[2].name, "init");
  EXPECT_EQ(read[2].mode, static_cast<unsigned>(S_IFREG | 0755));
  EXPECT_EQ(read[2].data, "#!odd-length");
  EXPECT_EQ(read[3].name, "TRAILER!!!");
}

TEST(Initramfs, OnlyRegularFilesCarryData) {
  auto read = parse(newcArchive({{"d", S_IFDIR | 0755, "ignored", 0, 0}}));
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].size, 0u);
}

const char* kModulesDep =
    "kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n"
    "kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n"
    "kernel/drivers/virtio/virtio_ring.ko:\n"
    "kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n"
    "kernel/fs/erofs/erofs.ko: kernel/lib/libcrc32c.ko\n"
    "kernel/lib/libcrc32c.ko:\n"
    "kernel/fs/overlayfs/overlay.ko:\n"
    "kernel/drivers/net/some-thing.ko:\n";

TEST(GuestModules, EachComesAfterWhatItNeedsAndOnlyOnce) {
  auto order = moduleLoadOrder(kModulesDep, {"virtio_mmio", "virtio_console", "erofs", "overlay", "built_in"});
  ASSERT_TRUE(order.ok()) << order.error().message();
  const std::vector<std::string> want = {"kernel/drivers/virtio/virtio_ring.ko",
                                         "kernel/drivers/virtio/virtio.ko",
                                         "kernel/drivers/virtio/virtio_mmio.ko",
                                         "kernel/drivers/char/virtio_console.ko",
                                         "kernel/lib/libcrc32c.ko",
                                         "kernel/fs/erofs/erofs.ko",
                                         "kernel/fs/overlayfs/overlay.ko"};
  EXPECT_EQ(order.value(), want) << "a module modules.dep does not list is built in: nothing to load";
}

TEST(GuestModules, NamesTakeUnderscoresForDashesAndALineWithoutColonIsAnError) {
  auto order = moduleLoadOrder(kModulesDep, {"some_thing"});
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(order.value(), std::vector<std::string>{"kernel/drivers/net/some-thing.ko"});
  auto bad = moduleLoadOrder("kernel/x.ko kernel/y.ko\n", {"x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("modules.dep"), std::string::npos);
}

bool has(const std::vector<std::string>& argv, const std::string& want) {
  return std::find(argv.begin(), argv.end(), want) != argv.end();
}

TEST(QemuArgv, TcgIsToldTheTscAndKvmIsNotAndTheRootIsReadOnlyAndThePidsBoundGoesToTheGuest) {
  VmSpec spec;
  spec.kernel.image = "/boot/vmlinuz-x";
  spec.rootImage = "/v/root.img";
  spec.cpus = 2;
  spec.memoryMb = 512;
  spec.storageBytes = 1 << 20;
  auto tcg = qemuArgv("/usr/bin/qemu", spec);
  EXPECT_TRUE(has(tcg, "tcg,tb-size=128")) << "TCG's translation cache is bounded (QEMU's default: 1 GiB)";
  EXPECT_TRUE(has(tcg, "512"));
  EXPECT_TRUE(has(tcg, "-no-reboot")) << "a guest whose init ends ends QEMU";
  // Its files are descriptors moat opened: it opens no path of moat's.
  EXPECT_TRUE(has(tcg, "id=root,file=/proc/self/fd/4,format=raw,if=none,readonly=on,file.locking=off"));
  EXPECT_TRUE(has(tcg, "/proc/self/fd/5")) << "the initramfs";
  EXPECT_TRUE(has(tcg, "socket,id=control,fd=3")) << "a connected socket, no listening one";
  EXPECT_TRUE(has(tcg, "null,id=console,logfile=/proc/self/fd/2,logappend=on"))
      << "moat made it; QEMU appends, and drops what no longer fits";
  EXPECT_FALSE(has(tcg, "/v/root.img"));
  auto cmdline = std::find(tcg.begin(), tcg.end(), "-append");
  ASSERT_NE(cmdline, tcg.end());
  EXPECT_NE(cmdline[1].find("tsc_early_khz="), std::string::npos) << cmdline[1];
  EXPECT_NE(cmdline[1].find("MOAT_GUEST_STORAGE=1048576"), std::string::npos) << cmdline[1];
  EXPECT_EQ(cmdline[1].find("MOAT_GUEST_PIDS"), std::string::npos) << "0: unbounded";
  EXPECT_NE(cmdline[1].find(" -- --guest"), std::string::npos) << cmdline[1];
  // moat-init keeps CHOWN and SYS_BOOT, never SYS_ADMIN or SYS_MODULE.
  auto caps = cmdline[1].find("MOAT_GUEST_CAPS=");
  ASSERT_NE(caps, std::string::npos) << cmdline[1];
  const uint64_t mask = std::stoull(cmdline[1].substr(caps + 16));
  EXPECT_NE(mask & (1ull << 0), 0u);
  EXPECT_NE(mask & (1ull << 22), 0u);
  EXPECT_EQ(mask & (1ull << 21), 0u);
  EXPECT_EQ(mask & (1ull << 16), 0u);
  spec.kvm = true;
  spec.pids = 64;
  auto kvm = qemuArgv("/usr/bin/qemu", spec);
  EXPECT_TRUE(has(kvm, "kvm"));
  cmdline = std::find(kvm.begin(), kvm.end(), "-append");
  EXPECT_EQ(cmdline[1].find("tsc_early_khz"), std::string::npos) << cmdline[1];
  EXPECT_NE(cmdline[1].find("MOAT_GUEST_PIDS=64"), std::string::npos) << cmdline[1];
  EXPECT_FALSE(has(kvm, "-incoming"));
  EXPECT_FALSE(has(kvm, "-mon"));
}

// Every guest has one NIC, on QEMU's user-mode network with the addresses
// moat-init gives it, IPv4 only, no host port forwarded (docs/MICROVM.md,
// "Network").
TEST(QemuArgv, EveryGuestHasOneNicOnQemusUserModeNetworkWithoutIpv6OrForwards) {
  VmSpec spec;
  spec.kernel.image = "/boot/vmlinuz-x";
  for (bool park : {false, true}) {
    spec.park = park;
    auto argv = qemuArgv("/usr/bin/qemu", spec);
    EXPECT_EQ(std::count(argv.begin(), argv.end(), "-netdev"), 1);
    EXPECT_TRUE(has(argv, "user,id=net,ipv6=off,net=10.0.2.0/24,host=10.0.2.2,dhcpstart=10.0.2.15"));
    EXPECT_TRUE(has(argv, "virtio-net-device,netdev=net"));
    for (const auto& a : argv) EXPECT_EQ(a.find("hostfwd"), std::string::npos) << a;
  }
}

// A lasting QEMU (moatd's) accepts its guest protocol and monitor
// connections on listening descriptors, so that a later moatd connects
// again; one that is not (moat run's, a guest being saved) gets connected
// sockets.
TEST(QemuArgv, ALastingGuestAcceptsItsConnectionsAndAPassingOneIsConnected) {
  VmSpec spec;
  spec.kernel.image = "/boot/vmlinuz-x";
  spec.monitor = true;
  auto passing = qemuArgv("/usr/bin/qemu", spec);
  EXPECT_TRUE(has(passing, "socket,id=control,fd=3"));
  EXPECT_TRUE(has(passing, "socket,id=monitor,fd=6"));
  spec.lasting = true;
  auto lasting = qemuArgv("/usr/bin/qemu", spec);
  EXPECT_TRUE(has(lasting, "socket,id=control,fd=3,server=on,wait=off"));
  EXPECT_TRUE(has(lasting, "socket,id=monitor,fd=6,server=on,wait=off"));
}

// A guest to be saved parks (its environment's limits come with Resume,
// not on the command line) and has a monitor on descriptor 6; a restore
// reads the saved state from descriptor 7.
TEST(QemuArgv, AParkedGuestHasAMonitorAndARestoreReadsItsStateFromADescriptor) {
  VmSpec spec;
  spec.kernel.image = "/boot/vmlinuz-x";
  spec.storageBytes = 1 << 20;
  spec.pids = 64;
  spec.hostname = "env1";
  auto cold = qemuArgv("/usr/bin/qemu", spec);
  auto cmdline = std::find(cold.begin(), cold.end(), "-append");
  ASSERT_NE(cmdline, cold.end());
  EXPECT_NE(cmdline[1].find("MOAT_GUEST_HOSTNAME=env1"), std::string::npos) << cmdline[1];
  EXPECT_EQ(cmdline[1].find("MOAT_GUEST_PARK"), std::string::npos) << cmdline[1];
  spec.park = true;
  spec.monitor = true;
  auto parked = qemuArgv("/usr/bin/qemu", spec);
  cmdline = std::find(parked.begin(), parked.end(), "-append");
  ASSERT_NE(cmdline, parked.end());
  EXPECT_NE(cmdline[1].find("MOAT_GUEST_PARK=1"), std::string::npos) << cmdline[1];
  for (const char* own : {"MOAT_GUEST_STORAGE", "MOAT_GUEST_PIDS", "MOAT_GUEST_HOSTNAME"}) {
    EXPECT_EQ(cmdline[1].find(own), std::string::npos) << own << " comes with Resume: " << cmdline[1];
  }
  EXPECT_TRUE(has(parked, "socket,id=monitor,fd=6"));
  EXPECT_TRUE(has(parked, "chardev=monitor,mode=control"));
  EXPECT_FALSE(has(parked, "-incoming"));
  spec.monitor = false;
  spec.incomingState = 9;
  auto restored = qemuArgv("/usr/bin/qemu", spec);
  auto incoming = std::find(restored.begin(), restored.end(), "-incoming");
  ASSERT_NE(incoming, restored.end());
  EXPECT_EQ(incoming[1], "fd:7") << "always descriptor 7, whatever moat's was";
  EXPECT_FALSE(has(restored, "-mon"));
}

}  // namespace
}  // namespace moat::backend::microvm
