#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

// A real moatd started by a test, and an HTTP client for it (over its unix
// socket, as the CLI does by default).
namespace moat::test {

struct HttpResult {
  int status = 0;
  std::string body;
  std::string contentType;
};

class Moatd {
 public:
  // Starts build/bin/moatd on a fresh state directory with `extraArgs`;
  // waits until it serves.
  explicit Moatd(std::vector<std::string> extraArgs = {});
  ~Moatd();
  void stop();     // SIGTERM and wait
  void kill9();    // SIGKILL and wait
  void waitExit(); // after a signal sent by the test
  void restart();  // start again on the same state directory

  HttpResult request(const std::string& method, const std::string& target,
                     const std::string& body = "", bool withToken = true,
                     const std::map<std::string, std::string>& headers = {});
  const std::string& stateDir() const { return stateDir_; }
  const std::string& token() const { return token_; }
  std::string socketPath() const { return stateDir_ + "/moatd.sock"; }
  pid_t pid() const { return pid_; }
  std::string log();

 private:
  void start();
  std::string stateDir_;
  std::string token_;
  std::string logPath_;
  std::vector<std::string> extraArgs_;
  pid_t pid_ = -1;
};

}  // namespace moat::test
