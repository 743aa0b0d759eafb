#include "init/guest_commands.h"

#include <fcntl.h>
#include <sys/mount.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "os/file.h"
#include "os/mount.h"

namespace moat::init {
namespace {

constexpr const char* kMount = "/sys/fs/cgroup";
constexpr const char* kCommands = "moat";
constexpr auto kStopDeadline = std::chrono::seconds(5);

}  // namespace

Result<GuestCommands> GuestCommands::make(const std::string& pids) {
  MOAT_TRY(os::mount("cgroup2", kMount, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, "nsdelegate"));
  const std::string dir = std::string(kMount) + "/" + kCommands;
  // Counted whether bounded or not (the environment's stats).
  MOAT_TRY(os::writeExisting(std::string(kMount) + "/cgroup.subtree_control", "+pids"));
  MOAT_TRY(os::makeDir(dir, 0755));
  if (!pids.empty()) MOAT_TRY(os::writeExisting(dir + "/pids.max", pids));
  GuestCommands commands;
  MOAT_ASSIGN(commands.dir_, os::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  MOAT_TRY(os::unmount(kMount, MNT_DETACH));
  return commands;
}

std::string GuestCommands::file(const char* name) const {
  return "/proc/self/fd/" + std::to_string(dir_.get()) + "/" + name;
}

Status GuestCommands::freeze() {
  MOAT_TRY(os::writeExisting(file("cgroup.freeze"), "1"));
  const auto deadline = std::chrono::steady_clock::now() + kStopDeadline;
  for (;;) {
    // "frozen 1" once every process below has stopped.
    auto events = os::readFile(file("cgroup.events"));
    if (!events.ok()) return events.error();
    if (events->find("frozen 1") != std::string::npos) return {};
    if (std::chrono::steady_clock::now() > deadline) {
      (void)thaw();  // nothing stays half paused
      return Error::make(Code::kTimeout, "the guest's processes did not all stop within 5 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status GuestCommands::thaw() { return os::writeExisting(file("cgroup.freeze"), "0"); }

Result<uint64_t> GuestCommands::tasks() const {
  MOAT_ASSIGN(std::string count, os::readFile(file("pids.current")));
  return std::strtoull(count.c_str(), nullptr, 10);
}

}  // namespace moat::init
