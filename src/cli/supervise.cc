#include "cli/supervise.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "cli/client.h"
#include "cli/exit_codes.h"
#include "common/trace.h"
#include "common/unique_fd.h"
#include "init/protocol.h"

namespace moat::cli {

int superviseCommand(int control, const RunOptions& options, const std::function<uint64_t()>& oomKills,
                     std::optional<std::chrono::steady_clock::time_point> hostDeadline) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&mask, s);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  UniqueFd signals(::signalfd(-1, &mask, SFD_CLOEXEC));
  ::signal(SIGPIPE, SIG_IGN);

  // A write that failed (moat-init gone, or a guest's that stopped reading
  // past the send timeout, maybe mid-frame): nothing more can be said.
  auto lost = [](const Status& w) {
    return complain(kExitEnvironment, "environment failed: writing to moat-init: " + w.error().message());
  };
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
    int wait = -1;
    if (hostDeadline) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(*hostDeadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", options.timeoutSeconds);
        return complain(kExitTimeout, std::string("timeout: killed after ") + secs +
                                          "s (the guest had not ended it: the whole guest was stopped)");
      }
      wait = static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
    }
    int ready = ::poll(fds, count, wait);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return complain(kExitEnvironment, std::string("poll: ") + std::strerror(errno));
    }
    if (ready == 0) continue;  // the host's deadline, checked above
    if (fds[1].revents & POLLIN) {
      struct signalfd_siginfo info;
      if (::read(signals.get(), &info, sizeof info) == sizeof info) {
        init::SignalRequest forward{kRunCommandId, static_cast<int32_t>(info.ssi_signo), true};
        if (Status w = init::writeFrame(control, init::MsgType::kSignal, forward.encode()); !w.ok()) return lost(w);
      }
    }
    if (count == 3 && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      char buf[init::kOutputChunk];
      ssize_t n = ::read(0, buf, sizeof buf);
      if (n > 0) {
        init::StdinData data{kRunCommandId, std::string(buf, static_cast<size_t>(n))};
        if (Status w = init::writeFrame(control, init::MsgType::kStdin, data.encode()); !w.ok()) return lost(w);
        stdinSent += static_cast<uint64_t>(n);
      } else if (n == 0 || errno != EINTR) {
        stdinOpen = false;
        Status w = init::writeFrame(control, init::MsgType::kCloseStdin, init::ProcessRef{kRunCommandId}.encode());
        if (!w.ok()) return lost(w);
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
          init::SignalRequest pipe{kRunCommandId, SIGPIPE, true};
          if (Status w = init::writeFrame(control, init::MsgType::kSignal, pipe.encode()); !w.ok()) return lost(w);
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

}  // namespace moat::cli
