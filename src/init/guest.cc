#include "init/guest.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "init/protocol.h"
#include "os/file.h"
#include "os/machine.h"
#include "os/mount.h"
#include "os/netlink.h"
#include "os/process.h"
#include "os/security.h"

namespace moat::init {
namespace {

constexpr auto kDeviceWait = std::chrono::seconds(10);

Status loadModules() {
  auto list = os::readFile(kGuestModuleList, 64 << 10);
  if (!list.ok()) return {};  // a kernel with the drivers built in
  std::istringstream lines(list.value());
  for (std::string path; std::getline(lines, path);) {
    if (!path.empty()) MOAT_TRY(os::loadKernelModule(path));
  }
  return {};
}

// Waits (bounded) for a path the kernel makes once a driver has probed.
Status awaitPath(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + kDeviceWait;
  while (::access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > deadline) return Error::fromErrno(path + " did not appear", ENODEV);
    ::usleep(1000);
  }
  return {};
}

// The device of class directory `classDir` (/sys/class/..., /sys/block)
// whose attribute file `attribute` says `value` (a driver's label or serial
// number), as /dev/<name>, once its driver has probed it; `what` names it
// in the error.
Result<std::string> findDevice(const char* classDir, const char* attribute, const std::string& value,
                               const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + kDeviceWait;
  for (;;) {
    if (DIR* d = ::opendir(classDir)) {
      std::string found;
      while (dirent* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name[0] == '.') continue;
        auto said = os::readFile(std::string(classDir) + "/" + name + "/" + attribute, 256);
        if (said.ok() && (said.value() == value || said.value() == value + "\n")) found = "/dev/" + name;
      }
      ::closedir(d);
      if (!found.empty() && ::access(found.c_str(), F_OK) == 0) return found;
    }
    if (std::chrono::steady_clock::now() > deadline) return Error::fromErrno("no " + what, ENODEV);
    ::usleep(1000);
  }
}

// The disk whose serial number is `serial` (/dev/vdX).
Result<std::string> findDisk(const std::string& serial) {
  return findDevice("/sys/block", "serial", serial, "disk with serial number " + serial);
}

// The template's image (erofs, read-only) under an overlay whose writable
// layer is the host's disk (an ext4 file system the host made, or a copy
// of a snapshot's: its upper and work directories may be there already)
// or, without one, a tmpfs holding at most `storageBytes`.
// Its overlay's writable layer and root image stay open (`layers`): a
// review of its changes walks them (FileOp kChanges), and once the root is
// switched no path of this process leads to them.
Status makeRoot(bool disk, const std::string& storageBytes, std::pair<UniqueFd, UniqueFd>& layers) {
  MOAT_ASSIGN(std::string root, findDisk(kGuestRootSerial));
  for (const char* dir : {"/moat/lower", "/moat/rw", "/moat/root"}) MOAT_TRY(os::makeDir(dir, 0755));
  MOAT_TRY(os::mount(root, "/moat/lower", "erofs", MS_RDONLY | MS_NODEV, ""));
  if (disk) {
    MOAT_ASSIGN(std::string layer, findDisk(kGuestDiskSerial));
    // A restored guest probed another disk before it was saved.
    MOAT_TRY(os::dropBlockDeviceCache(layer));
    // Its inode tables are left as mkfs made them (lazily): zeroing them in
    // the background would cost the guest's CPU and the host's memory
    // (QEMU's writes are charged to its cgroup) for nothing.
    MOAT_TRY(os::mount(layer, "/moat/rw", "ext4", MS_NODEV, "noinit_itable"));
  } else {
    MOAT_TRY(os::mount("tmpfs", "/moat/rw", "tmpfs", MS_NODEV, "mode=0755,size=" + storageBytes));
  }
  for (const char* dir : {"/moat/rw/upper", "/moat/rw/work"}) {
    if (::access(dir, F_OK) != 0) MOAT_TRY(os::makeDir(dir, 0755));
  }
  MOAT_TRY(os::mount("overlay", "/moat/root", "overlay", 0,
                     "lowerdir=/moat/lower,upperdir=/moat/rw/upper,workdir=/moat/rw/work"));
  MOAT_ASSIGN(layers.first, os::open("/moat/rw/upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  MOAT_ASSIGN(layers.second, os::open("/moat/lower", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  for (const char* dir : {"proc", "sys", "dev", "tmp", "workspace"}) {
    MOAT_TRY(os::makeDir(std::string("/moat/root/") + dir, 0755));
  }
  for (const char* dir : {"/proc", "/sys", "/dev"}) {
    MOAT_TRY(os::mount(dir, std::string("/moat/root") + dir, "", MS_MOVE, ""));
  }
  return os::switchRootFromInitramfs("/moat/root");
}

// Loopback, and the guest's NIC on QEMU's user-mode network with its
// address and default route (before the capabilities go: the guest's
// commands have no NET_ADMIN to change them). Set once at boot, so a saved
// guest carries it.
Status bringUpNetwork() {
  MOAT_ASSIGN(auto netlink, os::Netlink::open());
  MOAT_TRY(netlink.setLinkUp("lo"));
  MOAT_TRY(awaitPath(std::string("/sys/class/net/") + kGuestNic));
  MOAT_TRY(netlink.addAddress(kGuestNic, htonl(kGuestAddress), kGuestPrefixLen));
  MOAT_TRY(netlink.setLinkUp(kGuestNic));
  return netlink.addDefaultRoute(htonl(kGuestGateway), kGuestNic);
}

// The virtio-serial port named kGuestPortName: /dev/vportNpM.
Result<std::string> findPort() {
  return findDevice("/sys/class/virtio-ports", "name", kGuestPortName,
                    std::string("virtio-serial port named ") + kGuestPortName);
}

// A port reads EOF until the host side is connected (virtio_console): the
// connection is the host's once poll stops saying POLLHUP.
Status awaitHost(int fd) {
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    int n = ::poll(&p, 1, 100);
    if (n < 0 && errno != EINTR) return Error::fromErrno("poll the control port");
    if (n > 0 && !(p.revents & POLLHUP)) return {};
    if (n == 0 || (p.revents & POLLHUP)) ::usleep(1000);
  }
}

// The guest kernel's knobs are read-only to commands, which keep no
// SYS_ADMIN to remount them: a root command that could set
// /proc/sys/kernel/modprobe or core_pattern would have the kernel run its
// program with every capability, and could then undo the gate. /sys too
// (uevent_helper), and /proc/sysrq-trigger.
Status protectKernelKnobs() {
  for (const char* path : {"/proc/sys", "/proc/sysrq-trigger"}) {
    if (::access(path, F_OK) != 0) continue;  // a kernel without magic SysRq
    MOAT_TRY(os::bindMount(path, path));
    MOAT_TRY(os::remountBind(path, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC));
  }
  return os::mount("", "/sys", "", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
}

// Once its root is made, moat-init keeps what the host named (a namespace
// environment's init's, and SYS_BOOT): no command it starts can load a
// module, mount, or trace it; and no_new_privs, as in every environment
// (the exec gate's filter needs it).
Status keepCapabilities() {
  const char* named = std::getenv("MOAT_GUEST_CAPS");
  if (!named || !*named)
    return Error::make(Code::kInvalidArgument, "MOAT_GUEST_CAPS is not on the kernel's command line");
  const uint64_t mask = std::strtoull(named, nullptr, 10);
  std::vector<int> keep;
  for (int cap = 0; cap < 64; ++cap) {
    if (mask & (1ull << cap)) keep.push_back(cap);
  }
  MOAT_TRY(os::restrictCapabilities(keep));
  return os::setNoNewPrivs();
}

std::string fromCommandLine(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// A parked guest (MOAT_GUEST_PARK) says so and waits, as booted as it gets
// before anything of an environment's is made: the host saves it there,
// and each copy restored from it is told who it is and its limits.
Result<GuestResume> awaitResume(int control) {
  MOAT_TRY(writeFrame(control, MsgType::kParked, ""));
  FrameReader reader;
  MOAT_ASSIGN(Frame frame, readFrame(control, reader));
  if (frame.type != MsgType::kResume) {
    return Error::make(Code::kProtocol,
                       "a parked guest got message " + std::to_string(static_cast<int>(frame.type)) + ", not Resume");
  }
  if (reader.partial()) return Error::make(Code::kProtocol, "the host sent more than Resume before the Hello");
  MOAT_ASSIGN(GuestResume resume, GuestResume::decode(frame.payload));
  // A fresh identity: the saved image's randomness, clock and name are
  // every copy's until here.
  MOAT_TRY(os::addEntropy(resume.seed));
  MOAT_TRY(os::setRealtime(resume.realtimeNs));
  if (!resume.hostname.empty()) MOAT_TRY(os::setHostname(resume.hostname));
  return resume;
}

}  // namespace

Result<Guest> prepareGuest() {
  for (const char* dir : {"/proc", "/sys", "/dev"}) MOAT_TRY(os::makeDir(dir, 0755));
  MOAT_TRY(os::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, ""));
  MOAT_TRY(os::mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, ""));
  MOAT_TRY(os::mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755"));
  MOAT_TRY(loadModules());
  MOAT_TRY(bringUpNetwork());
  MOAT_ASSIGN(std::string port, findPort());
  MOAT_ASSIGN(UniqueFd fd, os::open(port, O_RDWR | O_CLOEXEC));
  MOAT_TRY(awaitHost(fd.get()));
  std::string storage = fromCommandLine("MOAT_GUEST_STORAGE"), pids = fromCommandLine("MOAT_GUEST_PIDS");
  if (fromCommandLine("MOAT_GUEST_PARK") == "1") {
    MOAT_ASSIGN(GuestResume resume, awaitResume(fd.get()));
    storage = resume.storageBytes > 0 ? std::to_string(resume.storageBytes) : "";
    pids = resume.pids > 0 ? std::to_string(resume.pids) : "";
  } else if (auto name = fromCommandLine("MOAT_GUEST_HOSTNAME"); !name.empty()) {
    MOAT_TRY(os::setHostname(name));
  }
  Guest guest;
  std::pair<UniqueFd, UniqueFd> layers;
  MOAT_TRY(makeRoot(fromCommandLine("MOAT_GUEST_DISK") == "1", storage.empty() ? "1g" : storage, layers));
  guest.upperLayer = std::move(layers.first);
  guest.lowerLayer = std::move(layers.second);
  // Terminals (a pty process, a shell) and POSIX shared memory, as in a
  // namespace environment.
  MOAT_TRY(os::makeDir("/dev/pts", 0755));
  MOAT_TRY(os::mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"));
  MOAT_TRY(os::makeDir("/dev/shm", 01777));
  MOAT_TRY(os::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"));
  MOAT_ASSIGN(guest.commands, GuestCommands::make(pids));
  MOAT_TRY(protectKernelKnobs());
  // What a restored copy needs of SYS_ADMIN (its name, a reseed) stays
  // with a child of its own.
  MOAT_ASSIGN(guest.identity, IdentityKeeper::start());
  MOAT_TRY(keepCapabilities());
  guest.control = std::move(fd);
  return guest;
}

}  // namespace moat::init
