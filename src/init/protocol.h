#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

// The guest protocol between a client (moat run, later moatd) and moat-init,
// pid 1 of every environment. One protocol for every transport (a unix
// socketpair for namespaces, vsock for the microVM backend).
//
// A frame is: u32 little-endian length of what follows, u8 type, payload.
// Payload fields are little-endian integers and u32-length-prefixed bytes.
// Both sides treat the other as untrusted: every decode is bounds-checked and
// a frame larger than kMaxFrame is a protocol error.
namespace moat::init {

// What Hello announces. 1: the first; 2: OutputCredit (message 7) and
// StdinTaken (message 69); 3: the exec gate, ExecPolicy (9), ExecVerdict (8)
// and ExecCheck (70); 4: ExecPolicy's mode 2 with its rules, and ExecReport
// (71); 5: FileOp kPause, kResume, kTasks; 6: a read that skips holes
// (kFileSkipHoles, FileResult's offset); 7: FileOp kClock and kQuiesce; 8: kQuiesce's end (offset 1, a memory
// fork's source), kClock's target, FileOp kChanges. A moatd re-attaching after an upgrade may meet a moat-init of an
// older version: it sends each only what that version knows.
constexpr uint32_t kProtocolVersion = 8;
constexpr uint32_t kFlowControlSince = 2;   // OutputCredit and StdinTaken
constexpr uint32_t kExecGateSince = 3;      // ExecPolicy, ExecCheck, ExecVerdict
constexpr uint32_t kExecRulesSince = 4;     // ExecPolicy 2 (rules), ExecReport
constexpr uint32_t kGuestCgroupSince = 5;   // FileOp kPause, kResume, kTasks (a microVM guest's)
constexpr uint32_t kSparseReadSince = 6;    // kFileSkipHoles, FileResult::offset
constexpr uint32_t kClockSince = 7;         // FileOp kClock and kQuiesce (a microVM guest's)
constexpr uint32_t kQuietEndSince = 8;      // kQuiesce with offset kQuietEnd, kClock's target (a new hostname)
constexpr uint32_t kGuestChangesSince = 8;  // FileOp kChanges
constexpr uint32_t kMaxFrame = 16u << 20;
constexpr size_t kOutputChunk = 64u << 10;

enum class MsgType : uint8_t {
  // client -> init
  kSpawn = 1,
  kStdin = 2,
  kCloseStdin = 3,
  kSignal = 4,
  kResize = 5,
  kShutdown = 6,
  kOutputCredit = 7,
  kExecVerdict = 8,
  kExecPolicy = 9,
  kResume = 10,  // a parked guest's identity and limits (GuestResume), once
  // A microVM host that connected again (a moatd restart): a nonce, which
  // the guest sends back as kReattached, then its Hello. What the last host
  // left unread may come before it; the host skips to the nonce.
  kReattach = 11,
  kFile = 16,
  // init -> client
  kHello = 64,
  kSpawned = 65,
  kSpawnFailed = 66,
  kOutput = 67,
  kExited = 68,
  kStdinTaken = 69,
  kExecCheck = 70,
  kExecReport = 71,
  kParked = 72,      // a guest booted with MOAT_GUEST_PARK waits for kResume (no payload)
  kReattached = 73,  // kReattach's nonce, back; Hello follows
  kFileResult = 80,
  kProtocolError = 81,
};

class Encoder {
 public:
  Encoder& u8(uint8_t v);
  Encoder& u32(uint32_t v);
  Encoder& u64(uint64_t v);
  Encoder& i32(int32_t v) { return u32(static_cast<uint32_t>(v)); }
  Encoder& bytes(const std::string& v);
  Encoder& strings(const std::vector<std::string>& v);
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Decoder {
 public:
  explicit Decoder(const std::string& data) : data_(data) {}
  Result<uint8_t> u8();
  Result<uint32_t> u32();
  Result<uint64_t> u64();
  Result<int32_t> i32();
  Result<std::string> bytes();
  Result<std::vector<std::string>> strings();
  bool done() const { return pos_ == data_.size(); }

 private:
  Status need(size_t n);
  const std::string& data_;
  size_t pos_ = 0;
};

struct Hello {
  uint32_t version = kProtocolVersion;
  uint32_t initPid = 0;
  std::string encode() const;
  static Result<Hello> decode(const std::string& payload);
};

// What a microVM guest parked before its root was made (saved, and
// restored once per environment) is told once it runs for an environment:
// who it is now and its limits. Each restored copy gets its own hostname,
// entropy and wall clock.
struct GuestResume {
  std::string hostname;
  uint64_t storageBytes = 0;  // the writable layer's size
  uint64_t pids = 0;          // 0: unbounded
  std::string seed;           // random bytes mixed into the guest's entropy pool
  uint64_t realtimeNs = 0;    // the host's CLOCK_REALTIME when sent
  std::string encode() const;
  static Result<GuestResume> decode(const std::string& payload);
};

struct SpawnRequest {
  uint32_t id = 0;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // KEY=VALUE; nothing else is inherited
  std::string cwd = "/";
  uint32_t uid = 0;
  uint32_t gid = 0;
  bool stdinPipe = false;    // false: stdin is /dev/null (ignored with pty)
  bool pty = false;          // run on a new terminal: its master is the only stream
  uint64_t timeoutMs = 0;    // 0: none
  uint64_t outputLimit = 0;  // bytes per stream forwarded; 0: unlimited
  std::string encode() const;
  static Result<SpawnRequest> decode(const std::string& payload);
};

struct Spawned {
  uint32_t id = 0;
  uint32_t pid = 0;  // as seen inside the environment
  std::string encode() const;
  static Result<Spawned> decode(const std::string& payload);
};

struct SpawnFailed {
  uint32_t id = 0;
  int32_t err = 0;    // errno
  std::string stage;  // "exec", "chdir", "setuid", ...
  std::string encode() const;
  static Result<SpawnFailed> decode(const std::string& payload);
};

enum class Stream : uint8_t { kStdout = 1, kStderr = 2 };

struct Output {
  uint32_t id = 0;
  Stream stream = Stream::kStdout;
  std::string data;
  std::string encode() const;
  static Result<Output> decode(const std::string& payload);
};

struct StdinData {
  uint32_t id = 0;
  std::string data;
  std::string encode() const;
  static Result<StdinData> decode(const std::string& payload);
};

// How much of a process's input moat-init has taken off the connection so
// far (written to the process, or dropped because nobody reads it any more):
// what the client has sent beyond it is what moat-init holds.
struct StdinTaken {
  uint32_t id = 0;
  uint64_t total = 0;
  std::string encode() const;
  static Result<StdinTaken> decode(const std::string& payload);
};

// The exec gate (moat-init runs with a seccomp filter that hands every
// execve/execveat in the environment to it). ExecPolicy says how programs
// are judged: kAllowAll, moat-init lets every exec go on by itself; kLocal,
// moat-init judges each exec by `layers` (run_command's rules of every
// permission layer and the key's ceiling: the first matching rule of each
// layer, none matching is a deny, the strictest layer wins), lets an allow
// go on and refuses a deny (reporting both, ExecReport), and asks about an
// "ask" (ExecCheck); kAsk, it asks about every exec. Never asked about: the
// first exec of a command moat-init launched itself (the client judged it).
// An asked exec waits until the ExecVerdict with the same id.
struct ExecRule {
  uint8_t decision = 2;  // 0 allow, 1 ask, 2 deny
  bool hasMatch = false;
  std::vector<std::string> match;  // argv globs (common/glob.h argvMatch)
};
struct ExecPolicy {
  static constexpr uint8_t kAllowAll = 0;
  static constexpr uint8_t kAsk = 1;
  static constexpr uint8_t kLocal = 2;
  static constexpr size_t kMaxLayers = 64;
  static constexpr size_t kMaxRules = 1024;  // of one layer
  uint8_t mode = kAllowAll;
  std::vector<std::vector<ExecRule>> layers;  // kLocal
  // The decision of `layers` for argv (0 allow, 1 ask, 2 deny); moat-init
  // passes the argv as judged (common/glob.h judgedArgv).
  uint8_t judge(const std::vector<std::string>& argv) const;
  // For a moat-init of version 3: the mode alone, judging as 1.
  std::string encodeV3() const;
  std::string encode() const;
  // Either form (version 3's is the mode byte alone).
  static Result<ExecPolicy> decode(const std::string& payload);
};

// What moat-init decided by itself under kLocal, for the client's record.
struct ExecReport {
  uint32_t pid = 0;
  uint8_t decision = 0;  // 0 allowed, 2 refused
  std::string filename;
  std::vector<std::string> argv;
  std::vector<std::string> parents;  // refusals only
  std::string encode() const;
  static Result<ExecReport> decode(const std::string& payload);
};

struct ExecCheck {
  uint64_t id = 0;                   // the kernel's notification id
  uint32_t pid = 0;                  // the exec'ing process, inside the environment
  std::string filename;              // as passed to execve (or the fd's path for execveat)
  std::vector<std::string> argv;     // as passed (a program racing the check may change them after)
  std::vector<std::string> parents;  // "pid comm" of its parent, its parent's, ... up to pid 1
  std::string encode() const;
  static Result<ExecCheck> decode(const std::string& payload);
};

struct ExecVerdict {
  uint64_t id = 0;
  bool allow = false;  // false: the exec fails with EPERM
  std::string encode() const;
  static Result<ExecVerdict> decode(const std::string& payload);
};

struct ProcessRef {  // kCloseStdin
  uint32_t id = 0;
  std::string encode() const;
  static Result<ProcessRef> decode(const std::string& payload);
};

struct SignalRequest {
  uint32_t id = 0;
  int32_t signo = 0;
  bool wholeGroup = true;
  std::string encode() const;
  static Result<SignalRequest> decode(const std::string& payload);
};

// Flow control of one process's output (kOutputCredit). A process starts
// unlimited: moat-init forwards its output as it comes. The first credit
// limits it: moat-init forwards output only while the total it forwarded
// of the process (both streams together) is below `upTo`, and leaves the
// rest in the pipe, so the process waits in its writes. Later credits raise
// the limit (a lower one changes nothing: order does not matter), and
// kUnlimited lifts it for good.
struct OutputCredit {
  static constexpr uint64_t kUnlimited = ~0ULL;
  uint32_t id = 0;
  uint64_t upTo = 0;
  std::string encode() const;
  static Result<OutputCredit> decode(const std::string& payload);
};

// The window size of a pty process's terminal (kResize). Encoded as three
// u32 so that the wire format has one integer width for ids and sizes.
struct Resize {
  uint32_t id = 0;
  uint16_t rows = 0;
  uint16_t cols = 0;
  std::string encode() const;
  static Result<Resize> decode(const std::string& payload);
};

struct Exited {
  uint32_t id = 0;
  int32_t exitCode = -1;  // -1 when killed by a signal
  int32_t signal = 0;
  bool timedOut = false;
  uint64_t stdoutBytes = 0;
  uint64_t stderrBytes = 0;
  bool stdoutTruncated = false;
  bool stderrTruncated = false;
  uint64_t durationUs = 0;
  std::string encode() const;
  static Result<Exited> decode(const std::string& payload);
};

enum class FileOp : uint8_t {
  kRead = 1,    // path, offset, length -> data
  kWrite = 2,   // path, data, mode, flags(kCreateParents|kAppend) -> ok
  kStat = 3,    // path -> info
  kList = 4,    // path -> entries
  kMkdir = 5,   // path, mode, flags(kCreateParents)
  kRemove = 6,  // path, flags(kRecursive)
  kRename = 7,  // path -> target
  kSync = 8,    // path -> ok: its file system written to its disk (a microVM's snapshot)
  // Not of a file: a microVM guest's moat-init stops (kPause) or lets go on
  // (kResume) every command of the guest (its commands' cgroup's freezer),
  // answered as a file request is; refused elsewhere.
  kPause = 9,
  kResume = 10,
  kTasks = 11,  // -> data: how many tasks the guest's commands' cgroup holds (its pids.current)
  // A guest restored from its checkpoint (docs/PAUSE.md, "To disk") is told
  // the time: offset = the host's CLOCK_REALTIME in ns, data = entropy mixed
  // into the guest's pool, the generator reseeded (its clock stood still
  // while it was on disk); target (version 8, a memory fork's copy): its
  // new hostname.
  kClock = 12,
  // Before a checkpoint: moat-init sends what it holds for the host (its
  // batched reports), then nothing of its own accord (commands' output
  // waits in their pipes) until the next kReattach or kResume; its answer
  // is the last frame before the quiet. With offset kQuietEnd (version 8):
  // the quiet ends, nothing else changes (the source of a memory fork goes
  // on; a paused guest stays paused).
  kQuiesce = 13,
  // A microVM guest's changed files (version 8; docs/API.md, "Changes"):
  // data = the host's limits (init/changes_wire.h), the answer's data = the
  // list, from the guest's own overlay (its disk's upper layer against its
  // root image).
  kChanges = 14,
};
constexpr uint64_t kQuietEnd = 1;

constexpr uint8_t kFileCreateParents = 1;
constexpr uint8_t kFileAppend = 2;
constexpr uint8_t kFileRecursive = 4;
// A read of a regular file that starts at the first byte of data at or
// after its offset (SEEK_DATA) and ends at the hole after it: the answer's
// offset says where its bytes begin.
constexpr uint8_t kFileSkipHoles = 8;

struct FileRequest {
  uint32_t tag = 0;
  FileOp op = FileOp::kStat;
  std::string path;
  std::string target;
  std::string data;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t mode = 0644;
  uint8_t flags = 0;
  std::string encode() const;
  static Result<FileRequest> decode(const std::string& payload);
};

struct FileInfo {
  std::string name;
  uint8_t type = 0;  // 'f' file, 'd' dir, 'l' symlink, 'o' other
  uint64_t size = 0;
  uint32_t mode = 0;
  uint64_t mtimeSec = 0;
};

struct FileResult {
  uint32_t tag = 0;
  int32_t err = 0;  // errno, 0 on success
  std::string message;
  std::string data;
  FileInfo info;
  std::vector<FileInfo> entries;
  uint64_t offset = 0;  // a read's: where `data` begins in the file (version 6 on)
  std::string encode() const;
  // As a moat-init of `version` encodes it (before 6: without the offset).
  static Result<FileResult> decode(const std::string& payload, uint32_t version = kProtocolVersion);
};

struct Frame {
  MsgType type;
  std::string payload;
};

std::string encodeFrame(MsgType type, const std::string& payload);

// Accumulates bytes from a stream and yields whole frames.
class FrameReader {
 public:
  void feed(const char* data, size_t size) { buffer_.append(data, size); }
  // Returns the next frame, an empty optional-like (false) when more bytes are
  // needed, or an error when the stream is corrupt.
  Result<bool> next(Frame& out);
  // Bytes of a frame not yet whole.
  bool partial() const { return !buffer_.empty(); }

 private:
  std::string buffer_;
};

// Blocking helpers for a stream fd.
Status writeFrame(int fd, MsgType type, const std::string& payload);
// Frames already encoded (encodeFrame, concatenated), in one write: the
// reader finds them together.
Status writeFrames(int fd, const std::string& frames);
// Reads one frame (blocking); returns an error with code "eof" on clean EOF.
Result<Frame> readFrame(int fd, FrameReader& reader);

}  // namespace moat::init
