// moat shell: a person's terminal in an environment kept by moatd.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "os/terminal.h"
#include "websocket/connection.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kShellUsage = R"(usage: moat shell [ENV] [options]

Opens a terminal in environment ENV: bash if its template has it, else sh,
in /workspace. Without ENV, creates a throwaway environment (default spec)
and destroys it when the shell ends. The terminal follows this one's size.
Leaving (exit, or ^D) ends the shell.

Exit status: the shell's; 125 when moatd or the environment failed (one
line on stderr); 2 bad usage.

options:
  --process P   attach to process P of ENV (a running shell or pty process)
                instead of starting a new shell; several viewers may attach
)";

struct ShellOptions {
  ConnectionOptions connection;
  std::string environment;
  uint64_t process = 0;
  bool help = false;
};

Result<ShellOptions> parseShellOptions(const std::vector<std::string>& args) {
  ShellOptions o;
  FlagReader flags(args);
  while (!flags.done()) {
    if (!flags.currentIsFlag()) {
      if (!o.environment.empty()) return usageError("unexpected argument " + flags.current());
      o.environment = flags.current();
      flags.skip();
      continue;
    }
    MOAT_TRY(flags.next());
    const std::string& name = flags.name();
    bool matched = true;
    if (name == "-h" || name == "--help") {
      MOAT_TRY(flags.noValue());
      o.help = true;
      return o;
    } else if (name == "--process") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(o.process, parseWhole(name, v));
      if (o.process == 0) return usageError("--process: process ids start at 1");
    } else {
      MOAT_TRY(readConnectionFlag(flags, o.connection, matched));
    }
    if (!matched) return usageError("unknown option " + name);
  }
  if (o.process != 0 && o.environment.empty()) return usageError("--process needs an environment");
  return o;
}

// How the session ended, as the shell's exit status.
struct Outcome {
  std::atomic<int> exitCode{kExitEnvironment};
  std::string message;  // set when the end was not the shell exiting
};

void receiveLoop(websocket::Connection& socket, Outcome& outcome, int doneFd) {
  websocket::Message message;
  bool finished = false;
  while (socket.receive(message)) {
    if (message.opcode == websocket::Opcode::kBinary) {
      if (!writeAll(1, message.data)) break;
      continue;
    }
    json j = json::parse(message.data, nullptr, false);
    std::string type = j.is_object() ? j.value("type", "") : "";
    if (type == "exit") {
      outcome.exitCode = j.value("exit_code", kExitEnvironment);
      finished = true;
    } else if (type == "end") {
      outcome.message = "the shell ended: " + j.value("reason", std::string("unknown reason"));
      finished = true;
    } else if (type == "error") {
      outcome.message = j.value("message", std::string());
    }
  }
  if (!finished && outcome.message.empty()) outcome.message = "the connection to moatd ended: " + socket.closeReason();
  char one = 1;
  ssize_t ignored = ::write(doneFd, &one, 1);
  (void)ignored;
}

// Copies the terminal to the shell until the session ends.
void sendLoop(websocket::Connection& socket, int doneFd, int winchFd) {
  bool stdinOpen = true;
  for (;;) {
    struct pollfd fds[3] = {{doneFd, POLLIN, 0}, {winchFd, POLLIN, 0}, {stdinOpen ? 0 : -1, POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      struct signalfd_siginfo info;
      while (::read(winchFd, &info, sizeof info) == sizeof info) {
      }
      auto size = os::windowSize(0);
      (void)socket.sendText(json{{"type", "resize"}, {"rows", size.rows}, {"cols", size.cols}}.dump());
    }
    if (fds[2].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[16384];
      ssize_t n = ::read(0, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        // Input ended (a pipe, not a person): the terminal's EOF character.
        stdinOpen = false;
        (void)socket.sendBinary("\x04");
        continue;
      }
      if (!socket.sendBinary(std::string_view(buf, static_cast<size_t>(n)))) return;
    }
  }
}

int runSession(Client& client, const std::string& id, uint64_t process) {
  auto size = os::windowSize(0);
  std::string target = "/v1/environments/" + urlEncode(id) + "/shell?rows=" + std::to_string(size.rows) +
                       "&cols=" + std::to_string(size.cols);
  if (process) target += "&process=" + std::to_string(process);
  auto upgraded = client.openWebSocket(target);
  if (!upgraded.ok()) return reportFailure("shell", upgraded.error());
  websocket::Connection socket(upgraded->fd.get(), true, std::move(upgraded->pending), 16u << 20);

  sigset_t winch;
  sigemptyset(&winch);
  sigaddset(&winch, SIGWINCH);
  ::sigprocmask(SIG_BLOCK, &winch, nullptr);  // before the thread: it inherits the mask
  UniqueFd winchFd(::signalfd(-1, &winch, SFD_CLOEXEC | SFD_NONBLOCK));
  int done[2];
  if (::pipe2(done, O_CLOEXEC) != 0) return complain(kExitEnvironment, "pipe: " + std::string(std::strerror(errno)));
  UniqueFd doneRead(done[0]), doneWrite(done[1]);

  std::optional<os::RawMode> raw;
  if (os::isTerminal(0)) {
    auto mode = os::RawMode::enable(0);
    if (mode.ok()) raw.emplace(std::move(mode.value()));
  }
  Outcome outcome;
  std::thread receiver([&] { receiveLoop(socket, outcome, doneWrite.get()); });
  sendLoop(socket, doneRead.get(), winchFd.get());
  socket.close(1000, "");
  socket.abort();  // if moatd does not answer the close, the receiver still ends
  receiver.join();
  raw.reset();  // the terminal is the person's again before we print
  if (!outcome.message.empty()) complain(kExitEnvironment, outcome.message);
  return outcome.exitCode;
}

}  // namespace

int shellCommand(const std::vector<std::string>& args) {
  auto parsed = parseShellOptions(args);
  if (!parsed.ok()) return reportFailure("shell", parsed.error());
  if (parsed->help) {
    std::fputs(kShellUsage, stdout);
    std::fputs(connectionUsage(), stdout);
    return 0;
  }
  auto client = Client::fromOptions(parsed->connection);
  if (!client.ok()) return reportFailure("shell", client.error());
  std::string id = parsed->environment;
  bool throwaway = id.empty();
  if (throwaway) {
    auto created = call(client.value(), "POST", "/v1/environments", R"({"labels":{"moat":"shell"}})", 201);
    if (!created.ok()) return reportFailure("shell", created.error());
    id = created->value("id", "");
  }
  int code = runSession(client.value(), id, parsed->process);
  if (throwaway) {
    auto removed = call(client.value(), "DELETE", "/v1/environments/" + urlEncode(id), "", 204);
    if (!removed.ok()) complain(kExitEnvironment, "removing environment " + id + ": " + removed.error().message());
  }
  return code;
}

}  // namespace moat::cli
