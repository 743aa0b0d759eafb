// Drives the real moat-init binary as an ordinary child process (not pid 1)
// over a socketpair, the way a client does.
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "init/protocol.h"
#include "moat_process.h"
#include "os/file.h"

namespace moat::init {
namespace {

constexpr int kControlFd = 7;          // an fd number other than 3: --control-fd is honoured
constexpr int kDefaultWaitMs = 10000;  // generous: only a hang hits it

int64_t nowMs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Polls `done` until it returns true or `timeoutMs` passes.
bool waitFor(const std::function<bool()>& done, int timeoutMs) {
  int64_t deadline = nowMs() + timeoutMs;
  for (;;) {
    if (done()) return true;
    if (nowMs() >= deadline) return false;
    ::usleep(2000);
  }
}

bool pidGone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// True once `pid` has exited: gone, or a zombie waiting for whoever inherited
// it (an orphan's reaper is outside the test's control).
bool deadOrZombie(pid_t pid) {
  if (pidGone(pid)) return true;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  auto paren = stat.rfind(')');
  if (!in.good() && stat.empty()) return true;
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// What one spawned command produced.
struct Outcome {
  bool spawned = false;
  Spawned spawnedMsg;
  bool failed = false;
  SpawnFailed failure;
  bool exited = false;
  Exited exit;
  std::string out;
  std::string err;
  uint64_t stdinTaken = 0;     // the last StdinTaken
  std::vector<MsgType> order;  // message types seen for this id, in order
  std::string problem;         // protocol trouble, timeout, eof
  bool finished() const { return failed || exited || !problem.empty(); }
};

class InitSupervisor : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::signal(SIGPIPE, SIG_IGN); }

  void SetUp() override {
    std::string bin = test::binDir() + "/moat-init";
    ASSERT_EQ(::access(bin.c_str(), X_OK), 0) << bin << " is not built";
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    std::string fdArg = std::to_string(kControlFd);
    const char* argv[] = {"moat-init", "--control-fd", fdArg.c_str(), nullptr};
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (sv[1] == kControlFd) {
        ::fcntl(kControlFd, F_SETFD, 0);
      } else if (::dup2(sv[1], kControlFd) < 0) {
        ::_exit(120);
      }
      ::execv(bin.c_str(), const_cast<char* const*>(argv));
      ::_exit(121);
    }
    ::close(sv[1]);
    fd_ = sv[0];
    initPid_ = pid;
    auto hello = next(kDefaultWaitMs);
    ASSERT_TRUE(hello.ok()) << hello.error().message();
    helloFrame_ = hello.value();
  }

  void TearDown() override {
    closeControl();
    if (initPid_ > 0) {
      int status = 0;
      bool exited = waitFor([&] { return ::waitpid(initPid_, &status, WNOHANG) == initPid_; }, 5000);
      if (!exited) {
        ::kill(initPid_, SIGKILL);
        ::waitpid(initPid_, &status, 0);
        ADD_FAILURE() << "moat-init did not exit after its control socket closed";
      }
      initPid_ = -1;
    }
    for (pid_t pgid : cleanupGroups_) ::kill(-pgid, SIGKILL);
    if (!tmp_.empty()) (void)os::removeTree(tmp_);
  }

  void closeControl() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Waits for moat-init to exit; returns its wait status or -1 on timeout.
  int waitInitExit(int timeoutMs) {
    int status = 0;
    bool exited = waitFor([&] { return ::waitpid(initPid_, &status, WNOHANG) == initPid_; }, timeoutMs);
    if (!exited) return -1;
    initPid_ = -1;
    return status;
  }

  Status send(MsgType type, const std::string& payload) { return writeFrame(fd_, type, payload); }

  // The next frame, or an error on EOF, corruption or after timeoutMs.
  Result<Frame> next(int timeoutMs) {
    int64_t deadline = nowMs() + timeoutMs;
    Frame frame;
    for (;;) {
      MOAT_ASSIGN(bool have, reader_.next(frame));
      if (have) return frame;
      int64_t left = deadline - nowMs();
      if (left <= 0) return Error::make(Code::kTimeout, "no frame from moat-init in time");
      pollfd p{fd_, POLLIN, 0};
      int ready = ::poll(&p, 1, static_cast<int>(left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      char buf[65536];
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Error::fromErrno("read control");
      if (n == 0) return Error::make(Code::kEof, "moat-init closed the connection");
      reader_.feed(buf, static_cast<size_t>(n));
    }
  }

  SpawnRequest request(uint32_t id, std::vector<std::string> argv) {
    SpawnRequest req;
    req.id = id;
    req.argv = std::move(argv);
    req.env = {"PATH=/usr/local/bin:/usr/bin:/bin"};
    req.cwd = "/";
    req.uid = ::getuid();
    req.gid = ::getgid();
    return req;
  }

  // Reads frames into `run` (for `id`) until `until` holds or it finishes.
  void pump(Outcome& run, uint32_t id, const std::function<bool(const Outcome&)>& until,
            int timeoutMs = kDefaultWaitMs) {
    int64_t deadline = nowMs() + timeoutMs;
    while (!until(run) && !run.finished()) {
      int64_t left = deadline - nowMs();
      auto frame = next(static_cast<int>(std::max<int64_t>(left, 0)));
      if (!frame.ok()) {
        run.problem = frame.error().message();
        return;
      }
      handle(run, id, frame.value());
    }
  }

  void handle(Outcome& run, uint32_t id, const Frame& f) {
    switch (f.type) {
      case MsgType::kSpawned: {
        auto m = Spawned::decode(f.payload);
        if (!m.ok()) run.problem = "bad Spawned: " + m.error().message();
        if (!m.ok() || m->id != id) return;
        run.order.push_back(f.type);
        run.spawned = true;
        run.spawnedMsg = m.value();
        cleanupGroups_.push_back(static_cast<pid_t>(m->pid));
        return;
      }
      case MsgType::kSpawnFailed: {
        auto m = SpawnFailed::decode(f.payload);
        if (!m.ok()) run.problem = "bad SpawnFailed: " + m.error().message();
        if (!m.ok() || m->id != id) return;
        run.order.push_back(f.type);
        run.failed = true;
        run.failure = m.value();
        return;
      }
      case MsgType::kOutput: {
        auto m = Output::decode(f.payload);
        if (!m.ok()) run.problem = "bad Output: " + m.error().message();
        if (!m.ok() || m->id != id) return;
        run.order.push_back(f.type);
        (m->stream == Stream::kStdout ? run.out : run.err) += m->data;
        return;
      }
      case MsgType::kExited: {
        auto m = Exited::decode(f.payload);
        if (!m.ok()) run.problem = "bad Exited: " + m.error().message();
        if (!m.ok() || m->id != id) return;
        run.order.push_back(f.type);
        run.exited = true;
        run.exit = m.value();
        return;
      }
      case MsgType::kStdinTaken: {
        auto m = StdinTaken::decode(f.payload);
        if (!m.ok()) run.problem = "bad StdinTaken: " + m.error().message();
        if (!m.ok() || m->id != id) return;
        if (m->total < run.stdinTaken) run.problem = "StdinTaken went back";
        run.stdinTaken = m->total;
        return;
      }
      case MsgType::kProtocolError: {
        Decoder d(f.payload);
        auto msg = d.bytes();
        run.problem = "protocol error from moat-init: " + (msg.ok() ? msg.value() : "?");
        return;
      }
      default:
        run.problem = "unexpected frame type " + std::to_string(static_cast<int>(f.type));
    }
  }

  // Spawns and collects everything until Exited or SpawnFailed.
  Outcome runToEnd(const SpawnRequest& req, int timeoutMs = kDefaultWaitMs) {
    Outcome run;
    Status s = send(MsgType::kSpawn, req.encode());
    if (!s.ok()) {
      run.problem = s.error().message();
      return run;
    }
    pump(
        run, req.id, [](const Outcome&) { return false; }, timeoutMs);
    return run;
  }

  // Writes `frames` in one write (so moat-init handles them together), then
  // reads until every id in `ids` has finished or kDefaultWaitMs passes.
  // Trouble (a frame for another id, none in time) goes to `problem`.
  std::map<uint32_t, Outcome> sendAndCollect(const std::string& frames, const std::set<uint32_t>& ids,
                                             std::string& problem) {
    std::map<uint32_t, Outcome> runs;
    if (::write(fd_, frames.data(), frames.size()) != static_cast<ssize_t>(frames.size())) {
      problem = "short write to moat-init";
      return runs;
    }
    size_t finished = 0;
    int64_t deadline = nowMs() + kDefaultWaitMs;
    while (finished < ids.size()) {
      auto frame = next(static_cast<int>(std::max<int64_t>(deadline - nowMs(), 0)));
      if (!frame.ok()) {
        problem = frame.error().message() + " after " + std::to_string(finished) + " of " + std::to_string(ids.size()) +
                  " ended";
        return runs;
      }
      auto id = Decoder(frame->payload).u32();
      if (!id.ok() || !ids.count(id.value())) {
        problem = "a frame for no command of this test";
        return runs;
      }
      Outcome& run = runs[id.value()];
      handle(run, id.value(), frame.value());
      if (run.finished()) ++finished;
    }
    return runs;
  }

  Result<FileResult> file(const FileRequest& req) {
    MOAT_TRY(send(MsgType::kFile, req.encode()));
    MOAT_ASSIGN(Frame f, next(kDefaultWaitMs));
    if (f.type != MsgType::kFileResult) {
      return Error::make(Code::kInternal, "expected FileResult, got type " + std::to_string(int(f.type)));
    }
    MOAT_ASSIGN(FileResult r, FileResult::decode(f.payload));
    if (r.tag != req.tag) return Error::make(Code::kInternal, "FileResult for another tag");
    return r;
  }

  const std::string& tmpDir() {
    if (tmp_.empty()) {
      char tmpl[] = "/tmp/moat-supervisor-test-XXXXXX";
      if (::mkdtemp(tmpl) != nullptr) tmp_ = tmpl;
    }
    return tmp_;
  }

  int fd_ = -1;
  pid_t initPid_ = -1;
  Frame helloFrame_{};
  FrameReader reader_;
  std::vector<pid_t> cleanupGroups_;
  std::string tmp_;
};

#define EXPECT_CLEAN(run) EXPECT_EQ((run).problem, "") << "moat-init conversation failed"

TEST_F(InitSupervisor, HelloComesFirst) {
  ASSERT_EQ(helloFrame_.type, MsgType::kHello);
  auto hello = Hello::decode(helloFrame_.payload);
  ASSERT_TRUE(hello.ok()) << hello.error().message();
  EXPECT_EQ(hello->version, 8u);
  EXPECT_EQ(hello->version, kProtocolVersion);
  EXPECT_EQ(hello->initPid, static_cast<uint32_t>(initPid_));
}

TEST_F(InitSupervisor, EchoSpawnedOutputExited) {
  Outcome run = runToEnd(request(1, {"/bin/echo", "hi"}));
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.spawned);
  EXPECT_GT(run.spawnedMsg.pid, 0u);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "hi\n");
  EXPECT_EQ(run.err, "");
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(run.exit.signal, 0);
  EXPECT_FALSE(run.exit.timedOut);
  EXPECT_EQ(run.exit.stdoutBytes, 3u);
  EXPECT_EQ(run.exit.stderrBytes, 0u);
  EXPECT_FALSE(run.exit.stdoutTruncated);
  EXPECT_GT(run.exit.durationUs, 0u);
  ASSERT_EQ(run.order.size(), 3u);
  EXPECT_EQ(run.order[0], MsgType::kSpawned);
  EXPECT_EQ(run.order[1], MsgType::kOutput);
  EXPECT_EQ(run.order[2], MsgType::kExited);
}

TEST_F(InitSupervisor, ExitCodesAndSignals) {
  Outcome seven = runToEnd(request(1, {"/bin/sh", "-c", "exit 7"}));
  EXPECT_CLEAN(seven);
  ASSERT_TRUE(seven.exited);
  EXPECT_EQ(seven.exit.exitCode, 7);
  EXPECT_EQ(seven.exit.signal, 0);

  Outcome killed = runToEnd(request(2, {"/bin/sh", "-c", "kill -9 $$"}));
  EXPECT_CLEAN(killed);
  ASSERT_TRUE(killed.exited);
  EXPECT_EQ(killed.exit.exitCode, -1);
  EXPECT_EQ(killed.exit.signal, SIGKILL);
  EXPECT_FALSE(killed.exit.timedOut);
}

TEST_F(InitSupervisor, StderrIsSeparate) {
  Outcome run = runToEnd(request(3, {"/bin/sh", "-c", "echo out; echo error >&2; echo more"}));
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "out\nmore\n");
  EXPECT_EQ(run.err, "error\n");
  EXPECT_EQ(run.exit.stdoutBytes, 9u);
  EXPECT_EQ(run.exit.stderrBytes, 6u);
}

TEST_F(InitSupervisor, StdinIsDevNullByDefault) {
  Outcome run = runToEnd(request(4, {"/bin/cat"}));
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.exit.exitCode, 0);
}

TEST_F(InitSupervisor, StdinRoundTripThroughCat) {
  SpawnRequest req = request(5, {"/bin/cat"});
  req.stdinPipe = true;
  ASSERT_TRUE(send(MsgType::kSpawn, req.encode()).ok());
  Outcome run;
  pump(run, 5, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(run.spawned) << run.problem;
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{5, "hello\n"}.encode()).ok());
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{5, "world\n"}.encode()).ok());
  // cat echoes before stdin closes: the pipe is live, not buffered to the end.
  pump(run, 5, [](const Outcome& r) { return r.out.size() >= 12; });
  EXPECT_EQ(run.out, "hello\nworld\n");
  EXPECT_FALSE(run.exited) << "cat exited before stdin was closed";
  ASSERT_TRUE(send(MsgType::kCloseStdin, ProcessRef{5}.encode()).ok());
  pump(run, 5, [](const Outcome&) { return false; });
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(run.out, "hello\nworld\n");
}

TEST_F(InitSupervisor, LargeStdinIsBufferedAndDelivered) {
  SpawnRequest req = request(6, {"/bin/sh", "-c", "wc -c"});
  req.stdinPipe = true;
  ASSERT_TRUE(send(MsgType::kSpawn, req.encode()).ok());
  // More than a pipe buffer: moat-init must keep the rest until cat drains it.
  std::string chunk(64 * 1024, 'z');
  std::thread writer([&] {
    for (int i = 0; i < 16; ++i) (void)send(MsgType::kStdin, StdinData{6, chunk}.encode());
    (void)send(MsgType::kCloseStdin, ProcessRef{6}.encode());
  });
  Outcome run;
  pump(run, 6, [](const Outcome&) { return false; });
  writer.join();
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, std::to_string(16 * 64 * 1024) + "\n");
}

// moat-init says how much input it took off the connection: a client
// bounds what it sends beyond that, so moat-init holds little of it.
TEST_F(InitSupervisor, StdinTakenSaysWhatLeftMoatInit) {
  // More than a pipe holds: the first write is a partial one.
  const std::string chunk(100000, 'q');
  constexpr uint64_t kSent = 4 * 100000;
  // A command that does not read: what it took is what the pipe holds.
  SpawnRequest idle = request(20, {"/bin/sleep", "60"});
  idle.stdinPipe = true;
  ASSERT_TRUE(send(MsgType::kSpawn, idle.encode()).ok());
  Outcome held;
  pump(held, 20, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(held.spawned) << held.problem;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(send(MsgType::kStdin, StdinData{20, chunk}.encode()).ok());
  pump(held, 20, [](const Outcome& r) { return r.stdinTaken > 0; });
  EXPECT_GT(held.stdinTaken, 0u) << held.problem;
  EXPECT_LT(held.stdinTaken, kSent) << "all taken by a command that reads nothing";
  held.problem.clear();

  // One that reads everything: all of it, said before its end.
  SpawnRequest reader = request(21, {"/usr/bin/wc", "-c"});
  reader.stdinPipe = true;
  ASSERT_TRUE(send(MsgType::kSpawn, reader.encode()).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(send(MsgType::kStdin, StdinData{21, chunk}.encode()).ok());
  ASSERT_TRUE(send(MsgType::kCloseStdin, ProcessRef{21}.encode()).ok());
  Outcome read;
  pump(read, 21, [](const Outcome&) { return false; });
  EXPECT_CLEAN(read);
  ASSERT_TRUE(read.exited);
  EXPECT_EQ(read.out, std::to_string(kSent) + "\n");
  EXPECT_EQ(read.stdinTaken, kSent);

  // One that closed its stdin: what comes is dropped (the write fails), and taken.
  SpawnRequest closer = request(22, {"/bin/sh", "-c", "exec 0<&-; echo closed; exec sleep 60"});
  closer.stdinPipe = true;
  ASSERT_TRUE(send(MsgType::kSpawn, closer.encode()).ok());
  Outcome dropped;
  pump(dropped, 22, [](const Outcome& r) { return r.out == "closed\n"; });
  ASSERT_EQ(dropped.out, "closed\n") << dropped.problem;
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{22, "nobody reads this"}.encode()).ok());
  pump(dropped, 22, [](const Outcome& r) { return r.stdinTaken == 17; });
  EXPECT_EQ(dropped.stdinTaken, 17u) << dropped.problem;
  dropped.problem.clear();
  // Later input goes the same way.
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{22, "nor this"}.encode()).ok());
  pump(dropped, 22, [](const Outcome& r) { return r.stdinTaken == 25; });
  EXPECT_EQ(dropped.stdinTaken, 25u) << dropped.problem;
}

TEST_F(InitSupervisor, SignalRequestTerminates) {
  ASSERT_TRUE(send(MsgType::kSpawn, request(7, {"/bin/sleep", "30"}).encode()).ok());
  Outcome run;
  pump(run, 7, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(run.spawned) << run.problem;
  ASSERT_TRUE(send(MsgType::kSignal, SignalRequest{7, SIGTERM, true}.encode()).ok());
  pump(run, 7, [](const Outcome&) { return false; });
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.exit.signal, 15);
  EXPECT_EQ(run.exit.exitCode, -1);
  EXPECT_FALSE(run.exit.timedOut);
}

TEST_F(InitSupervisor, SignalForUnknownIdIsIgnored) {
  ASSERT_TRUE(send(MsgType::kSignal, SignalRequest{999, SIGTERM, true}.encode()).ok());
  Outcome run = runToEnd(request(8, {"/bin/echo", "still here"}));
  EXPECT_CLEAN(run);
  EXPECT_EQ(run.out, "still here\n");
}

TEST_F(InitSupervisor, TimeoutKills) {
  SpawnRequest req = request(9, {"/bin/sleep", "30"});
  req.timeoutMs = 200;
  int64_t start = nowMs();
  Outcome run = runToEnd(req, 15000);
  int64_t took = nowMs() - start;
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited) << "no Exited within 15 s";
  EXPECT_TRUE(run.exit.timedOut);
  EXPECT_EQ(run.exit.signal, SIGKILL);
  EXPECT_EQ(run.exit.exitCode, -1);
  EXPECT_LT(took, 10000) << "the 200 ms timeout took " << took << " ms";
  EXPECT_GE(run.exit.durationUs, 200000u);
}

TEST_F(InitSupervisor, TimeoutKillsTheWholeGroup) {
  // The shell's background child must die with it when the deadline hits.
  SpawnRequest req = request(10, {"/bin/sh", "-c", "sleep 30 & echo $!; wait; echo never"});
  req.timeoutMs = 300;
  Outcome run = runToEnd(req, 15000);
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_TRUE(run.exit.timedOut);
  ASSERT_FALSE(run.out.empty());
  EXPECT_EQ(run.out.find("never"), std::string::npos);
  pid_t grandchild = static_cast<pid_t>(std::stol(run.out));
  ASSERT_GT(grandchild, 1);
  EXPECT_TRUE(waitFor([&] { return deadOrZombie(grandchild); }, 5000))
      << "the shell's background sleep " << grandchild << " survived the timeout";
}

TEST_F(InitSupervisor, OutputLimitTruncates) {
  SpawnRequest req = request(11, {"/bin/sh", "-c", "head -c 1000 /dev/zero | tr '\\0' a"});
  req.outputLimit = 10;
  Outcome run = runToEnd(req);
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, std::string(10, 'a'));
  EXPECT_EQ(run.exit.stdoutBytes, 1000u);
  EXPECT_TRUE(run.exit.stdoutTruncated);
  EXPECT_FALSE(run.exit.stderrTruncated);
  EXPECT_EQ(run.exit.exitCode, 0);
}

TEST_F(InitSupervisor, OutputLimitPerStream) {
  SpawnRequest req = request(12, {"/bin/sh", "-c", "printf 12345; printf abcdefghijkl >&2"});
  req.outputLimit = 5;
  Outcome run = runToEnd(req);
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "12345");
  EXPECT_FALSE(run.exit.stdoutTruncated) << "exactly the limit is not truncation";
  EXPECT_EQ(run.err, "abcde");
  EXPECT_TRUE(run.exit.stderrTruncated);
  EXPECT_EQ(run.exit.stderrBytes, 12u);
}

TEST_F(InitSupervisor, OutputCreditHoldsOutputInThePipeAndExitedWaitsForIt) {
  // 150,000 bytes: with 100,000 forwarded, the rest fits the pipe and head
  // exits while it waits there.
  SpawnRequest req = request(13, {"/usr/bin/head", "-c", "150000", "/dev/zero"});
  ASSERT_TRUE(writeFrames(fd_, encodeFrame(MsgType::kSpawn, req.encode()) +
                                   encodeFrame(MsgType::kOutputCredit, OutputCredit{13, 100000}.encode()))
                  .ok());
  Outcome run;
  pump(run, 13, [](const Outcome& o) { return o.out.size() >= 100000; });
  ASSERT_TRUE(run.spawned) << run.problem;
  EXPECT_EQ(run.out.size(), 100000u) << "exactly up to the limit";
  // head is gone (reaped), but its Exited waits for what its pipe still holds.
  ASSERT_TRUE(waitFor([&] { return pidGone(static_cast<pid_t>(run.spawnedMsg.pid)); }, kDefaultWaitMs));
  pump(
      run, 13, [](const Outcome& o) { return o.exited; }, 200);
  EXPECT_FALSE(run.exited) << "Exited before the output it still held";
  EXPECT_EQ(run.out.size(), 100000u);
  run.problem.clear();  // the short pump's timeout
  // A lower limit changes nothing; a higher one lets the rest through.
  ASSERT_TRUE(send(MsgType::kOutputCredit, OutputCredit{13, 50}.encode()).ok());
  ASSERT_TRUE(send(MsgType::kOutputCredit, OutputCredit{13, 150000}.encode()).ok());
  pump(run, 13, [](const Outcome&) { return false; });
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, std::string(150000, '\0'));
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(run.order.back(), MsgType::kExited) << "after all its output";
}

TEST_F(InitSupervisor, CommandNotFound) {
  Outcome run = runToEnd(request(13, {"moat-definitely-not-a-command"}));
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.failed);
  EXPECT_FALSE(run.spawned);
  EXPECT_EQ(run.failure.stage, "exec");
  EXPECT_EQ(run.failure.err, ENOENT);

  Outcome abs = runToEnd(request(14, {"/nonexistent/moat-cmd"}));
  ASSERT_TRUE(abs.failed);
  EXPECT_EQ(abs.failure.stage, "exec");
  EXPECT_EQ(abs.failure.err, ENOENT);
}

TEST_F(InitSupervisor, MissingCwd) {
  SpawnRequest req = request(15, {"/bin/true"});
  req.cwd = "/nonexistent/moat-cwd";
  Outcome run = runToEnd(req);
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.failed);
  EXPECT_EQ(run.failure.stage, "chdir");
  EXPECT_EQ(run.failure.err, ENOENT);
}

TEST_F(InitSupervisor, CwdIsApplied) {
  SpawnRequest req = request(16, {"/bin/pwd"});
  req.cwd = "/usr/bin";
  Outcome run = runToEnd(req);
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "/usr/bin\n");
}

TEST_F(InitSupervisor, PathLookupUsesTheRequestEnvironment) {
  std::string dir = tmpDir();
  ASSERT_FALSE(dir.empty());
  std::string tool = dir + "/moat-test-tool";
  {
    std::ofstream out(tool);
    out << "#!/bin/sh\necho tool-ran \"$@\"\n";
  }
  ASSERT_EQ(::chmod(tool.c_str(), 0755), 0);
  std::string noexec = dir + "/moat-noexec";
  {
    std::ofstream out(noexec);
    out << "#!/bin/sh\n";
  }
  ASSERT_EQ(::chmod(noexec.c_str(), 0644), 0);

  SpawnRequest req = request(17, {"moat-test-tool", "x"});
  req.env = {"PATH=/nonexistent-dir:" + dir};
  Outcome run = runToEnd(req);
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited) << (run.failed ? run.failure.stage : "");
  EXPECT_EQ(run.out, "tool-ran x\n");

  // Not in the request's PATH: not found, even though the file exists.
  SpawnRequest other = request(18, {"moat-test-tool"});
  other.env = {"PATH=/usr/bin:/bin"};
  Outcome miss = runToEnd(other);
  ASSERT_TRUE(miss.failed);
  EXPECT_EQ(miss.failure.err, ENOENT);

  // Found but not executable: EACCES.
  SpawnRequest denied = request(19, {"moat-noexec"});
  denied.env = {"PATH=" + dir};
  Outcome acc = runToEnd(denied);
  ASSERT_TRUE(acc.failed);
  EXPECT_EQ(acc.failure.stage, "exec");
  EXPECT_EQ(acc.failure.err, EACCES);
}

TEST_F(InitSupervisor, EnvironmentIsExactlyTheRequest) {
  ::setenv("MOAT_SUPERVISOR_TEST_HOST_VAR", "must-not-leak", 1);
  SpawnRequest req = request(20, {"/usr/bin/env"});
  req.env = {"A=1", "B=two words", "PATH=/bin"};
  Outcome run = runToEnd(req);
  ::unsetenv("MOAT_SUPERVISOR_TEST_HOST_VAR");
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "A=1\nB=two words\nPATH=/bin\n");

  SpawnRequest empty = request(21, {"/usr/bin/env"});
  empty.env.clear();
  Outcome none = runToEnd(empty);
  ASSERT_TRUE(none.exited);
  EXPECT_EQ(none.out, "");
}

TEST_F(InitSupervisor, BackgroundChildDoesNotDelayExited) {
  // The background sleep keeps stdout open for 30 s; Exited for the shell
  // must come right after the shell exits.
  int64_t start = nowMs();
  Outcome run = runToEnd(request(22, {"/bin/sh", "-c", "sleep 30 & echo started"}), 20000);
  int64_t took = nowMs() - start;
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(run.out, "started\n");
  EXPECT_LT(took, 10000) << "Exited waited for the background child";
  // TearDown kills the shell's process group (the background sleep).
}

TEST_F(InitSupervisor, TwoProcessesAtOnce) {
  SpawnRequest slow = request(30, {"/bin/sh", "-c", "read x; echo got $x"});
  slow.stdinPipe = true;
  ASSERT_TRUE(send(MsgType::kSpawn, slow.encode()).ok());
  Outcome a;
  pump(a, 30, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(a.spawned) << a.problem;
  // A second process runs to completion while the first waits on stdin.
  Outcome b = runToEnd(request(31, {"/bin/echo", "second"}));
  EXPECT_CLEAN(b);
  EXPECT_EQ(b.out, "second\n");
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{30, "first\n"}.encode()).ok());
  pump(a, 30, [](const Outcome&) { return false; });
  EXPECT_CLEAN(a);
  ASSERT_TRUE(a.exited);
  EXPECT_EQ(a.out, "got first\n");
}

TEST_F(InitSupervisor, DuplicateIdIsRefused) {
  ASSERT_TRUE(send(MsgType::kSpawn, request(40, {"/bin/sleep", "30"}).encode()).ok());
  Outcome first;
  pump(first, 40, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(first.spawned) << first.problem;
  Outcome dup = runToEnd(request(40, {"/bin/true"}));
  ASSERT_TRUE(dup.failed);
  EXPECT_EQ(dup.failure.err, EEXIST);
  EXPECT_EQ(dup.failure.stage, "id in use");
}

// Launches run on threads of their own; a command that exits before its
// launch is reported must still get Spawned, then its output, then Exited
// with its status. Sent in one write, so they are launched while others end.
TEST_F(InitSupervisor, ManyCommandsAtOnceEachGetSpawnedThenExited) {
  constexpr uint32_t kCount = 64;
  std::string burst;
  std::set<uint32_t> ids;
  for (uint32_t id = 100; id < 100 + kCount; ++id) {
    ids.insert(id);
    SpawnRequest req =
        id % 2 ? request(id, {"/bin/true"})
               : request(id, {"/bin/sh", "-c", "echo " + std::to_string(id) + "; exit " + std::to_string(id % 7)});
    burst += encodeFrame(MsgType::kSpawn, req.encode());
  }
  std::string problem;
  auto runs = sendAndCollect(burst, ids, problem);
  ASSERT_EQ(problem, "") << "some commands never reported their end";
  for (auto& [id, run] : runs) {
    EXPECT_CLEAN(run);
    std::vector<MsgType> expected{MsgType::kSpawned, MsgType::kExited};
    if (id % 2 == 0) expected.insert(expected.begin() + 1, MsgType::kOutput);
    EXPECT_EQ(run.order, expected) << "id " << id;
    EXPECT_EQ(run.out, id % 2 ? "" : std::to_string(id) + "\n") << "id " << id;
    EXPECT_EQ(run.exit.exitCode, id % 2 ? 0 : static_cast<int>(id % 7)) << "id " << id;
  }
}

// A signal or a deadline that arrives while the command is still being
// launched is not lost, and never goes to a pid the command does not have yet.
TEST_F(InitSupervisor, SignalAndTimeoutDuringTheLaunchReachTheCommand) {
  std::string both = encodeFrame(MsgType::kSpawn, request(200, {"/bin/sleep", "30"}).encode()) +
                     encodeFrame(MsgType::kSignal, SignalRequest{200, SIGTERM, true}.encode());
  SpawnRequest quick = request(201, {"/bin/sleep", "30"});
  quick.timeoutMs = 1;
  both += encodeFrame(MsgType::kSpawn, quick.encode());
  std::string problem;
  auto runs = sendAndCollect(both, {200, 201}, problem);
  ASSERT_EQ(problem, "");
  ASSERT_TRUE(runs[200].exited) << runs[200].problem;
  EXPECT_EQ(runs[200].exit.signal, SIGTERM);
  ASSERT_TRUE(runs[201].exited) << runs[201].problem;
  EXPECT_TRUE(runs[201].exit.timedOut);
  EXPECT_EQ(runs[201].exit.signal, SIGKILL);
  EXPECT_EQ(::kill(initPid_, 0), 0) << "moat-init itself was signalled";
}

// The child of a launch switches ids with raw system calls: glibc's wrappers
// would apply the switch to every thread of moat-init (or hang on them).
TEST_F(InitSupervisor, CommandsRunAsAnotherUserWhileMoatInitKeepsItsIds) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching to another uid needs root";
  constexpr uint32_t kCount = 8;
  std::string burst;
  std::set<uint32_t> ids;
  for (uint32_t id = 300; id < 300 + kCount; ++id) {
    ids.insert(id);
    SpawnRequest req = request(id, {"/bin/sh", "-c", "sleep 0.2; id -u; id -g"});
    req.uid = 65534;
    req.gid = 65534;
    burst += encodeFrame(MsgType::kSpawn, req.encode());
  }
  std::string problem;
  auto runs = sendAndCollect(burst, ids, problem);
  ASSERT_EQ(problem, "");
  for (auto& [id, run] : runs) {
    EXPECT_CLEAN(run);
    EXPECT_EQ(run.out, "65534\n65534\n") << "id " << id;
  }
  // Every thread of moat-init is still root.
  auto tasks = os::listDir("/proc/" + std::to_string(initPid_) + "/task");
  ASSERT_TRUE(tasks.ok()) << tasks.error().message();
  EXPECT_GT(tasks->size(), 1u) << "no launch thread ran";
  for (const auto& task : tasks.value()) {
    std::ifstream status("/proc/" + std::to_string(initPid_) + "/task/" + task + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) == 0 || line.rfind("Gid:", 0) == 0) {
        EXPECT_EQ(line.find("65534"), std::string::npos) << "thread " << task << ": " << line;
      }
    }
  }
}

// moat-init's launch threads count against a pids limit. Where no thread
// (and no process) can start at all, a spawn fails with the fork's error
// and moat-init keeps serving; it once died on the thread it could not start.
// RLIMIT_NPROC 0 for an unprivileged user stands in for a full pids cgroup.
TEST(InitSupervisorLimits, NoThreadOrProcessCanStartSpawnsFailAndMoatInitServesOn) {
  if (::geteuid() != 0) GTEST_SKIP() << "running moat-init as another user needs root";
  std::string bin = test::binDir() + "/moat-init";
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct rlimit none = {0, 0};
    if (::dup2(sv[1], kControlFd) < 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0 ||
        ::setrlimit(RLIMIT_NPROC, &none) != 0) {
      ::_exit(120);
    }
    const char* argv[] = {"moat-init", "--control-fd", "7", nullptr};
    // A sanitized build's leak check at exit needs a thread of its own,
    // which this limit refuses too.
    const char* envp[] = {"ASAN_OPTIONS=detect_leaks=0", nullptr};
    ::execve(bin.c_str(), const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    ::_exit(121);
  }
  ::close(sv[1]);
  UniqueFd control(sv[0]);
  FrameReader reader;
  auto hello = readFrame(control.get(), reader);
  ASSERT_TRUE(hello.ok()) << hello.error().message();
  ASSERT_EQ(hello->type, MsgType::kHello);
  auto spawn = [](uint32_t id) {
    SpawnRequest req;
    req.id = id;
    req.argv = {"/bin/true"};
    req.cwd = "/";
    req.uid = 65534;
    req.gid = 65534;
    return encodeFrame(MsgType::kSpawn, req.encode());
  };
  // Two at once: the second would want a second thread.
  std::string both = spawn(1) + spawn(2);
  ASSERT_EQ(::write(control.get(), both.data(), both.size()), static_cast<ssize_t>(both.size()));
  for (int i = 0; i < 2; ++i) {
    auto frame = readFrame(control.get(), reader);
    ASSERT_TRUE(frame.ok()) << "moat-init went away: " << frame.error().message();
    ASSERT_EQ(frame->type, MsgType::kSpawnFailed);
    auto failed = SpawnFailed::decode(frame->payload);
    ASSERT_TRUE(failed.ok());
    EXPECT_EQ(failed->err, EAGAIN);
    EXPECT_EQ(failed->stage, "fork");
  }
  // Still serving: a file request gets its answer.
  FileRequest stat;
  stat.op = FileOp::kStat;
  stat.tag = 9;
  stat.path = "/";
  ASSERT_TRUE(writeFrame(control.get(), MsgType::kFile, stat.encode()).ok());
  auto answer = readFrame(control.get(), reader);
  ASSERT_TRUE(answer.ok()) << answer.error().message();
  EXPECT_EQ(answer->type, MsgType::kFileResult);
  control.reset();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "moat-init ended with status " << status;
}

// --- pseudo-terminals (outside an environment: the host's /dev/ptmx) ---------------

size_t countOf(const std::string& haystack, const std::string& needle) {
  size_t count = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// Counts the pty masters among the fds of `pid`; false when its fd table
// cannot be read (moat-init is not dumpable: only root can).
bool ptmxFds(pid_t pid, int& count) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  auto names = os::listDir(dir);
  if (!names.ok()) return false;
  count = 0;
  for (const auto& name : names.value()) {
    char target[256];
    ssize_t n = ::readlink((dir + "/" + name).c_str(), target, sizeof target - 1);
    if (n > 0 && std::string(target, static_cast<size_t>(n)).find("ptmx") != std::string::npos) {
      ++count;
    }
  }
  return true;
}

class InitSupervisorPty : public InitSupervisor {
 protected:
  SpawnRequest ptyRequest(uint32_t id, std::vector<std::string> argv) {
    SpawnRequest req = request(id, std::move(argv));
    req.pty = true;
    return req;
  }
};

TEST_F(InitSupervisorPty, ProcessSeesATerminal) {
  // 0, 1 and 2 are the terminal, and it is the controlling one (/dev/tty).
  Outcome run =
      runToEnd(ptyRequest(1, {"/bin/sh", "-c", "test -t 0 && test -t 1 && test -t 2 && : </dev/tty && echo tty"}));
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited) << (run.failed ? run.failure.stage : "");
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(run.out, "tty\r\n");  // the terminal's ONLCR
  EXPECT_EQ(run.exit.stdoutBytes, 5u);
  EXPECT_EQ(run.err, "");
  EXPECT_EQ(run.exit.stderrBytes, 0u);

  // stderr is the terminal too, and the terminal has a name under /dev/pts.
  Outcome named = runToEnd(ptyRequest(2, {"/bin/sh", "-c", "tty >&2"}));
  EXPECT_CLEAN(named);
  ASSERT_TRUE(named.exited);
  EXPECT_EQ(named.out.rfind("/dev/pts/", 0), 0u) << named.out;
  EXPECT_EQ(named.err, "");
}

TEST_F(InitSupervisorPty, InitialWindowSize) {
  Outcome run = runToEnd(ptyRequest(3, {"stty", "size"}));
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "24 80\r\n");
}

TEST_F(InitSupervisorPty, ResizeReachesTheTerminal) {
  ASSERT_TRUE(send(MsgType::kSpawn, ptyRequest(4, {"/bin/sh", "-c", "read x; stty size"}).encode()).ok());
  ASSERT_TRUE(send(MsgType::kResize, Resize{4, 40, 120}.encode()).ok());
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{4, "go\n"}.encode()).ok());
  Outcome run;
  pump(run, 4, [](const Outcome&) { return false; });
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_NE(run.out.find("40 120"), std::string::npos) << run.out;
}

TEST_F(InitSupervisorPty, ResizeSendsSigwinch) {
  SpawnRequest req =
      ptyRequest(5, {"/bin/sh", "-c", "trap 'echo winch; exit 0' WINCH; echo ready; while :; do sleep 0.05; done"});
  req.timeoutMs = 8000;
  ASSERT_TRUE(send(MsgType::kSpawn, req.encode()).ok());
  Outcome run;
  // The trap is set once "ready" shows.
  pump(run, 5, [](const Outcome& r) { return r.out.find("ready") != std::string::npos; });
  ASSERT_NE(run.out.find("ready"), std::string::npos) << run.problem;
  ASSERT_TRUE(send(MsgType::kResize, Resize{5, 30, 100}.encode()).ok());
  pump(run, 5, [](const Outcome&) { return false; });
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_FALSE(run.exit.timedOut) << "no SIGWINCH reached the shell";
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_NE(run.out.find("winch"), std::string::npos) << run.out;
}

TEST_F(InitSupervisorPty, StdinRoundTripAndCloseStdinEndsCat) {
  SpawnRequest req = ptyRequest(6, {"/bin/cat"});
  req.stdinPipe = false;  // ignored: a pty's stdin is the terminal
  ASSERT_TRUE(send(MsgType::kSpawn, req.encode()).ok());
  Outcome run;
  pump(run, 6, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(run.spawned) << run.problem;
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{6, "hello\n"}.encode()).ok());
  // The terminal echoes the line, then cat writes it back.
  pump(run, 6, [](const Outcome& r) { return countOf(r.out, "hello") >= 2; });
  EXPECT_EQ(countOf(run.out, "hello\r\n"), 2u) << run.out;
  EXPECT_FALSE(run.exited) << "cat exited before CloseStdin";
  ASSERT_TRUE(send(MsgType::kCloseStdin, ProcessRef{6}.encode()).ok());
  pump(run, 6, [](const Outcome&) { return false; });
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(run.exit.signal, 0);
}

TEST_F(InitSupervisorPty, CloseStdinAfterAPartialLine) {
  ASSERT_TRUE(send(MsgType::kSpawn, ptyRequest(7, {"/bin/cat"}).encode()).ok());
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{7, "abc"}.encode()).ok());
  ASSERT_TRUE(send(MsgType::kCloseStdin, ProcessRef{7}.encode()).ok());
  Outcome run;
  pump(run, 7, [](const Outcome&) { return false; });
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited) << "cat still waits for input";
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(countOf(run.out, "abc"), 2u) << run.out;  // the echo, then cat
}

TEST_F(InitSupervisorPty, LargeOutputArrivesBeforeExited) {
  // Far more than the terminal buffers: moat-init must keep reading while the
  // command writes, and drain the rest after it exits.
  Outcome run = runToEnd(ptyRequest(8, {"/bin/sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a"}));
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(countOf(run.out, "a"), 300000u);
  EXPECT_EQ(run.out.size(), 300000u);  // no newline, so no \r either
  EXPECT_EQ(run.exit.stdoutBytes, 300000u);
  EXPECT_FALSE(run.exit.stdoutTruncated);
  ASSERT_FALSE(run.order.empty());
  EXPECT_EQ(run.order.back(), MsgType::kExited);
}

TEST_F(InitSupervisorPty, OutputLimitApplies) {
  SpawnRequest req = ptyRequest(9, {"/usr/bin/printf", "1234567890"});
  req.outputLimit = 4;
  Outcome run = runToEnd(req);
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "1234");
  EXPECT_EQ(run.exit.stdoutBytes, 10u);
  EXPECT_TRUE(run.exit.stdoutTruncated);
}

TEST_F(InitSupervisorPty, BackgroundHolderDoesNotDelayExited) {
  // The background sleep ignores the hangup and keeps the terminal open.
  int64_t start = nowMs();
  Outcome run = runToEnd(ptyRequest(10, {"/bin/sh", "-c", "(trap '' HUP; exec sleep 30) & echo started"}), 20000);
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.exit.exitCode, 0);
  EXPECT_EQ(run.out, "started\r\n");
  EXPECT_LT(nowMs() - start, 10000) << "Exited waited for the background child";
  // TearDown kills the shell's process group (the background sleep).
}

TEST_F(InitSupervisorPty, MasterReachesNoOtherProcessAndClosesAtTheEnd) {
  ASSERT_TRUE(send(MsgType::kSpawn, ptyRequest(11, {"/bin/cat"}).encode()).ok());
  Outcome cat;
  pump(cat, 11, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(cat.spawned) << cat.problem;

  // Neither a plain command nor another pty command inherits cat's master.
  Outcome plain = runToEnd(request(12, {"/bin/ls", "-l", "/proc/self/fd/"}));
  EXPECT_CLEAN(plain);
  ASSERT_TRUE(plain.exited);
  EXPECT_EQ(plain.out.find("ptmx"), std::string::npos) << plain.out;
  EXPECT_EQ(plain.out.find("/dev/pts"), std::string::npos) << plain.out;
  Outcome other = runToEnd(ptyRequest(13, {"/bin/ls", "-l", "/proc/self/fd/"}));
  EXPECT_CLEAN(other);
  ASSERT_TRUE(other.exited);
  EXPECT_EQ(other.out.find("ptmx"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("/dev/pts/"), std::string::npos) << other.out;

  int masters = -1;
  if (!ptmxFds(initPid_, masters)) GTEST_SKIP() << "cannot read moat-init's fds (not root)";
  // cat's master: one descriptor to read, one to write. ls's closes right
  // after its Exited.
  EXPECT_TRUE(waitFor([&] { return ptmxFds(initPid_, masters) && masters == 2; }, 5000))
      << masters << " pty masters open while one pty process runs";
  ASSERT_TRUE(send(MsgType::kCloseStdin, ProcessRef{11}.encode()).ok());
  pump(cat, 11, [](const Outcome&) { return false; });
  ASSERT_TRUE(cat.exited) << cat.problem;
  EXPECT_TRUE(waitFor([&] { return ptmxFds(initPid_, masters) && masters == 0; }, 5000))
      << masters << " pty masters still open after the process finished";
}

TEST_F(InitSupervisorPty, ResizeForUnknownOrPipeProcessIsIgnored) {
  ASSERT_TRUE(send(MsgType::kResize, Resize{999, 40, 120}.encode()).ok());
  SpawnRequest piped = request(14, {"/bin/sh", "-c", "read x; echo got $x"});
  piped.stdinPipe = true;
  ASSERT_TRUE(send(MsgType::kSpawn, piped.encode()).ok());
  ASSERT_TRUE(send(MsgType::kResize, Resize{14, 40, 120}.encode()).ok());
  ASSERT_TRUE(send(MsgType::kStdin, StdinData{14, "x\n"}.encode()).ok());
  Outcome run;
  pump(run, 14, [](const Outcome&) { return false; });
  EXPECT_CLEAN(run);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.out, "got x\n");

  // A malformed Resize is a protocol error, and the connection carries on.
  ASSERT_TRUE(send(MsgType::kResize, Encoder().u32(1).u32(0).u32(80).take()).ok());
  auto f = next(kDefaultWaitMs);
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->type, MsgType::kProtocolError);
  Outcome after = runToEnd(request(15, {"/bin/echo", "ok"}));
  EXPECT_CLEAN(after);
  EXPECT_EQ(after.out, "ok\n");
}

// --- file operations -------------------------------------------------------------

class InitSupervisorFiles : public InitSupervisor {
 protected:
  FileRequest req(FileOp op, const std::string& path) {
    FileRequest r;
    r.tag = ++tag_;
    r.op = op;
    r.path = path;
    return r;
  }
  uint32_t tag_ = 100;
};

// kFileSkipHoles: a read starts at the next data and stops at the hole after
// it; past the last data it is empty, at the file's end. Without the flag
// the holes are read as zeros, as before.
TEST_F(InitSupervisorFiles, AReadThatSkipsHolesSaysWhereItsBytesBegin) {
  std::string dir = tmpDir();
  ASSERT_FALSE(dir.empty());
  std::string path = dir + "/sparse";
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(::pwrite(fd.get(), "abc", 3, 1 << 20), 3);
    ASSERT_EQ(::pwrite(fd.get(), "xyz", 3, 8 << 20), 3);
    ASSERT_EQ(::ftruncate(fd.get(), 16 << 20), 0);
  }
  auto skipping = [&](uint64_t offset) {
    FileRequest r = req(FileOp::kRead, path);
    r.flags = kFileSkipHoles;
    r.offset = offset;
    r.length = 8 << 20;
    return file(r);
  };
  auto first = skipping(0);
  ASSERT_TRUE(first.ok()) << first.error().message();
  ASSERT_EQ(first->err, 0) << first->message;
  EXPECT_EQ(first->offset, 1u << 20);
  ASSERT_GE(first->data.size(), 3u);
  EXPECT_LT(first->data.size(), 1u << 20) << "read on into the hole after the data";
  EXPECT_EQ(first->data.substr(0, 3), "abc");
  EXPECT_EQ(first->info.size, 16u << 20);
  auto second = skipping(first->offset + first->data.size());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->offset, 8u << 20);
  EXPECT_EQ(second->data.substr(0, 3), "xyz");
  auto end = skipping(second->offset + second->data.size());
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->err, 0) << end->message;
  EXPECT_EQ(end->data, "");
  EXPECT_EQ(end->offset, 16u << 20) << "no data after: the answer is at the file's end";
  auto beyond = skipping(1ull << 40);
  ASSERT_TRUE(beyond.ok());
  EXPECT_EQ(beyond->data, "");
  EXPECT_EQ(beyond->offset, 1ull << 40);
  // Within data, a skipping read starts where it was asked to.
  auto inside = skipping((1 << 20) + 1);
  ASSERT_TRUE(inside.ok());
  EXPECT_EQ(inside->offset, (1u << 20) + 1);
  EXPECT_EQ(inside->data.substr(0, 2), "bc");
  // Without the flag: zeros from the offset asked for.
  FileRequest plain = req(FileOp::kRead, path);
  plain.length = 4;
  auto zeros = file(plain);
  ASSERT_TRUE(zeros.ok());
  EXPECT_EQ(zeros->offset, 0u);
  EXPECT_EQ(zeros->data, std::string(4, '\0'));
  // What is not a regular file is refused as before (a FIFO would block).
  std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  FileRequest pipe = req(FileOp::kRead, fifo);
  pipe.flags = kFileSkipHoles;
  auto refused = file(pipe);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->err, EINVAL);
  EXPECT_NE(refused->message.find("not a regular file"), std::string::npos) << refused->message;
}

TEST_F(InitSupervisorFiles, WriteReadStatListRenameRemove) {
  std::string dir = tmpDir();
  ASSERT_FALSE(dir.empty());
  std::string path = dir + "/a/b/c.txt";

  FileRequest w = req(FileOp::kWrite, path);
  w.data = "hello world";
  w.flags = kFileCreateParents;
  w.mode = 0640;
  auto wr = file(w);
  ASSERT_TRUE(wr.ok()) << wr.error().message();
  ASSERT_EQ(wr->err, 0) << wr->message;
  EXPECT_EQ(wr->info.size, 11u);

  auto rd = file(req(FileOp::kRead, path));
  ASSERT_TRUE(rd.ok()) << rd.error().message();
  ASSERT_EQ(rd->err, 0) << rd->message;
  EXPECT_EQ(rd->data, "hello world");

  FileRequest part = req(FileOp::kRead, path);
  part.offset = 6;
  part.length = 3;
  auto pr = file(part);
  ASSERT_TRUE(pr.ok());
  ASSERT_EQ(pr->err, 0) << pr->message;
  EXPECT_EQ(pr->data, "wor");

  FileRequest tail = req(FileOp::kRead, path);
  tail.offset = 6;
  auto tr = file(tail);
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(tr->data, "world");

  FileRequest past = req(FileOp::kRead, path);
  past.offset = 1000;
  auto pa = file(past);
  ASSERT_TRUE(pa.ok());
  EXPECT_EQ(pa->err, 0);
  EXPECT_EQ(pa->data, "");

  FileRequest app = req(FileOp::kWrite, path);
  app.data = "!";
  app.flags = kFileAppend;
  auto ap = file(app);
  ASSERT_TRUE(ap.ok());
  ASSERT_EQ(ap->err, 0) << ap->message;
  EXPECT_EQ(file(req(FileOp::kRead, path))->data, "hello world!");

  auto st = file(req(FileOp::kStat, path));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->err, 0) << st->message;
  EXPECT_EQ(st->info.type, 'f');
  EXPECT_EQ(st->info.size, 12u);
  EXPECT_EQ(st->info.mode, 0640u);
  EXPECT_GT(st->info.mtimeSec, 0u);

  auto sd = file(req(FileOp::kStat, dir + "/a"));
  ASSERT_TRUE(sd.ok());
  EXPECT_EQ(sd->info.type, 'd');

  ASSERT_EQ(::symlink("c.txt", (dir + "/a/b/link").c_str()), 0);
  auto ls = file(req(FileOp::kList, dir + "/a/b"));
  ASSERT_TRUE(ls.ok());
  ASSERT_EQ(ls->err, 0) << ls->message;
  std::vector<std::string> names;
  for (const auto& e : ls->entries) {
    names.push_back(e.name);
    if (e.name == "c.txt") {
      EXPECT_EQ(e.type, 'f');
      EXPECT_EQ(e.size, 12u);
    }
    if (e.name == "link") {
      EXPECT_EQ(e.type, 'l');
    }
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"c.txt", "link"}));

  FileRequest mk = req(FileOp::kMkdir, dir + "/m");
  mk.mode = 0700;
  auto mr = file(mk);
  ASSERT_TRUE(mr.ok());
  ASSERT_EQ(mr->err, 0) << mr->message;
  EXPECT_TRUE(os::isDirectory(dir + "/m"));

  auto deep = file(req(FileOp::kMkdir, dir + "/x/y/z"));
  ASSERT_TRUE(deep.ok());
  EXPECT_EQ(deep->err, ENOENT) << "mkdir without kFileCreateParents must not create parents";
  FileRequest deepP = req(FileOp::kMkdir, dir + "/x/y/z");
  deepP.flags = kFileCreateParents;
  deepP.mode = 0640;  // a mode without search rights: the leaf's, not its parents'
  auto dp = file(deepP);
  ASSERT_TRUE(dp.ok());
  ASSERT_EQ(dp->err, 0) << dp->message;
  EXPECT_TRUE(os::isDirectory(dir + "/x/y/z"));
  struct stat parent, leaf;
  ASSERT_EQ(::stat((dir + "/x/y").c_str(), &parent), 0);
  ASSERT_EQ(::lstat((dir + "/x/y/z").c_str(), &leaf), 0);
  EXPECT_EQ(parent.st_mode & 0700, 0700u) << "parents are made searchable, as mkdir -p makes them";
  EXPECT_EQ(leaf.st_mode & 0100, 0u) << "the leaf has the mode asked for";

  auto again = file(req(FileOp::kMkdir, dir + "/m"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->err, EEXIST);

  FileRequest mv = req(FileOp::kRename, path);
  mv.target = dir + "/a/b/d.txt";
  auto mvr = file(mv);
  ASSERT_TRUE(mvr.ok());
  ASSERT_EQ(mvr->err, 0) << mvr->message;
  EXPECT_EQ(file(req(FileOp::kStat, path))->err, ENOENT);
  EXPECT_EQ(file(req(FileOp::kRead, dir + "/a/b/d.txt"))->data, "hello world!");

  auto notEmpty = file(req(FileOp::kRemove, dir + "/a"));
  ASSERT_TRUE(notEmpty.ok());
  EXPECT_EQ(notEmpty->err, ENOTEMPTY);

  FileRequest rm = req(FileOp::kRemove, dir + "/a");
  rm.flags = kFileRecursive;
  auto rr = file(rm);
  ASSERT_TRUE(rr.ok());
  ASSERT_EQ(rr->err, 0) << rr->message;
  EXPECT_FALSE(os::exists(dir + "/a"));

  auto rmEmpty = file(req(FileOp::kRemove, dir + "/m"));
  ASSERT_TRUE(rmEmpty.ok());
  EXPECT_EQ(rmEmpty->err, 0) << rmEmpty->message;
  EXPECT_FALSE(os::exists(dir + "/m"));

  // A sync (before a microVM's snapshot) of the file system a path is on;
  // a path that is not there says so.
  auto synced = file(req(FileOp::kSync, dir));
  ASSERT_TRUE(synced.ok());
  EXPECT_EQ(synced->err, 0) << synced->message;
  auto nowhere = file(req(FileOp::kSync, dir + "/gone"));
  ASSERT_TRUE(nowhere.ok());
  EXPECT_EQ(nowhere->err, ENOENT) << nowhere->message;
  // A pause, a count of tasks and a clock are a microVM guest's moat-init's:
  // outside a guest, refused (a command's host clock is never set).
  for (FileOp op : {FileOp::kPause, FileOp::kResume, FileOp::kTasks, FileOp::kClock, FileOp::kQuiesce}) {
    auto refused = file(req(op, "/"));
    ASSERT_TRUE(refused.ok());
    EXPECT_EQ(refused->err, EOPNOTSUPP) << refused->message;
    EXPECT_NE(refused->message.find("outside a microVM guest"), std::string::npos) << refused->message;
  }
}

// A listing is one frame: a directory whose listing would not fit is
// refused by name (E2BIG), and moat-init keeps serving. The files' names are
// long so that 42,000 of them are enough.
TEST_F(InitSupervisorFiles, ADirectoryTooLargeToListIsRefusedByName) {
  // On tmpfs: 42,000 files are made and removed in well under a second.
  char tmpl[] = "/dev/shm/moat-supervisor-list-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
  std::string big = tmpl;
  struct Remove {
    std::string path;
    ~Remove() { (void)os::removeTree(path); }
  } remove{big};
  const std::string stem(250, 'n');
  for (int i = 0; i < 42000; ++i) {
    int fd = ::open((big + "/" + stem + std::to_string(i)).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ::close(fd);
  }
  auto listed = file(req(FileOp::kList, big));
  ASSERT_TRUE(listed.ok()) << listed.error().message();
  EXPECT_EQ(listed->err, E2BIG);
  EXPECT_NE(listed->message.find("list (more than"), std::string::npos) << listed->message;
  EXPECT_TRUE(listed->entries.empty());
  auto after = file(req(FileOp::kStat, big));
  ASSERT_TRUE(after.ok()) << after.error().message();
  EXPECT_EQ(after->err, 0);
}

TEST_F(InitSupervisorFiles, ReadErrors) {
  std::string dir = tmpDir();
  ASSERT_FALSE(dir.empty());
  auto isDir = file(req(FileOp::kRead, dir));
  ASSERT_TRUE(isDir.ok());
  EXPECT_EQ(isDir->err, EISDIR);
  EXPECT_EQ(isDir->data, "");

  std::string missing = dir + "/no-such-file";
  auto miss = file(req(FileOp::kRead, missing));
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->err, ENOENT);
  EXPECT_NE(miss->message.find(missing), std::string::npos) << miss->message;

  auto empty = file(req(FileOp::kStat, ""));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->err, EINVAL);

  auto nul = file(req(FileOp::kStat, std::string("/tmp\0/etc/shadow", 16)));
  ASSERT_TRUE(nul.ok());
  EXPECT_EQ(nul->err, EINVAL);

  std::string plain = dir + "/plain";
  {
    std::ofstream out(plain);
    out << "x";
  }
  auto listFile = file(req(FileOp::kList, plain));
  ASSERT_TRUE(listFile.ok());
  EXPECT_EQ(listFile->err, ENOTDIR);
}

TEST_F(InitSupervisorFiles, MkdirWithParentsOnAFileFails) {
  std::string dir = tmpDir();
  ASSERT_FALSE(dir.empty());
  std::string f = dir + "/plain";
  {
    std::ofstream out(f);
    out << "x";
  }
  FileRequest mk = req(FileOp::kMkdir, f);
  mk.flags = kFileCreateParents;
  auto r = file(mk);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(r->err == EEXIST || r->err == ENOTDIR) << r->err;
}

// --- protocol abuse and shutdown --------------------------------------------------

TEST_F(InitSupervisor, GarbageGetsProtocolErrorAndExit) {
  const char garbage[] = "\xff\xff\xff\xff this is not a frame";
  ASSERT_EQ(::write(fd_, garbage, sizeof garbage - 1), static_cast<ssize_t>(sizeof garbage - 1));
  auto f = next(kDefaultWaitMs);
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->type, MsgType::kProtocolError);
  Decoder d(f->payload);
  auto msg = d.bytes();
  ASSERT_TRUE(msg.ok());
  EXPECT_NE(msg->find("frame"), std::string::npos) << msg.value();
  auto eof = next(kDefaultWaitMs);
  ASSERT_FALSE(eof.ok());
  EXPECT_EQ(eof.error().code, Code::kEof);
  int status = waitInitExit(5000);
  ASSERT_NE(status, -1) << "moat-init still running after a corrupt stream";
  EXPECT_TRUE(WIFEXITED(status));
}

TEST_F(InitSupervisor, ZeroLengthFrameIsFatal) {
  const char zero[] = {0, 0, 0, 0};
  ASSERT_EQ(::write(fd_, zero, 4), 4);
  auto f = next(kDefaultWaitMs);
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->type, MsgType::kProtocolError);
  EXPECT_NE(waitInitExit(5000), -1);
}

TEST_F(InitSupervisor, BadMessagesInGoodFramesAreReported) {
  // A well-framed but undecodable spawn, an unknown type, a bad signal.
  ASSERT_TRUE(send(MsgType::kSpawn, "\x01\x02").ok());
  auto a = next(kDefaultWaitMs);
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ(a->type, MsgType::kProtocolError);
  ASSERT_TRUE(send(static_cast<MsgType>(200), "").ok());
  auto b = next(kDefaultWaitMs);
  ASSERT_TRUE(b.ok()) << b.error().message();
  EXPECT_EQ(b->type, MsgType::kProtocolError);
  Decoder d(b->payload);
  auto msg = d.bytes();
  ASSERT_TRUE(msg.ok());
  EXPECT_NE(msg->find("unknown message type"), std::string::npos) << msg.value();
  ASSERT_TRUE(send(MsgType::kSignal, Encoder().u32(1).i32(99).u8(1).take()).ok());
  auto c = next(kDefaultWaitMs);
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->type, MsgType::kProtocolError);
  // The connection still serves requests.
  Outcome run = runToEnd(request(50, {"/bin/echo", "ok"}));
  EXPECT_CLEAN(run);
  EXPECT_EQ(run.out, "ok\n");
}

TEST_F(InitSupervisor, ClosingControlKillsChildrenAndExits) {
  ASSERT_TRUE(send(MsgType::kSpawn, request(60, {"/bin/sleep", "30"}).encode()).ok());
  Outcome run;
  pump(run, 60, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(run.spawned) << run.problem;
  pid_t sleeper = static_cast<pid_t>(run.spawnedMsg.pid);
  ASSERT_EQ(::kill(sleeper, 0), 0) << "the sleep is not running";
  closeControl();
  int status = waitInitExit(5000);
  ASSERT_NE(status, -1) << "moat-init did not exit after its control socket closed";
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(waitFor([&] { return pidGone(sleeper); }, 5000)) << "sleep " << sleeper << " outlived moat-init";
}

TEST_F(InitSupervisor, ShutdownKillsChildrenAndExits) {
  ASSERT_TRUE(send(MsgType::kSpawn, request(61, {"/bin/sleep", "30"}).encode()).ok());
  Outcome run;
  pump(run, 61, [](const Outcome& r) { return r.spawned; });
  ASSERT_TRUE(run.spawned) << run.problem;
  pid_t sleeper = static_cast<pid_t>(run.spawnedMsg.pid);
  ASSERT_TRUE(send(MsgType::kShutdown, "").ok());
  int status = waitInitExit(5000);
  ASSERT_NE(status, -1) << "moat-init did not exit on Shutdown";
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_TRUE(waitFor([&] { return pidGone(sleeper); }, 5000)) << "sleep " << sleeper << " outlived moat-init";
}

}  // namespace
}  // namespace moat::init
