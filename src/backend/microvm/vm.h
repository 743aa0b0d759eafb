#pragma once

#include <linux/landlock.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/microvm/guest_kernel.h"
#include "backend/microvm/qmp.h"
#include "common/result.h"
#include "common/unique_fd.h"
#include "isolation/cgroup/cgroup.h"
#include "isolation/fs/template.h"

// One microVM: QEMU's `microvm` machine booting the guest kernel with an
// initramfs whose /init is moat-init (`--guest`), the template's root file
// system as an erofs image on its first disk, and the guest protocol on a
// virtio-serial port that QEMU connects to a unix socket of the host.
namespace moat::backend::microvm {

struct VmSpec {
  GuestKernel kernel;
  std::string initBinary;  // moat-init (static): the guest's /init
  // The guest's initramfs (guestInitramfs's, written once and shared);
  // empty: made from initBinary into workDir.
  std::string initramfs;
  std::string rootImage;  // buildRootImage's (read only; may be shared)
  std::string workDir;    // private, the VM's own: its console log (and initramfs)
  unsigned cpus = 1;
  uint64_t memoryMb = 256;
  uint64_t storageBytes = 1ull << 30;  // the writable layer without a `disk` (a tmpfs in the guest's memory)
  // The writable layer's disk: a raw file holding an ext4 file system
  // (writeLayerDisk's, or a copy of one), the guest's to write; empty: a
  // tmpfs. `scratchDisk`: a disk of kScratchDiskBytes that reads zeros and
  // keeps nothing, in its place (a guest being saved: it parks before its
  // root is made, so the copies restored from it get their own disks).
  std::string disk;
  bool scratchDisk = false;
  // Where QEMU's console log is made (O_EXCL); empty: workDir/console.log.
  std::string consoleLog;
  // What the console log may grow to (the guest's writes past it are
  // dropped): 1 MiB, or `disk`'s size where that is larger (vm.cc).
  uint64_t consoleBytes = 1 << 20;
  uint64_t pids = 0;  // the guest's commands' tasks (a cgroup in the guest); 0: unbounded
  bool kvm = false;   // false: TCG (emulated)
  // QEMU's own ids (a host range's root, never 0 in use): it runs as them,
  // with no_new_privs and its own seccomp sandbox. It opens no path of
  // moat's: its files are descriptors moat opened (kQemuControlFd...).
  // 0: the caller's (tests that are not root).
  uid_t uid = 0;
  gid_t gid = 0;
  // The cgroup QEMU runs in: the files it writes "0" to (its procs files)
  // before it drops root. Empty: the caller's.
  std::vector<std::string> cgroupJoin;
  // The guest's host name (a cold boot's; a parked guest is told hers).
  std::string hostname;
  // A guest to be saved: moat-init parks before it makes its root
  // (MOAT_GUEST_PARK; storageBytes and pids then come with init::kResume),
  // and QEMU has a QMP monitor (Vm::save; Vm::forwardPort needs it too).
  // The same spec with `incomingState` restores it.
  bool park = false;
  bool monitor = false;
  int incomingState = -1;  // a saved guest's state (read), restored instead of a boot
  // QEMU outlives its starter (moatd's guests: a restart re-attaches,
  // Vm::adopt): no parent-death signal, and the guest protocol and the
  // monitor are unix sockets listening in workDir (control.sock,
  // monitor.sock; QEMU accepts on descriptors, one client at a time) rather
  // than socketpairs. `holdFd` (the id range's lease) is kept open by QEMU
  // as its descriptor 8, so the range stays leased while it runs.
  bool lasting = false;
  int holdFd = -1;
};

// What TCG may keep of translated code (QEMU's default is 1 GiB): part of
// what QEMU uses beside the guest's RAM.
inline constexpr unsigned kTcgCacheMb = 128;

// The descriptors QEMU is started with, named on its command line as
// /proc/self/fd/N (so it needs no search right on any directory of moat's):
// the guest protocol connection (a connected socket), the root image (read
// only) and the initramfs. Its stderr (2) is the console log.
inline constexpr int kQemuControlFd = 3;
inline constexpr int kQemuRootFd = 4;
inline constexpr int kQemuInitramfsFd = 5;
inline constexpr int kQemuMonitorFd = 6;   // VmSpec::monitor: QMP
inline constexpr int kQemuIncomingFd = 7;  // VmSpec::incomingState
inline constexpr int kQemuHeldFd = 8;      // VmSpec::holdFd
inline constexpr int kQemuDiskFd = 9;      // VmSpec::disk (read and write)
// What a saved guest's kernel takes its writable disk's size to be (it
// probed the scratch disk): no copy's disk may be larger. Reads past a
// copy's own disk fail; its file system is its disk's size.
inline constexpr uint64_t kScratchDiskBytes = kMicroVmMaxStorageGb << 30;
// A lasting QEMU's listening sockets, in its workDir.
inline constexpr const char* kControlSocket = "control.sock";
inline constexpr const char* kMonitorSocket = "monitor.sock";

// How many of a guest's ports QEMU forwards at most (Vm::forwardPort), and
// where in QEMU's network namespace (127.0.0.2; host byte order).
inline constexpr size_t kMaxForwardedPorts = 64;
inline constexpr uint32_t kForwardAddress = 0x7f000002;

// A boot takes seconds on TCG; a guest that has not said Hello by then
// will not. And how long a write to a guest may wait (its moat-init is the
// guest's to stop reading).
inline constexpr std::chrono::seconds kGuestBootWait{120};
inline constexpr std::chrono::seconds kGuestSendWait{30};
// How long a running guest may take to answer a re-attach, and how much
// of what it wrote for the host before may come first.
inline constexpr std::chrono::seconds kGuestReattachWait{30};
inline constexpr size_t kReattachSkipBytes = 4u << 20;
// How long saving a parked guest may take (its RAM written to a file).
inline constexpr std::chrono::seconds kGuestSaveWait{60};

// `name` (moat's env override `envName`, else the first of /usr/bin,
// /usr/sbin, /bin, /sbin that has it), or an error naming the Debian
// package to install.
Result<std::string> findProgram(const char* envName, const char* name, const char* package);

// The template `templateName` as a microVM's root can be made of: a tree of
// its own (not the host's), root's and writable by root alone (its image is
// made as root from its paths). `top`: its top directory's stat.
Result<isolation::fs::Template> imageableTemplate(const std::string& templateName, const std::string& stateDir,
                                                  struct stat& top);

// The root file system of the template directory `treeFd` (O_PATH will
// do: reached through it, not by a path that could be swapped for a link)
// as an erofs image at `image` (mkfs.erofs, erofs-utils).
Status buildRootImage(int treeFd, const std::string& image);

// A new writable layer's disk at `path` (made O_EXCL, mode 0600, owned by
// uid:gid, QEMU's): a sparse raw file of `bytes` holding an empty ext4 file
// system (mkfs.ext4, e2fsprogs), which the guest mounts under its overlay.
Status writeLayerDisk(const std::string& path, uint64_t bytes, uid_t uid, gid_t gid);

// The guest's initramfs: moat-init as /init, /dev/console, the modules
// guestModules() takes from the kernel's modules directory and their list.
Result<std::string> guestInitramfs(const GuestKernel& kernel, const std::string& initBinary);

// The host's files QEMU may reach by their paths: /usr and `qemu`'s own
// tree (read and run), the guest kernel, a few files describing the host
// (read), /dev/kvm with `spec.kvm`; each opened (O_PATH). With `ownRoot`
// (QEMU in a root of its own, which has its own proc) no file of the
// host's proc.
// Landlock's rights on /dev/kvm: read, write and ioctl
// (LANDLOCK_ACCESS_FS_IOCTL_DEV, bit 15: ABI 5).
inline constexpr uint64_t kQemuKvmAccess = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE | (1ULL << 15);
struct QemuPath {
  std::string path;
  UniqueFd fd;
  uint64_t access;  // LANDLOCK_ACCESS_FS_*
};
Result<std::vector<QemuPath>> qemuPaths(const VmSpec& spec, const std::string& qemu, bool ownRoot);

// The Landlock ruleset QEMU runs under: `paths`, the files of `given`
// (read), `console` (write) and `disk` (read and write; -1: none).
// Nothing else.
Result<UniqueFd> qemuRuleset(const std::vector<QemuPath>& paths, const std::vector<int>& given, int console,
                             int disk = -1);

// The cgroup limits of a QEMU running a guest of `cpus` CPU time and
// `memoryMb` of RAM: that CPU time, the RAM plus QEMU's own memory (and
// TCG's cache when not on KVM), a few threads per vCPU.
isolation::cgroup::Limits qemuLimits(double cpus, uint64_t memoryMb, bool kvm);

// guestInitramfs's archive written to `path`, readable by every QEMU.
Status writeGuestInitramfs(const GuestKernel& kernel, const std::string& initBinary, const std::string& path);

// Reads the stream socket `fd` up to and including the first `mark`, never
// a byte past it (what follows is the caller's), within `wait`; at most
// `maxSkip` bytes before it ("protocol" beyond). How a re-attach skips what
// a guest wrote for the host before.
Status readThrough(int fd, const std::string& mark, std::chrono::milliseconds wait, size_t maxSkip);

// QEMU's command line for `spec`, its files the descriptors above.
std::vector<std::string> qemuArgv(const std::string& qemu, const VmSpec& spec);

// The TSC frequency a TCG guest is told (it cannot measure it: the microvm
// machine has no PIT to calibrate against by default): the host's, which
// TCG's TSC counts at.
uint64_t hostTscKhz();

class Vm {
 public:
  // Starts QEMU (it dies when the calling thread ends: call it from a
  // thread that lasts as long as the VM should) and hands back the host's
  // end of the guest protocol connection; the guest's Hello comes once it
  // has booted (awaitGuest).
  static Result<Vm> start(const VmSpec& spec);
  // A lasting QEMU (VmSpec::lasting) that an earlier moatd started, running
  // (its console log at `consoleLog`, empty: workDir/console.log),
  // as `pid`, with its files in `workDir`: its console and monitor opened
  // again. Its guest protocol connection comes from reattach().
  static Result<Vm> adopt(const std::string& workDir, const std::string& consoleLog, pid_t pid);
  Vm(Vm&& other) noexcept
      : pid_(std::exchange(other.pid_, -1)),
        adopted_(other.adopted_),
        workDir_(std::move(other.workDir_)),
        pidfd_(std::move(other.pidfd_)),
        control_(std::move(other.control_)),
        console_(std::move(other.console_)),
        monitor_(std::move(other.monitor_)) {}
  Vm& operator=(Vm&&) = delete;
  ~Vm();  // kills QEMU and waits for it

  int control() const { return control_.get(); }
  UniqueFd takeControl() { return std::move(control_); }
  int pidfd() const { return pidfd_.get(); }
  pid_t pid() const { return pid_; }
  // Ends QEMU now (the destructor reaps it).
  void kill() const;
  // Leaves a lasting QEMU running for the next moatd: this object lets go
  // of it without ending it.
  void leaveRunning() { pid_ = -1; }
  // A lasting guest's guest protocol connection, made again (the last
  // host's is gone): connects to control.sock, sends kReattach with a
  // fresh nonce and skips what comes before its kReattached (what the guest
  // wrote for the last host), so that the guest's Hello is what is read
  // next. Waits at most `wait`.
  Result<UniqueFd> reattach(std::chrono::milliseconds wait) const;
  // The same on this Vm's own connection (control()): a guest restored from
  // its checkpoint goes on from where it was saved, mid-conversation with
  // the host that saved it.
  Status resync(std::chrono::milliseconds wait) const;
  // The end of what the guest's console printed (the kernel's and
  // moat-init's own messages; printable characters only): why a guest that
  // ended did.
  std::string consoleTail() const;
  // Waits until the guest has booted and moat-init's first frame (its
  // Hello) is there to read, left unread; or fails, saying why and with the
  // end of the console: QEMU ended, the connection closed, or `wait` went
  // by (a guest whose kernel hangs says nothing: the bound is the host's).
  Status awaitGuest(std::chrono::milliseconds wait) const;
  // A guest started with VmSpec::monitor, saved into `stateFd` (QEMU's
  // migration stream, the guest running on while it is written): what
  // VmSpec::incomingState restores. QEMU is ended after; waits at most
  // `wait`.
  Status save(int stateFd, std::chrono::milliseconds wait);
  // The same with the guest stopped first (its state written once, as it
  // stands), and left stopped once saved: the caller keeps the file, then
  // ends QEMU (kill), or lets the guest go on (resume) if it cannot. A
  // save that fails (or runs out of time) is called off and the guest let
  // go on (QEMU ended if it will not).
  Status saveStopped(int stateFd, std::chrono::milliseconds wait);
  // Why a guest whose connection closed ended, once QEMU has (waited for
  // up to `wait`): the kernel's panic when its console printed one, else
  // how QEMU ended (a signal, an exit status), or that QEMU runs on.
  std::string whyEnded(std::chrono::milliseconds wait) const;
  // Makes 127.0.0.1:port in QEMU's network namespace lead to the guest's
  // `port` (a forward of QEMU's user-mode network, made once per port;
  // that namespace's loopback must be up). Needs VmSpec::monitor.
  Status forwardPort(uint16_t port, std::chrono::milliseconds wait);
  // Runs `work` while the guest is stopped (QMP stop: its vCPUs halted and
  // its disk's writes drained, so the disk's file holds all the guest has
  // written to it), then lets it go on (cont), whatever `work` returned.
  // A guest that cannot be let go on is ended (QEMU killed): it is not
  // left stopped.
  Status whilePaused(const std::function<Status()>& work, std::chrono::milliseconds wait);
  // Lets a stopped guest go on (QMP cont; a running one is unchanged).
  Status resume(std::chrono::milliseconds wait);

 private:
  Status migrateTo(int stateFd, std::chrono::milliseconds wait, bool stopFirst);

 public:
  // A guest restored from a state saved while it was stopped (save's
  // stopFirst): once QEMU has loaded it, lets it run (QMP cont).
  Status runWhenLoaded(std::chrono::milliseconds wait);

 private:
  Vm() = default;
  pid_t pid_ = -1;
  bool adopted_ = false;  // not this process's child (an earlier moatd's)
  std::string workDir_;   // a lasting one's: its sockets
  UniqueFd pidfd_;
  UniqueFd control_;
  UniqueFd console_;  // the console log, as moat made it
  // QMP (VmSpec::monitor): one session, opened at its first use.
  struct Monitor {
    std::timed_mutex mutex;  // the session's: one command at a time
    UniqueFd fd;
    std::optional<Qmp> qmp;
    std::mutex forwardedMutex;
    std::set<uint16_t> forwarded;  // ports QEMU forwards
  };
  // The monitor's session, opened if need be (a lasting QEMU's monitor
  // connected again after a failed one); its mutex held.
  Result<Qmp*> session(Monitor& monitor, std::chrono::steady_clock::time_point deadline) const;
  // `cont`, with monitor_->mutex held.
  Status resumeLocked();
  std::unique_ptr<Monitor> monitor_;
};

}  // namespace moat::backend::microvm
