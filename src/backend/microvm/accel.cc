// The KVM probe: QEMU boots the guest kernel under KVM with no initramfs
// and no disk, which the kernel ends in a panic (no root) and, with
// panic=-1 and -no-reboot, QEMU with it. QEMU runs as moat's helpers do
// (os::runTool: a deadline, nothing inherited) under Landlock: the paths a
// guest's QEMU may reach (vm.cc qemuPaths) and the device.
#include "backend/microvm/accel.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/microvm/vm.h"
#include "os/file.h"
#include "os/security.h"
#include "os/tool.h"

namespace moat::backend::microvm {

namespace {

Status probeBoot(const GuestKernel& kernel, const std::string& qemu, const AccelProbe& probe) {
  VmSpec spec;
  spec.kernel = kernel;
  MOAT_ASSIGN(auto paths, qemuPaths(spec, qemu, false));
  std::vector<os::LandlockRule> rules;
  for (const auto& path : paths) rules.push_back({path.fd.get(), path.access});
  MOAT_ASSIGN(UniqueFd kvm, os::open(probe.device, O_PATH | O_CLOEXEC));
  rules.push_back({kvm.get(), LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE | (1ULL << 15)});
  MOAT_ASSIGN(UniqueFd ruleset, os::landlockFileRuleset(rules));
  os::ToolRun run;
  run.landlockRuleset = ruleset.get();
  run.argv = {qemu,
              "-M",
              "microvm",
              "-accel",
              "kvm",
              "-cpu",
              "host",
              "-m",
              "64",
              "-smp",
              "1",
              "-nodefaults",
              "-no-user-config",
              "-display",
              "none",
              "-no-reboot",
              "-kernel",
              kernel.image,
              "-append",
              "quiet panic=-1 reboot=t rdinit=/none"};
  run.deadline = std::chrono::steady_clock::now() + probe.wait;
  return os::runTool(run);
}

// One line: QEMU's words as the kept answer's third line.
std::string oneLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

// What the kept answer must have been made for: this boot of the host,
// this device (made again when its module is loaded again), QEMU and kernel.
std::string keyOf(const AccelProbe& probe, const std::string& qemu, const GuestKernel& kernel) {
  auto boot = os::readFile("/proc/sys/kernel/random/boot_id", 64);
  struct stat device {};
  if (!boot.ok() || ::stat(probe.device.c_str(), &device) != 0) return "";
  return oneLine(boot.value()) + " " + std::to_string(device.st_ino) + " " + qemu + " " + kernel.image;
}

}  // namespace

AccelChoice chooseAccel(const std::string& asked, const GuestKernel& kernel, const AccelProbe& probe) {
  if (asked == "kvm") return {true, "asked for (--microvm-accel kvm)"};
  if (asked == "tcg") return {false, "asked for (--microvm-accel tcg)"};
  if (::access(probe.device.c_str(), R_OK | W_OK) != 0) {
    return {false, probe.device + " cannot be opened (" + Error::fromErrno("").message() + "): TCG, emulated"};
  }
  auto qemu = findProgram("MOAT_QEMU", "qemu-system-x86_64", "qemu-system-x86");
  if (!qemu.ok()) return {false, qemu.error().message()};
  const std::string key = probe.keptIn.empty() ? "" : keyOf(probe, qemu.value(), kernel);
  if (!key.empty()) {
    auto kept = os::readFile(probe.keptIn, 4096);
    std::vector<std::string> lines;
    for (size_t at = 0; kept.ok() && at < kept->size();) {
      const size_t end = std::min(kept->find('\n', at), kept->size());
      lines.push_back(kept->substr(at, end - at));
      at = end + 1;
    }
    if (lines.size() >= 3 && lines[0] == key && (lines[1] == "kvm" || lines[1] == "tcg")) {
      return {lines[1] == "kvm", lines[2] + " (at an earlier start since the host's boot)"};
    }
  }
  const auto start = std::chrono::steady_clock::now();
  Status booted = probeBoot(kernel, qemu.value(), probe);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  AccelChoice choice{booted.ok(),
                     booted.ok()
                         ? "a probe boot under KVM ended as it should in " + std::to_string(ms) + " ms"
                         : "a probe boot under KVM failed (" + oneLine(booted.error().message()) + "): TCG, emulated"};
  if (!key.empty()) {
    // Written whole or not at all: a reader never sees half of it.
    const std::string temp = probe.keptIn + ".new";
    if (os::writeFile(temp, key + "\n" + (choice.kvm ? "kvm" : "tcg") + "\n" + choice.why + "\n", 0644).ok()) {
      if (::rename(temp.c_str(), probe.keptIn.c_str()) != 0) (void)::unlink(temp.c_str());
    }
  }
  return choice;
}

}  // namespace moat::backend::microvm
