// moat run: one command in a fresh environment, destroyed afterwards.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "cli/microvm_run.h"
#include "cli/run_options.h"
#include "cli/supervise.h"
#include "common/base_environment.h"
#include "common/trace.h"
#include "common/unique_fd.h"
#include "init/protocol.h"
#include "isolation/namespaces/ready_network.h"
#include "os/tool.h"

namespace moat::cli {
namespace {

using backend::namespaces::Environment;

uint64_t hostMemoryMb() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb / 1024;
    in.ignore(1 << 10, '\n');
  }
  return 1 << 20;
}

init::SpawnRequest commandRequest(const std::string& hostname, const RunOptions& options) {
  init::SpawnRequest spawn;
  spawn.id = kRunCommandId;
  spawn.argv = options.command;
  spawn.env = baseEnvironment(hostname, options.workdir);
  for (const auto& e : options.env) spawn.env.push_back(e);
  spawn.cwd = options.workdir;
  spawn.stdinPipe = options.interactive;
  spawn.timeoutMs = static_cast<uint64_t>(std::llround(options.timeoutSeconds * 1000));
  return spawn;
}

}  // namespace

int runCommand(const std::vector<std::string>& args) {
  auto parsed =
      parseRunOptions(args, hostMemoryMb(), [](const char* name) -> const char* { return std::getenv(name); });
  if (!parsed.ok()) {
    std::fprintf(stderr, "moat run: %s\n", parsed.error().context.c_str());
    return kExitUsage;
  }
  RunOptions& options = parsed.value();
  if (options.help) {
    std::fputs(runUsage(), stdout);
    return 0;
  }
  if (::geteuid() != 0) {
    return complain(kExitEnvironment, "moat run needs root (it creates namespaces, cgroups and mounts)");
  }
  traceStage("start");
  // The hostname is the environment's id, which the command's HOSTNAME
  // carries: choose it here so the Spawn can be queued before pid 1 starts.
  options.spec.id = backend::newEnvironmentId();
  options.spec.firstFrames =
      init::encodeFrame(init::MsgType::kSpawn, commandRequest(options.spec.id, options).encode());
  if (options.microvm) {
    // A guest's moat-init gates every exec and asks until told how to
    // judge: moat run has no gate, so every program may run.
    const std::string firstFrames =
        init::encodeFrame(init::MsgType::kExecPolicy, init::ExecPolicy{}.encode()) + options.spec.firstFrames;
    auto vm = MicroVmRun::start(options, firstFrames);
    if (!vm.ok()) return complain(kExitEnvironment, "cannot create environment: " + vm.error().message());
    traceStage("created");
    // moat-init in a guest is the guest's: its --timeout is kept here too,
    // a few seconds after the guest's own should have ended the command.
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (options.timeoutSeconds > 0) {
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(std::llround(options.timeoutSeconds * 1000)) + kGuestTimeoutGrace;
    }
    int code = superviseCommand(
        vm.value()->control(), options, [] { return uint64_t{0}; }, deadline);
    if (code == kExitEnvironment) {
      // Why the guest ended, in its own words (the kernel's, moat-init's).
      std::string tail = os::tailOf(vm.value()->consoleTail(), 1024);
      if (!tail.empty()) std::fprintf(stderr, "moat run: the guest's console ended with:\n%s\n", tail.c_str());
    }
    return code;
  }
  // The network namespace made ahead by an earlier run, if any; the next
  // one is made while this run's command runs (docs/ARCHITECTURE.md).
  std::optional<UniqueFd> network = isolation::namespaces::takeReadyNetwork();
  if (network) options.spec.networkNamespaceFd = network->get();
  auto env = Environment::create(options.spec);
  network.reset();  // joined by the environment (or the create failed)
  if (!env.ok()) return complain(kExitEnvironment, "cannot create environment: " + env.error().message());
  traceStage("created");
  std::jthread next;
  {
    // With every signal blocked: a signal for this run (SIGINT, ...) must
    // reach the command through superviseCommand, not end this thread.
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &old);
    next = std::jthread([] { (void)isolation::namespaces::makeReadyNetwork(); });
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  int code = superviseCommand(env.value()->controlFd(), options, [&] { return env.value()->oomKills(); });
  Status destroyed = env.value()->destroy();
  if (!destroyed.ok()) complain(0, "warning: cleanup: " + destroyed.error().message());
  return code;
}

}  // namespace moat::cli
