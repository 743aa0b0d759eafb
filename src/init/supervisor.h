#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "init/disk_view.h"
#include "init/guest_commands.h"
#include "init/identity_keeper.h"
#include "init/launcher.h"
#include "init/protocol.h"
#include "os/block.h"
#include "os/exec_trace.h"

namespace moat::init {

// The event loop of moat-init: serves the guest protocol on one control
// connection, runs commands in their own process groups, forwards their
// output, enforces timeouts and output caps, and reaps every zombie.
class Supervisor {
 public:
  // isPidOne: true inside an environment, where killing everything is
  // kill(-1); false when run as an ordinary process (tests).
  // rendezvousFd (-1: none): a socket on which the owner of the environment
  // (moatd's spawner) hands over a new control connection when its client
  // restarts. With it, losing the control connection leaves every process
  // running; losing the rendezvous socket ends the environment.
  // gateExec: every exec in the environment is handed to this loop first
  // (os::installExecListener) and goes on as the client's ExecPolicy says.
  Supervisor(int controlFd, bool isPidOne, int rendezvousFd = -1, bool gateExec = false);
  // A microVM guest's control port (virtio-serial, which opens once): when
  // its host goes (moatd stops or restarts; QEMU lives on), every process
  // keeps running and the port is watched until a host is connected again,
  // who sends kReattach. Before run().
  void keepPortAcrossHosts() { portMode_ = true; }
  // statfs of the environment's root answers with the volume's qgroup limit
  // and usage (init/disk_view.h). Before run().
  void showDiskLimit(os::QgroupCounters counters) { diskCounters_ = std::move(counters); }
  // A microVM guest's: the cgroup its commands start in (moat-init stays
  // out of it), which FileOp::kPause and kResume freeze and thaw and whose
  // tasks kTasks counts. Before run().
  void runCommandsIn(GuestCommands commands) { commands_.emplace(std::move(commands)); }
  // A microVM guest's: what renames it and reseeds its random generator
  // after a restore (FileOp kClock). Before run().
  void keepIdentity(IdentityKeeper identity) { identity_ = std::move(identity); }
  // A microVM guest's: its overlay's writable layer and its root image, as
  // directories (opened before its root was switched to), for FileOp
  // kChanges. Before run().
  void keepLayers(UniqueFd upper, UniqueFd lower) {
    upperLayer_ = std::move(upper);
    lowerLayer_ = std::move(lower);
  }
  // Runs until the control connection closes or Shutdown arrives; returns
  // moat-init's exit code.
  int run();

 private:
  struct Process {
    uint32_t id = 0;
    pid_t pid = -1;  // -1 while its launch runs
    // Signals asked for while it was launching: (signo, whole group).
    std::vector<std::pair<int, bool>> pendingSignals;
    // With a pty, stdoutFd is the terminal's master and stdinFd a second
    // descriptor of it (so the output's end and the input's end stay
    // independent); stderrFd is unused.
    bool pty = false;
    UniqueFd stdinFd;
    UniqueFd stdoutFd;
    UniqueFd stderrFd;
    std::string stdinBuffer;
    // The client's input: bytes received (StdinData), what was reported
    // taken (StdinTaken), and how many of the buffer's last bytes are not
    // the client's (a pty's EOF characters).
    uint64_t stdinReceived = 0;
    uint64_t stdinReported = 0;
    size_t stdinOwnBytes = 0;
    bool closeStdinWhenDrained = false;
    bool stdinAtLineStart = true;  // pty: the last input byte ended a line
    uint64_t startUs = 0;
    uint64_t deadlineUs = 0;  // 0: none
    uint64_t outputLimit = 0;
    bool timedOut = false;
    uint64_t bytes[2] = {0, 0};
    bool truncated[2] = {false, false};
    // Flow control (OutputCredit): output is forwarded while `forwarded`
    // (both streams) is below `limit`; kUnlimited unless the client asked.
    uint64_t limit = OutputCredit::kUnlimited;
    uint64_t forwarded = 0;
    bool limited = false;  // a credit came: later ones only raise the limit
    uint64_t available() const {
      if (limit == OutputCredit::kUnlimited) return OutputCredit::kUnlimited;
      return limit > forwarded ? limit - forwarded : 0;
    }
    // Reaped while output still waited for credit: its wait status, and its
    // Exited goes out once what its pipes hold is forwarded. -1: running.
    int exitStatus = -1;
  };

  void handleFrame(const Frame& frame);
  // FileOp::kPause and kResume (commands_'s freezer), kTasks (its count).
  FileResult guestCgroupRequest(const FileRequest& request);
  // FileOp kChanges: the guest's changed files (keepLayers's).
  FileResult changesRequest(const FileRequest& request);
  void spawn(const SpawnRequest& request);
  // A launch finished: the process runs (Spawned) or failed (SpawnFailed).
  void launched(std::unique_ptr<Launch> launch);
  void signalProcess(Process& process, int signo, bool wholeGroup);
  void reapChildren();
  void finish(Process& process, int status);
  // Reports the processes reaped while their output waited for credit, once
  // what their pipes hold is forwarded.
  void finishDrained();
  enum class PumpResult { kData, kAgain, kEnd };
  // Reads one chunk of a stream and forwards it (within the output cap).
  PumpResult pump(Process& process, int streamIndex);
  void flushStdin(Process& process);
  // Sends StdinTaken when more of the client's input left the buffer.
  void reportStdin(Process& process);
  void endPtyInput(Process& process);
  void resize(const Resize& request);
  void enforceDeadlines();
  int pollTimeoutMs() const;
  // Frames are gathered while the loop handles what woke it and written at
  // once before it waits again (or when many gather): one wake-up of moatd
  // for a command's Spawned and Exited, or for many commands' under load.
  void send(MsgType type, const std::string& payload);
  void flush();
  void protocolError(const std::string& message);
  void killEverything();

  // The connection ended: `hostWent` when the host closed it (EOF, a
  // write that failed), not when this side gave up on it (a protocol
  // error), which ends a guest as it ends any environment.
  void disconnect(bool hostWent);
  void adoptConnection();
  // What every connection hears first: this moat-init's Hello (its
  // payload, and as a frame for the outbox of a new or re-attached host).
  static std::string helloPayload();
  static std::string helloFrame();
  // A client is connected and may be sent to (a guest's host that came
  // back is not, until its kReattach).
  bool hasClient() const { return control_ >= 0 && !reattaching_; }
  // portMode_: takes the port back as the control connection once a host
  // is connected to it again.
  void awaitHostAgain();
  // Reads what the client wrote (one read, or with `drain` until nothing
  // more waits, 4 MiB at most) and handles each whole frame.
  void readClient(bool drain);
  // What an exec was judged as, checked again once it has run (the
  // kernel reads the request again after the answer: os/exec_trace.h).
  struct JudgedExec {
    std::string execFn;
    std::vector<std::string> argv;
    std::string procPath;       // the file it names, as moat-init reaches it
    std::string viaDescriptor;  // fexecve: the name judged, its descriptor's file's (else "")
    os::ExecFile file;          // what that file was when the exec went on
    bool identified = false;
    bool any = false;  // allowed without judging (the permissions allow every program)
  };
  struct PendingExec {
    pid_t pid;
    JudgedExec judged;
  };
  // The exec gate: a notification from the listener, and a client's verdict.
  void handleExecNotification();
  void answerExec(uint64_t id, bool allow);
  // Lets a judged exec go on, traced until it has run, and queues `report`
  // (if any) for the log. Refused instead (false) if the notification no
  // longer stands, a script's interpreter is not allowed, or the process
  // cannot be traced (another process traces it).
  bool allowJudged(uint64_t id, pid_t pid, JudgedExec judged, const ExecReport* report);
  // Refuses every exec waiting for a verdict (the client that would give
  // it is gone).
  void refusePendingExecs();
  // Fails the exec with EPERM and reports it at once (with its parents).
  void refuseExec(uint64_t id, pid_t pid, ExecReport report);
  // A traced process stopped: after its exec, it goes on if it runs what
  // was judged and is killed if not; any other stop is resumed.
  void onTraceStop(pid_t pid, int status);
  // Reports of programs judged here and allowed wait (at most
  // kReportDelayUs, or kReportBatch of them) so that a loop of execs wakes
  // moatd once per batch, not per exec; any other message sends them first,
  // so the client sees them in order. While no client is connected they
  // wait for the next (at most kReportsWhileAlone: false when full).
  bool queueReport(const ExecReport& report);
  void releaseReports();

  int control_;
  bool pidOne_;
  int rendezvous_;
  bool portMode_ = false;
  int port_ = -1;             // portMode_: the control port while no host is connected (control_ is then -1)
  bool reattaching_ = false;  // portMode_: a host is connected again and has not sent kReattach yet
  bool running_ = true;
  bool quiet_ = false;  // FileOp kQuiesce: no output forwarded until kReattach or kResume
  std::string held_;    // frames made while quiet (send), sent at its end
  // The quiet ends: output is forwarded again, and what was held is sent.
  void endQuiet();
  UniqueFd signalFd_;
  FrameReader reader_;
  std::string outbox_;
  UniqueFd devNull_;  // stdin of commands without a stdin pipe
  std::map<uint32_t, Process> processes_;
  Launcher launcher_;
  // Children reaped before their launch was reported to the loop (a
  // command that exits at once): pid -> wait status. Claimed by launched();
  // what is left once no launch is pending were orphans.
  std::map<pid_t, int> unclaimed_;
  bool gateExec_ = false;
  std::optional<os::QgroupCounters> diskCounters_;
  std::optional<GuestCommands> commands_;  // runCommandsIn
  IdentityKeeper identity_;                // keepIdentity
  UniqueFd upperLayer_, lowerLayer_;       // keepLayers
  std::unique_ptr<DiskView> diskView_;     // answers statfs of the root (df)
  UniqueFd execListener_;
  ExecPolicy execPolicy_;
  std::map<uint64_t, PendingExec> pendingExecs_;  // sent as ExecCheck, waiting for the verdict
  // Processes traced until their exec has run, with the exec judged for
  // them (none: an exec that failed, or one not judged since).
  std::map<pid_t, std::optional<JudgedExec>> traced_;
  std::string reports_;  // queued ExecReport frames
  size_t reportCount_ = 0;
  uint64_t reportsSinceUs_ = 0;  // when the oldest queued report was made
};

}  // namespace moat::init
