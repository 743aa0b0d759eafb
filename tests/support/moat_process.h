#pragma once

#include <map>
#include <string>
#include <vector>

// Test helpers: run the built binaries as a user would and collect what they
// print. MOAT_BIN_DIR is set by CMake to build/bin.
namespace moat::test {

struct ProcessResult {
  int exitCode = -1;  // 128+N when killed by signal N
  std::string out;
  std::string err;
};

// Runs argv (argv[0] is a path) with `input` on stdin and the given extra
// environment variables on top of a minimal one; waits for it.
ProcessResult runProcess(const std::vector<std::string>& argv, const std::string& input = "",
                         const std::map<std::string, std::string>& env = {});

// A process the test talks to while it runs: writes to its stdin, reads its
// stdout line by line, signals it. Killed and reaped if the test leaves first.
class RunningProcess {
 public:
  RunningProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~RunningProcess();
  RunningProcess(const RunningProcess&) = delete;
  RunningProcess& operator=(const RunningProcess&) = delete;

  int pid() const { return pid_; }
  bool write(const std::string& data);
  void closeInput();
  // The next line of stdout with its newline; what there is (maybe "") when
  // stdout ends or nothing completes a line within timeoutMs.
  std::string readLine(int timeoutMs = 20000);
  // True when the process ended within timeoutMs (then wait() returns at once).
  bool exitsWithin(int timeoutMs);
  // Writes `data` to stdin while output is read (pump), then closes it.
  void feed(std::string data);
  // Closes stdin, reads the rest of stdout and stderr, reaps: what readLine
  // has not returned yet.
  ProcessResult wait();
  // Reads stdout and stderr (and writes what feed() holds) until both end,
  // then reaps, without a bound: runProcess.
  ProcessResult collect();

 private:
  void pump(int timeoutMs);  // one poll round: writes input_, reads what is ready
  int pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1, pidfd_ = -1;
  std::string input_;  // fed; written up to inputWritten_
  size_t inputWritten_ = 0;
  std::string outBuffer_, errBuffer_;
  int status_ = -1;  // wait status once reaped
};

// Runs build/bin/moat with args, with MOAT_STATE pointing at testStateDir().
ProcessResult runMoat(const std::vector<std::string>& args, const std::string& input = "",
                      const std::map<std::string, std::string>& env = {});

std::string binDir();
// A state directory shared by the tests of one test binary; its storage pool
// is unmounted and removed by StateDirCleanup (registered by linking
// moat_test_support's main).
const std::string& testStateDir();

// True when running as root; tests that need root call GTEST_SKIP with the reason.
bool isRoot();

// Where this host mounts cgroup2 ("" when nowhere).
std::string cgroup2Mount();

// What /proc/PID/status says for `key` ("" when the process or the key is
// not there).
std::string statusOf(pid_t pid, const std::string& key);

}  // namespace moat::test

#define MOAT_REQUIRE_ROOT()                                      \
  do {                                                           \
    if (!::moat::test::isRoot())                                 \
      GTEST_SKIP() << "needs root: creates namespaces, cgroups " \
                      "and mounts (CI runs as root)";            \
  } while (0)
