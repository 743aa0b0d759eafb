#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

// A real moatd started by a test, and an HTTP client for it (over its unix
// socket, as the CLI does by default).
namespace moat::test {

struct HttpResult {
  int status = 0;
  std::string body;
  std::string contentType;
  std::string upgrade;                         // the Upgrade header, if any
  std::string retryAfter;                      // the Retry-After header, if any
  std::string mcpSessionId;                    // the Mcp-Session-Id header, if any
  bool keepAlive = false;                      // the server keeps the connection open after it
  std::map<std::string, std::string> headers;  // every header, by its lowercase name
};

// A connected stream socket to `path` (owned by the caller), or -1.
int connectUnix(const std::string& path);
// The same to 127.0.0.1:port over TCP.
int connectLoopbackTcp(int port);

// One keep-alive HTTP connection to moatd's unix socket: requests go one
// after another on the same connection (request throws once it is closed).
class HttpConnection {
 public:
  explicit HttpConnection(const std::string& socketPath);
  ~HttpConnection();
  HttpResult request(const std::string& method, const std::string& target, const std::string& token,
                     const std::string& body = "");
  // Sends `bytes` as they are (e.g. a request head without its body) and
  // reads one answer. Both throw when no answer starts within 10 s.
  HttpResult raw(const std::string& bytes);

 private:
  HttpResult readAnswer();
  struct State;
  std::unique_ptr<State> state_;
};

// A streamed answer (chunked NDJSON) read line by line, as a follower does.
class EventStream {
 public:
  EventStream(int fd, int status, std::string pending) : fd_(fd), status_(status), raw_(std::move(pending)) {}
  EventStream(EventStream&& other) noexcept;
  ~EventStream();
  int status() const { return status_; }
  // The next line of the body; false at the end of the body, on a closed
  // connection, or when nothing arrives within timeoutMs.
  bool nextLine(std::string& line, int timeoutMs = 20000);
  void close();  // the client goes away (detach)

 private:
  bool fill(int timeoutMs);
  int fd_;
  int status_;
  std::string raw_;      // undecoded bytes from the socket
  std::string decoded_;  // body bytes not yet returned as lines
  bool ended_ = false;
};

class Moatd {
 public:
  // Starts build/bin/moatd on a fresh state directory with `extraArgs`;
  // waits until it serves.
  explicit Moatd(std::vector<std::string> extraArgs = {});
  // ... and `extraEnv` ("NAME=VALUE") beside MOAT_STORAGE_GB.
  Moatd(std::vector<std::string> extraArgs, std::vector<std::string> extraEnv);
  ~Moatd();
  void stop();   // SIGTERM and wait
  void kill9();  // SIGKILL and wait
  // After a signal sent by the test: its wait status (as waitpid gives it).
  int waitExit();
  void restart();  // start again on the same state directory

  HttpResult request(const std::string& method, const std::string& target, const std::string& body = "",
                     bool withToken = true, const std::map<std::string, std::string>& headers = {});
  // GET target and keep reading: the follow endpoints. `headers` replace
  // nothing: they are added (Last-Event-ID, another Authorization with
  // withToken false).
  EventStream stream(const std::string& target, const std::map<std::string, std::string>& headers = {},
                     bool withToken = true);
  // Opens a WebSocket on target: the connected fd (owned by the caller), the
  // HTTP status (101 on success) and the bytes read past the handshake (the
  // error body when refused).
  struct Upgrade {
    int fd = -1;
    int status = 0;
    std::string rest;
  };
  Upgrade websocket(const std::string& target, bool withToken = true,
                    const std::map<std::string, std::string>& headers = {});
  const std::string& stateDir() const { return stateDir_; }
  const std::string& token() const { return token_; }
  std::string socketPath() const { return stateDir_ + "/moatd.sock"; }
  pid_t pid() const { return pid_; }
  std::string log();

 private:
  void start();
  // Ends what a moatd left (its spawner, storage pool, egress namespace)
  // and removes the state directory and the log.
  void removeState();
  std::string stateDir_;
  std::string token_;
  std::string logPath_;
  std::vector<std::string> extraArgs_;
  std::vector<std::string> extraEnv_;
  pid_t pid_ = -1;
};

}  // namespace moat::test
