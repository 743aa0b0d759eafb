// The KVM probe: QEMU boots the guest kernel under KVM with no initramfs
// and no disk, which the kernel ends in a panic (no root) and, with
// panic=-1 and -no-reboot, QEMU with it. Only the panic on its console
// counts: a guest reset (a triple fault, as a broken nested KVM gives)
// ends QEMU the same way. QEMU runs as moat's helpers do (os::runTool: a
// deadline, nothing inherited) under Landlock: the paths a guest's QEMU
// may reach (vm.cc qemuPaths) and the device; it is given no input but
// the host's own kernel.
#include "backend/microvm/accel.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backend/microvm/vm.h"
#include "os/file.h"
#include "os/security.h"
#include "os/tool.h"

namespace moat::backend::microvm {

namespace {

// What the kernel prints when it finds no root (and panics).
constexpr const char* kPanicLine = "Kernel panic";

Status probeBoot(const GuestKernel& kernel, const std::string& qemu, const AccelProbe& probe) {
  VmSpec spec;
  spec.kernel = kernel;
  MOAT_ASSIGN(auto paths, qemuPaths(spec, qemu, false));
  std::vector<os::LandlockRule> rules;
  for (const auto& path : paths) rules.push_back({path.fd.get(), path.access});
  MOAT_ASSIGN(UniqueFd kvm, os::open(probe.device, O_PATH | O_CLOEXEC));
  rules.push_back({kvm.get(), kQemuKvmAccess});
  MOAT_ASSIGN(UniqueFd ruleset, os::landlockFileRuleset(rules));
  // The console, to a file of moatd's own (QEMU writes its descriptor 1).
  MOAT_ASSIGN(UniqueFd console, os::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  os::ToolRun run;
  run.landlockRuleset = ruleset.get();
  run.stdoutFd = console.get();
  run.maxFileBytes = 1 << 20;
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
              "-serial",
              "stdio",
              "-no-reboot",
              "-kernel",
              kernel.image,
              "-append",
              "console=ttyS0 quiet panic=-1 reboot=t rdinit=/none"};
  run.deadline = std::chrono::steady_clock::now() + probe.wait;
  MOAT_TRY(os::runTool(run));
  auto said = os::readFile("/proc/self/fd/" + std::to_string(console.get()), 1 << 20);
  if (!said.ok() || said->find(kPanicLine) == std::string::npos) {
    return Error::make(Code::kUnavailable,
                       "QEMU ended without the guest kernel's panic on its console (a reset, as a KVM that "
                       "cannot run a guest gives)");
  }
  return {};
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
// this device (made again when its module is loaded again), this QEMU and
// this kernel (an upgrade of either is a new file: probed again).
std::string keyOf(const AccelProbe& probe, const std::string& qemu, const GuestKernel& kernel) {
  auto boot = os::readFile("/proc/sys/kernel/random/boot_id", 64);
  struct stat device {
  }, program{}, image{};
  if (!boot.ok() || ::stat(probe.device.c_str(), &device) != 0 || ::stat(qemu.c_str(), &program) != 0 ||
      ::stat(kernel.image.c_str(), &image) != 0) {
    return "";
  }
  auto file = [](const std::string& path, const struct stat& st) {
    return path + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
           std::to_string(st.st_mtim.tv_nsec);
  };
  return oneLine(boot.value()) + " " + std::to_string(device.st_ino) + " " + file(qemu, program) + " " +
         file(kernel.image, image);
}

}  // namespace

AccelChoice chooseAccel(const std::string& asked, const GuestKernel& kernel, const AccelProbe& probe) {
  if (asked == "kvm") return {true, "KVM, as asked"};
  if (asked == "tcg") return {false, "TCG, as asked"};
  if (::access(probe.device.c_str(), R_OK | W_OK) != 0) {
    return {false, probe.device + " cannot be opened (" + std::strerror(errno) + "): TCG, emulated"};
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
