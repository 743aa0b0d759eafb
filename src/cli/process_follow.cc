#include "cli/process_follow.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>

#include "cli/exit_codes.h"
#include "common/encoding.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr size_t kStdinPiece = 256u << 10;  // one POST .../stdin per piece read
// How long one POST .../stdin may wait for a command that is not reading
// (moatd holds at most 1 MiB of input for it): short, so that signals are
// still forwarded meanwhile; the piece is sent again until it is taken.
constexpr int kStdinWaitMs = 250;

std::string processPath(const FollowOptions& o) {
  return "/v1/environments/" + urlEncode(o.environment) + "/processes/" + std::to_string(o.process);
}

// One request about the process. A 409 (the command ended, or closed its
// stdin) is no news: its end is what we report. Anything else is said once.
bool post(Client& client, const std::string& target, const json& body, const std::string& what) {
  auto reply = client.request("POST", target, body.dump());
  if (reply.ok() && reply->status == 204) return true;
  if (reply.ok() && reply->status == 409) return false;
  complain(0, what + ": " + (reply.ok() ? describeError(reply.value()) : reply.error().message()));
  return false;
}

enum class Sent { kTaken, kFull, kRefused };

// One piece of our stdin. Full: the command has not read what came before;
// nothing of this piece was taken. A moatd from before the input window
// knows no wait_ms (400 naming it): then it is sent without.
Sent sendStdin(Client& client, const std::string& target, const std::string& piece, bool& withWait) {
  json body = {{"data", base64Encode(piece)}, {"encoding", "base64"}};
  if (withWait) body["wait_ms"] = kStdinWaitMs;
  auto reply = client.request("POST", target, body.dump());
  if (withWait && reply.ok() && reply->status == 400 && reply->body.find("wait_ms") != std::string::npos) {
    withWait = false;
    return sendStdin(client, target, piece, withWait);
  }
  if (reply.ok() && reply->status == 409) {
    auto j = json::parse(reply->body, nullptr, false);
    if (j.is_object() && j["error"].is_object() && j["error"].value("code", "") == "stdin_full") return Sent::kFull;
    return Sent::kRefused;
  }
  if (reply.ok() && reply->status == 204) return Sent::kTaken;
  complain(0, "sending stdin: " + (reply.ok() ? describeError(reply.value()) : reply.error().message()));
  return Sent::kRefused;
}

bool sendSignal(Client& client, const FollowOptions& o, int signo) {
  return post(client, processPath(o) + "/signal", {{"signal", signo}}, "sending signal " + std::to_string(signo));
}

// Reads the output stream (newline-delimited JSON events) and acts on it.
class OutputPrinter {
 public:
  OutputPrinter(Client& client, const FollowOptions& options) : client_(client), options_(options) {}

  // False once the stream must stop: its final event, or a line we cannot read.
  bool feed(const std::string& bytes) {
    pending_ += bytes;
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (!handle(pending_.substr(start, nl - start))) return false;
    }
    pending_.erase(0, start);
    return true;
  }

  bool ended() const { return ended_; }
  int exitCode() const { return exitCode_; }
  const std::string& message() const { return message_; }
  // Bytes lost between moatd and a reader still there (dropped events do not
  // say which stream: once a reader left, losing its output is no news).
  uint64_t dropped() const { return readerGone_[0] || readerGone_[1] ? 0 : dropped_; }

 private:
  bool fail(const std::string& message) {
    message_ = message;
    return false;
  }

  bool handle(const std::string& line) {
    // Output lines carry nearly all the bytes, and nlohmann builds a string a
    // character at a time (~20 MB/s): moatd writes keys in order, so `data`
    // comes first and is cut out before the rest is parsed. Base64 holds no
    // quote or backslash.
    static constexpr std::string_view kData = "{\"data\":\"";
    if (line.compare(0, kData.size(), kData) == 0) {
      size_t end = line.find('"', kData.size());
      if (end != std::string::npos && line.compare(end, 2, "\",") == 0) {
        json rest = json::parse("{" + line.substr(end + 2), nullptr, false);
        if (rest.is_object() && rest.value("type", "") == "output") {
          return print(rest, line.substr(kData.size(), end - kData.size()));
        }
      }
    }
    json event = json::parse(line, nullptr, false);
    if (!event.is_object() || !event.contains("type") || !event["type"].is_string()) {
      return fail("moatd sent an output line that is not an event (the command may still be running)");
    }
    const std::string type = event["type"];
    if (type == "output") {
      if (!event.contains("data") || !event["data"].is_string()) return fail("moatd sent output without data");
      return print(event, event["data"].get<std::string>());
    }
    if (type == "dropped") {
      if (event.contains("bytes") && event["bytes"].is_number_unsigned()) dropped_ += event["bytes"].get<uint64_t>();
      return true;
    }
    if (type == "exit") return finish(event);
    if (type == "end") {
      ended_ = true;
      return fail("the command can no longer be followed: " + event.value("reason", std::string("no reason given")));
    }
    return true;  // heartbeat, or a kind added later
  }

  bool print(const json& event, const std::string& base64) {
    auto data = base64Decode(base64);  // asked for with encoding=base64
    if (!data.ok()) return fail("moatd sent output that is not valid base64");
    int stream = event.value("stream", "") == "stderr" ? 1 : 0;
    if (readerGone_[stream] || writeAll(stream + 1, data.value())) return true;
    // Whoever read it is gone (`moat exec ENV -- yes | head -1`): the command
    // gets SIGPIPE, as it would writing to a closed pipe itself.
    readerGone_[stream] = true;
    (void)sendSignal(client_, options_, SIGPIPE);
    return true;
  }

  bool finish(const json& event) {
    ended_ = true;
    int code =
        event.contains("exit_code") && event["exit_code"].is_number_integer() ? event["exit_code"].get<int>() : -1;
    if (event.value("state", "") == "failed") {
      // Could not start: what the shell would have said, as the command's stderr.
      writeAll(2, event.value("error", std::string("the command could not start")) + "\n");
    }
    if (event.value("timed_out", false)) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", options_.timeoutSeconds);
      message_ = std::string("timeout: killed after ") + secs + "s";
      exitCode_ = kExitTimeout;
    } else if (code >= 0 && code <= 255) {
      exitCode_ = code;
    } else {
      message_ = "moatd reported no exit status for the command";
    }
    return false;
  }

  Client& client_;
  const FollowOptions& options_;
  std::string pending_;
  bool ended_ = false;
  int exitCode_ = kExitEnvironment;
  std::string message_;
  uint64_t dropped_ = 0;
  bool readerGone_[2] = {false, false};
};

// The signals we pass on. A handler, not a signalfd: a third ^C must leave
// even while a request to a stuck moatd holds the forwarding thread.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
int signalPipe = -1;             // the handler's way to the forwarding thread
std::atomic<int> interrupts{0};  // ^C so far
char leaveMessage[256];          // written by the handler: formatted beforehand

void onSignal(int signo) {
  int saved = errno;
  if (signo == SIGINT && interrupts.fetch_add(1) + 1 >= 3) {
    (void)!::write(2, leaveMessage, std::strlen(leaveMessage));
    ::_exit(128 + SIGINT);
  }
  char byte = static_cast<char>(signo);
  (void)!::write(signalPipe, &byte, 1);
  errno = saved;
}

// The dispositions before ours: a signal ignored when we started (nohup,
// a script's `&`) stays ignored, and each is put back at the end.
struct sigaction previous[std::size(kForwarded)];
bool handled[std::size(kForwarded)];

Status installHandlers(const FollowOptions& o, int pipeWrite) {
  std::snprintf(leaveMessage, sizeof leaveMessage,
                "moat: left without waiting: process %llu of environment %.64s may still be running\n",
                static_cast<unsigned long long>(o.process), o.environment.c_str());
  signalPipe = pipeWrite;
  struct sigaction action = {};
  action.sa_handler = onSignal;
  action.sa_flags = SA_RESTART;  // requests in progress go on
  sigemptyset(&action.sa_mask);
  sigset_t ours;
  sigemptyset(&ours);
  for (size_t i = 0; i < std::size(kForwarded); ++i) {
    handled[i] = false;
    if (::sigaction(kForwarded[i], nullptr, &previous[i]) != 0) return Error::fromErrno("sigaction");
    if (previous[i].sa_handler == SIG_IGN) continue;
    if (::sigaction(kForwarded[i], &action, nullptr) != 0) return Error::fromErrno("sigaction");
    handled[i] = true;
    sigaddset(&ours, kForwarded[i]);
  }
  ::pthread_sigmask(SIG_UNBLOCK, &ours, nullptr);  // a blocked mask is inherited too
  return {};
}

void restoreHandlers() {
  for (size_t i = 0; i < std::size(kForwarded); ++i) {
    if (handled[i]) ::sigaction(kForwarded[i], &previous[i], nullptr);
  }
}

// Until `doneFd` is readable: our stdin and signals go to the command.
void forwardLoop(Client& client, const FollowOptions& o, int doneFd, int signalFd) {
  bool stdinOpen = o.forwardStdin;
  bool interrupted = false;
  const std::string target = processPath(o) + "/stdin";
  std::string buf(kStdinPiece, '\0');
  std::string piece;  // read, not yet taken (the command is not reading)
  bool withWait = true;
  for (;;) {
    bool reading = stdinOpen && piece.empty();
    pollfd fds[3] = {{doneFd, POLLIN, 0}, {signalFd, POLLIN, 0}, {reading ? 0 : -1, POLLIN, 0}};
    if (::poll(fds, 3, piece.empty() ? -1 : 0) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      char signo = 0;
      if (::read(signalFd, &signo, 1) == 1) {
        // A second ^C is for a command that did not stop at the first.
        bool again = signo == SIGINT && interrupted;
        interrupted = interrupted || signo == SIGINT;
        (void)sendSignal(client, o, again ? SIGKILL : signo);
      }
    }
    if (reading && (fds[2].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))) {
      ssize_t n = (fds[2].revents & POLLNVAL) ? 0 : ::read(0, buf.data(), buf.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n > 0) {
        piece.assign(buf.data(), static_cast<size_t>(n));
      } else {
        stdinOpen = false;
        (void)post(client, target, {{"close", true}}, "closing stdin");
      }
    }
    if (!piece.empty()) {
      Sent sent = sendStdin(client, target, piece, withWait);
      if (sent == Sent::kFull) continue;
      piece.clear();
      if (sent == Sent::kRefused) {
        // The command ended or closed its stdin (the rest has nowhere to
        // go), or moatd failed (then the command still gets its end).
        stdinOpen = false;
        (void)client.request("POST", target, json{{"close", true}}.dump());
      }
    }
  }
}

}  // namespace

int followProcess(Client& client, const FollowOptions& options) {
  // From here on a ^C, a terminal hang-up or a supervisor's TERM is for the
  // command (before, they end us: the command may not exist yet).
  ::signal(SIGPIPE, SIG_IGN);
  int done[2] = {-1, -1}, signalled[2] = {-1, -1};
  bool piped = ::pipe2(done, O_CLOEXEC) == 0 && ::pipe2(signalled, O_CLOEXEC | O_NONBLOCK) == 0;
  int pipeErrno = errno;
  UniqueFd doneRead(done[0]), doneWrite(done[1]), signalRead(signalled[0]), signalWrite(signalled[1]);
  if (!piped) return complain(kExitEnvironment, std::string("pipe: ") + std::strerror(pipeErrno));
  if (Status s = installHandlers(options, signalWrite.get()); !s.ok()) {
    return complain(kExitEnvironment, s.error().message());
  }
  std::thread forwarder([&] { forwardLoop(client, options, doneRead.get(), signalRead.get()); });

  OutputPrinter printer(client, options);
  auto streamed = client.stream(processPath(options) + "/output?follow=1&encoding=base64",
                                [&](const std::string& bytes) { return printer.feed(bytes); });
  char one = 1;
  (void)!::write(doneWrite.get(), &one, 1);
  forwarder.join();
  restoreHandlers();

  if (printer.dropped() > 0) {
    complain(0, std::to_string(printer.dropped()) +
                    " bytes of the command's output were lost: this reader fell more than 1 MiB behind it");
  }
  if (!streamed.ok()) {
    return complain(kExitEnvironment, "following process " + std::to_string(options.process) + " of environment " +
                                          options.environment + ": " + streamed.error().message() +
                                          " (the command may still be running)");
  }
  if (streamed->status != 200) return complain(kExitEnvironment, describeError(streamed.value()));
  if (!printer.message().empty()) {
    complain(0, printer.message());
    return printer.ended() && printer.exitCode() != kExitEnvironment ? printer.exitCode() : kExitEnvironment;
  }
  if (!printer.ended()) {
    return complain(kExitEnvironment, "moatd ended the output stream of process " + std::to_string(options.process) +
                                          " before the command ended");
  }
  return printer.exitCode();
}

}  // namespace moat::cli
