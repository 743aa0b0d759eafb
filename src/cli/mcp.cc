// moat mcp: moat as an MCP server over stdio (docs/MCP.md).
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "mcp/session.h"
#include "os/file.h"

namespace moat::cli {
namespace {

constexpr const char* kMcpUsage = R"(usage: moat mcp [--standalone] [connection options]

Serves the Model Context Protocol on stdin/stdout (newline-delimited
JSON-RPC; messages about the server go to stderr), with moatd doing the work:
tools to create environments, run commands, read, write, edit and search
files, follow processes and set network policies (docs/MCP.md). Tools without
an environment id use the session's own environment, destroyed when stdin
closes.

  claude mcp add moat -- moat mcp

  --standalone   no moatd needed: start a private one on a temporary state
                 directory (root) and stop it, with everything in it, at the end

)";

// The REST API over moat's HTTP client (one connection per call: calls may
// come from several threads at once).
class HttpRest : public mcp::RestBackend {
 public:
  explicit HttpRest(Client client) : client_(std::move(client)) {}
  mcp::RestResponse call(const std::string& method, const std::string& target, const std::string& body) override {
    auto reply = client_.request(method, target, body);
    if (!reply.ok()) return {0, reply.error().message(), ""};
    return {reply->status, reply->body, ""};
  }

 private:
  Client client_;
};

// A moatd of our own for --standalone.
class PrivateMoatd {
 public:
  ~PrivateMoatd() { stop(); }
  Result<ConnectionOptions> start() {
    if (::geteuid() != 0) return usageError("--standalone starts a moatd, which needs root");
    MOAT_ASSIGN(std::string dir, os::selfDirectory());
    // Beside moat (the build tree), or in PREFIX/sbin (an installation).
    std::string moatd = dir + "/moatd";
    if (::access(moatd.c_str(), X_OK) != 0) moatd = dir + "/../sbin/moatd";
    if (::access(moatd.c_str(), X_OK) != 0)
      return Error::make(Code::kNotFound, "--standalone: no moatd next to moat nor in " + dir + "/../sbin");
    char pattern[] = "/tmp/moat-mcp-XXXXXX";
    if (!::mkdtemp(pattern)) return Error::fromErrno("mkdtemp");
    state_ = pattern;
    pid_ = ::fork();
    if (pid_ < 0) return Error::fromErrno("fork moatd");
    if (pid_ == 0) {
      // Its messages must not reach stdout, where the protocol is.
      ::dup2(2, 1);
      ::execl(moatd.c_str(), "moatd", "--state", state_.c_str(), "--listen", "127.0.0.1:0", nullptr);
      ::_exit(127);
    }
    ConnectionOptions options;
    options.stateDir = state_;
    for (int i = 0; i < 600; ++i) {                // up to a minute: the first start builds the host template
      auto client = Client::fromOptions(options);  // the token file appears once moatd runs
      if (client.ok()) {
        auto reply = client->request("GET", "/healthz");
        if (reply.ok() && reply->status == 200) return options;
      }
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return Error::make(Code::kFailed, "--standalone: moatd exited at start (its messages are above)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a child we cannot wait on otherwise
    }
    return Error::make(Code::kTimeout, "--standalone: moatd did not start within a minute");
  }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);  // destroys every environment it made
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (!state_.empty()) {
      ::umount2((state_ + "/storage").c_str(), MNT_DETACH);
      (void)os::removeTree(state_);
      state_.clear();
    }
  }

 private:
  pid_t pid_ = -1;
  std::string state_;
};

}  // namespace

int mcpCommand(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  bool standalone = false;
  FlagReader flags(args);
  Status s;
  while (s.ok() && !flags.done()) {
    if (!flags.currentIsFlag()) {
      s = usageError("unexpected argument '" + flags.current() + "'");
      break;
    }
    s = flags.next();
    if (!s.ok()) break;
    bool matched = false;
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok() || matched) continue;
    if (flags.name() == "-h" || flags.name() == "--help") {
      std::fputs(kMcpUsage, stdout);
      std::fputs(connectionUsage(), stdout);
      return 0;
    }
    if (flags.name() == "--standalone") {
      standalone = true;
      continue;
    }
    s = usageError("unknown option " + flags.name() + " (see moat mcp --help)");
  }
  if (!s.ok()) return reportFailure("mcp", s.error());
  ::signal(SIGPIPE, SIG_IGN);

  PrivateMoatd own;
  // A client that stops the server with a signal still gets its session's
  // environment (and a --standalone moatd) cleaned up, also while starting.
  std::atomic<mcp::Session*> current{nullptr};
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stopSignals, sig);
  ::pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);
  std::thread([&current, &own, stopSignals] {
    int sig = 0;
    ::sigwait(&stopSignals, &sig);
    if (mcp::Session* s = current.load()) s->close();
    own.stop();
    ::_exit(128 + sig);
  }).detach();
  if (standalone) {
    auto started = own.start();
    if (!started.ok()) return reportFailure("mcp", started.error());
    connection = started.value();
  }
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("mcp", client.error());
  HttpRest rest(std::move(client.value()));
  mcp::Session session(rest, "moat");
  current = &session;
  std::mutex outMutex;
  auto send = [&](const nlohmann::json& message) {
    std::string line = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::lock_guard<std::mutex> lock(outMutex);
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
  };
  // Requests run on their own threads: a cancellation or a ping must be read
  // while a long command runs.
  struct Running {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };
  std::list<Running> running;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    auto message = nlohmann::json::parse(line, nullptr, false);
    if (message.is_discarded()) {
      send(mcp::Session::parseError("the line is not JSON"));
      continue;
    }
    if (mcp::kindOf(message) == mcp::Kind::kRequest && message["method"] == "tools/call") {
      for (auto it = running.begin(); it != running.end();) {  // the finished ones
        if (it->done->load()) {
          it->thread.join();
          it = running.erase(it);
        } else {
          ++it;
        }
      }
      Running r;
      auto done = r.done;
      r.thread = std::thread([&session, &send, message, done] {
        if (auto answer = session.handle(message, send)) send(*answer);
        *done = true;
      });
      running.push_back(std::move(r));
    } else if (auto answer = session.handle(message, send)) {
      send(*answer);
    }
  }
  // stdin closed: the client is done. Calls in flight get a moment to
  // answer, then are cancelled; the session's environment goes.
  auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& r : running) {
    while (!r.done->load() && std::chrono::steady_clock::now() < grace) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  session.close();
  for (auto& r : running) r.thread.join();
  current = nullptr;
  return 0;
}

}  // namespace moat::cli
