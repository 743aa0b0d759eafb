#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "init/protocol.h"

namespace moat::manager {

struct ExecRequest {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // KEY=VALUE, the whole environment
  std::string cwd = "/workspace";
  std::string stdinData;
  bool withStdin = false;
  uint64_t timeoutMs = 0;
  uint64_t outputLimit = 0;
};

struct ExecResult {
  bool started = false;      // false: spawnErrno/spawnStage say why
  int spawnErrno = 0;
  std::string spawnStage;
  int exitCode = -1;
  int signal = 0;
  bool timedOut = false;
  std::string out;
  std::string err;
  bool outTruncated = false;
  bool errTruncated = false;
  uint64_t durationUs = 0;
};

// moatd's end of one environment's guest protocol connection: a reader
// thread dispatches moat-init's frames to the requests waiting for them, so
// many execs and file operations can be in flight at once.
class InitConnection {
 public:
  // onClosed runs (on the reader thread) when moat-init goes away.
  InitConnection(UniqueFd control, std::function<void()> onClosed);
  ~InitConnection();
  InitConnection(const InitConnection&) = delete;
  InitConnection& operator=(const InitConnection&) = delete;

  // Blocks until the command ends or the environment does.
  Result<ExecResult> exec(const ExecRequest& request);
  Result<init::FileResult> file(init::FileRequest request);
  bool closed();
  // Drops the connection: waiting requests end with "gone" (shutdown).
  void close();

 private:
  struct Pending {
    ExecResult result;
    init::FileResult fileResult;
    bool done = false;
  };
  void readLoop();
  void dispatch(const init::Frame& frame);
  Status send(init::MsgType type, const std::string& payload);
  Result<Pending> wait(uint32_t key, uint64_t timeoutMs);

  UniqueFd control_;
  std::function<void()> onClosed_;
  std::mutex writeMutex_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<uint32_t, Pending> pending_;  // exec ids and file tags share one space
  uint32_t nextKey_ = 1;
  bool closed_ = false;
  std::thread reader_;
};

}  // namespace moat::manager
