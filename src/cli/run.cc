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
#include "common/base_environment.h"
#include "common/trace.h"
#include "common/unique_fd.h"
#include "init/protocol.h"
#include "isolation/namespaces/ready_network.h"
#include "os/tool.h"

namespace moat::cli {
namespace {

using backend::namespaces::Environment;

constexpr uint32_t kCommandId = 1;

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
  spawn.id = kCommandId;
  spawn.argv = options.command;
  spawn.env = baseEnvironment(hostname, options.workdir);
  for (const auto& e : options.env) spawn.env.push_back(e);
  spawn.cwd = options.workdir;
  spawn.stdinPipe = options.interactive;
  spawn.timeoutMs = static_cast<uint64_t>(std::llround(options.timeoutSeconds * 1000));
  return spawn;
}

// Talks to moat-init until the command ends (its Spawn request is already
// queued); returns moat run's exit code.
int superviseCommand(int control, const RunOptions& options, const std::function<uint64_t()>& oomKills) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&mask, s);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  UniqueFd signals(::signalfd(-1, &mask, SFD_CLOEXEC));
  ::signal(SIGPIPE, SIG_IGN);

  bool stdinOpen = options.interactive;
  // Input is read while at most this much sent earlier waits in moat-init
  // (StdinTaken): a command that does not read holds up `moat run`'s own
  // reading, not moat-init's memory.
  constexpr uint64_t kStdinWindow = 1u << 20;
  uint64_t stdinSent = 0, stdinTaken = 0;
  bool readerGone[2] = {false, false};
  init::FrameReader reader;
  for (;;) {
    pollfd fds[3] = {{control, POLLIN, 0}, {signals.get(), POLLIN, 0}, {0, POLLIN, 0}};
    nfds_t count = stdinOpen && stdinSent - stdinTaken < kStdinWindow ? 3 : 2;
    if (::poll(fds, count, -1) < 0) {
      if (errno == EINTR) continue;
      return complain(kExitEnvironment, std::string("poll: ") + std::strerror(errno));
    }
    if (fds[1].revents & POLLIN) {
      struct signalfd_siginfo info;
      if (::read(signals.get(), &info, sizeof info) == sizeof info) {
        init::SignalRequest forward{kCommandId, static_cast<int32_t>(info.ssi_signo), true};
        (void)init::writeFrame(control, init::MsgType::kSignal, forward.encode());
      }
    }
    if (count == 3 && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      char buf[init::kOutputChunk];
      ssize_t n = ::read(0, buf, sizeof buf);
      if (n > 0) {
        init::StdinData data{kCommandId, std::string(buf, static_cast<size_t>(n))};
        (void)init::writeFrame(control, init::MsgType::kStdin, data.encode());
        stdinSent += static_cast<uint64_t>(n);
      } else if (n == 0 || errno != EINTR) {
        stdinOpen = false;
        (void)init::writeFrame(control, init::MsgType::kCloseStdin, init::ProcessRef{kCommandId}.encode());
      }
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buf[65536];
    ssize_t n = ::read(control, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return complain(kExitEnvironment, "environment failed: moat-init exited");
    reader.feed(buf, static_cast<size_t>(n));
    init::Frame frame;
    for (;;) {
      auto next = reader.next(frame);
      if (!next.ok()) return complain(kExitEnvironment, "environment failed: " + next.error().message());
      if (!next.value()) break;
      switch (frame.type) {
        case init::MsgType::kOutput: {
          auto out = init::Output::decode(frame.payload);
          if (!out.ok()) break;
          int stream = out->stream == init::Stream::kStdout ? 0 : 1;
          if (readerGone[stream] || writeAll(stream + 1, out->data)) break;
          // Whoever read our output is gone (`moat run yes | head -1`): the
          // command gets SIGPIPE, as it would writing to a closed pipe itself.
          readerGone[stream] = true;
          init::SignalRequest pipe{kCommandId, SIGPIPE, true};
          (void)init::writeFrame(control, init::MsgType::kSignal, pipe.encode());
          break;
        }
        case init::MsgType::kSpawnFailed: {
          auto failed = init::SpawnFailed::decode(frame.payload);
          if (!failed.ok()) return complain(kExitEnvironment, "environment failed: bad reply");
          std::string what = std::strerror(failed->err);
          if (failed->stage == "exec" && failed->err == ENOENT) {
            return complain(kExitNotFound, "command not found in the environment: " + options.command[0]);
          }
          if (failed->stage == "chdir") {
            return complain(kExitCannotRun, "working directory " + options.workdir + ": " + what);
          }
          return complain(kExitCannotRun, "cannot run " + options.command[0] + " (" + failed->stage + "): " + what);
        }
        case init::MsgType::kExited: {
          traceStage("command exited");
          auto exited = init::Exited::decode(frame.payload);
          if (!exited.ok()) return complain(kExitEnvironment, "environment failed: bad reply");
          if (exited->timedOut) {
            char secs[32];
            std::snprintf(secs, sizeof secs, "%g", options.timeoutSeconds);
            return complain(kExitTimeout, std::string("timeout: killed after ") + secs + "s");
          }
          if (exited->signal != 0) {
            if (exited->signal == SIGKILL && oomKills() > 0) {
              complain(0, "killed: out of memory (limit " + std::to_string(options.spec.memoryMb) + " MB)");
            }
            return 128 + std::clamp(exited->signal, 1, 127);  // a guest's moat-init says what it likes
          }
          return exited->exitCode;
        }
        case init::MsgType::kHello: {
          auto hello = init::Hello::decode(frame.payload);
          if (!hello.ok() || hello->version != init::kProtocolVersion) {
            return complain(kExitEnvironment, "environment failed: moat-init speaks another protocol");
          }
          traceStage("hello");
          break;
        }
        case init::MsgType::kStdinTaken: {
          auto taken = init::StdinTaken::decode(frame.payload);
          if (taken.ok()) stdinTaken = std::max(stdinTaken, std::min(taken->total, stdinSent));
          break;
        }
        case init::MsgType::kProtocolError:
          return complain(kExitEnvironment, "environment failed: protocol error");
        default:
          break;
      }
    }
  }
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
    auto vm = MicroVmRun::start(options, options.spec.firstFrames);
    if (!vm.ok()) return complain(kExitEnvironment, "cannot create environment: " + vm.error().message());
    traceStage("created");
    int code = superviseCommand(vm.value()->control(), options, [] { return uint64_t{0}; });
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
