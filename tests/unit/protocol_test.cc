#include "init/protocol.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace moat::init {
namespace {

// --- helpers ---------------------------------------------------------------

// One decoder per message type, all with the same shape: payload -> ok?
struct NamedDecoder {
  const char* name;
  std::function<bool(const std::string&)> decodes;
};

template <class T>
NamedDecoder decoderFor(const char* name) {
  return {name, [](const std::string& payload) { return T::decode(payload).ok(); }};
}

std::vector<NamedDecoder> allDecoders() {
  return {
      decoderFor<Hello>("Hello"),
      decoderFor<SpawnRequest>("SpawnRequest"),
      decoderFor<Spawned>("Spawned"),
      decoderFor<SpawnFailed>("SpawnFailed"),
      decoderFor<Output>("Output"),
      decoderFor<StdinData>("StdinData"),
      decoderFor<ProcessRef>("ProcessRef"),
      decoderFor<SignalRequest>("SignalRequest"),
      decoderFor<Exited>("Exited"),
      decoderFor<FileRequest>("FileRequest"),
      decoderFor<FileResult>("FileResult"),
      decoderFor<Resize>("Resize"),
      decoderFor<OutputCredit>("OutputCredit"),
      decoderFor<GuestResume>("GuestResume"),
  };
}

SpawnRequest sampleSpawn() {
  SpawnRequest req;
  req.id = 7;
  req.argv = {"sh", "-c", "echo hi"};
  req.env = {"A=1", "PATH=/bin"};
  req.cwd = "/workspace";
  req.uid = 1000;
  req.gid = 1001;
  req.stdinPipe = true;
  req.pty = false;
  req.timeoutMs = 1500;
  req.outputLimit = 4096;
  return req;
}

Exited sampleExited() {
  Exited e;
  e.id = 9;
  e.exitCode = -1;
  e.signal = 15;
  e.timedOut = true;
  e.stdoutBytes = 1ull << 40;
  e.stderrBytes = 12;
  e.stdoutTruncated = true;
  e.stderrTruncated = false;
  e.durationUs = 123456789;
  return e;
}

FileRequest sampleFileRequest() {
  FileRequest r;
  r.tag = 42;
  r.op = FileOp::kRename;
  r.path = "/workspace/a";
  r.target = "/workspace/b";
  r.data = std::string("bin\0ary", 7);
  r.offset = 5;
  r.length = 1ull << 33;
  r.mode = 0600;
  r.flags = kFileCreateParents | kFileAppend;
  return r;
}

FileResult sampleFileResult() {
  FileResult r;
  r.tag = 43;
  r.err = 2;
  r.message = "open /x: No such file or directory";
  r.data = std::string("\0\1\2", 3);
  r.info = {"/x", 'f', 10, 0644, 1700000000};
  r.entries = {{"a", 'f', 1, 0600, 1}, {"b", 'd', 4096, 0755, 2}, {"c", 'l', 3, 0777, 3}};
  r.offset = 1ull << 40;
  return r;
}

// Every message's full encoding, with its decoder.
struct Sample {
  const char* name;
  std::string payload;
  std::function<bool(const std::string&)> decodes;
};

std::vector<Sample> allSamples() {
  Output out{3, Stream::kStderr, "err"};
  return {
      {"Hello", Hello{1, 77}.encode(), decoderFor<Hello>("").decodes},
      {"SpawnRequest", sampleSpawn().encode(), decoderFor<SpawnRequest>("").decodes},
      {"Spawned", Spawned{1, 2}.encode(), decoderFor<Spawned>("").decodes},
      {"SpawnFailed", SpawnFailed{1, 2, "exec"}.encode(), decoderFor<SpawnFailed>("").decodes},
      {"Output", out.encode(), decoderFor<Output>("").decodes},
      {"StdinData", StdinData{4, "in"}.encode(), decoderFor<StdinData>("").decodes},
      {"ProcessRef", ProcessRef{5}.encode(), decoderFor<ProcessRef>("").decodes},
      {"SignalRequest", SignalRequest{6, 9, false}.encode(), decoderFor<SignalRequest>("").decodes},
      {"Exited", sampleExited().encode(), decoderFor<Exited>("").decodes},
      {"FileRequest", sampleFileRequest().encode(), decoderFor<FileRequest>("").decodes},
      {"FileResult", sampleFileResult().encode(), decoderFor<FileResult>("").decodes},
      {"Resize", Resize{10, 40, 120}.encode(), decoderFor<Resize>("").decodes},
      {"OutputCredit", OutputCredit{11, 524288}.encode(), decoderFor<OutputCredit>("").decodes},
      {"GuestResume", GuestResume{"env1", 1 << 30, 64, std::string(32, '\xa5'), 1796532310000000000ull}.encode(),
       decoderFor<GuestResume>("").decodes},
  };
}

std::string le32(uint32_t v) { return Encoder().u32(v).take(); }

// --- round trips -------------------------------------------------------------

TEST(Protocol, SpawnRoundTrip) {
  SpawnRequest req = sampleSpawn();
  auto back = SpawnRequest::decode(req.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 7u);
  EXPECT_EQ(back->argv, req.argv);
  EXPECT_EQ(back->env, req.env);
  EXPECT_EQ(back->cwd, "/workspace");
  EXPECT_EQ(back->uid, 1000u);
  EXPECT_EQ(back->gid, 1001u);
  EXPECT_TRUE(back->stdinPipe);
  EXPECT_FALSE(back->pty);
  EXPECT_EQ(back->timeoutMs, 1500u);
  EXPECT_EQ(back->outputLimit, 4096u);
}

TEST(Protocol, SpawnRoundTripPtyAndEmptyEnv) {
  SpawnRequest req;
  req.id = 0xffffffffu;
  req.argv = {std::string("a\0b", 3)};
  req.pty = true;
  req.stdinPipe = false;
  req.timeoutMs = UINT64_MAX;
  auto back = SpawnRequest::decode(req.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 0xffffffffu);
  ASSERT_EQ(back->argv.size(), 1u);
  EXPECT_EQ(back->argv[0], std::string("a\0b", 3));
  EXPECT_TRUE(back->env.empty());
  EXPECT_EQ(back->cwd, "/");
  EXPECT_TRUE(back->pty);
  EXPECT_FALSE(back->stdinPipe);
  EXPECT_EQ(back->timeoutMs, UINT64_MAX);
  EXPECT_EQ(back->outputLimit, 0u);
}

TEST(Protocol, OutputCreditRoundTrip) {
  for (uint64_t upTo : {uint64_t{0}, uint64_t{524288}, OutputCredit::kUnlimited}) {
    auto back = OutputCredit::decode(OutputCredit{42, upTo}.encode());
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(back->id, 42u);
    EXPECT_EQ(back->upTo, upTo);
  }
}

TEST(Protocol, StdinTakenRoundTrip) {
  auto back = StdinTaken::decode(StdinTaken{7, (1ULL << 40) + 3}.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 7u);
  EXPECT_EQ(back->total, (1ULL << 40) + 3);
  EXPECT_FALSE(StdinTaken::decode(std::string(11, '\0')).ok());  // truncated
  EXPECT_FALSE(StdinTaken::decode(std::string(13, '\0')).ok());  // trailing byte
}

TEST(Protocol, ExecGateRoundTrips) {
  ExecCheck check{(1ULL << 50) + 9, 42, "/usr/bin/rm", {"rm", "-rf", "/workspace"}, {"7 sh", "3 bash"}};
  auto back = ExecCheck::decode(check.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, check.id);
  EXPECT_EQ(back->pid, 42u);
  EXPECT_EQ(back->filename, "/usr/bin/rm");
  EXPECT_EQ(back->argv, check.argv);
  EXPECT_EQ(back->parents, check.parents);
  auto verdict = ExecVerdict::decode(ExecVerdict{check.id, true}.encode());
  ASSERT_TRUE(verdict.ok());
  EXPECT_TRUE(verdict->allow);
  EXPECT_FALSE(ExecVerdict::decode(std::string(8, '\0') + '\2').ok()) << "allow is 0 or 1";
  ExecPolicy local;
  local.mode = ExecPolicy::kLocal;
  local.layers = {{{2, true, {"rm", "-rf", "*"}}, {0, true, {"rm", "*"}}, {1, true, {"curl", "*"}}, {0, false, {}}},
                  {{0, true, {"*"}}}};
  auto policy = ExecPolicy::decode(local.encode());
  ASSERT_TRUE(policy.ok()) << policy.error().message();
  EXPECT_EQ(policy->mode, ExecPolicy::kLocal);
  ASSERT_EQ(policy->layers.size(), 2u);
  EXPECT_EQ(policy->layers[0][1].match, (std::vector<std::string>{"rm", "*"}));
  EXPECT_FALSE(policy->layers[0][3].hasMatch);
  // The gate's rules, judged as moatd judges them: first match per layer,
  // the strictest layer; a first pattern without '/' is the program's name.
  EXPECT_EQ(policy->judge({"/usr/bin/rm", "-rf", "/workspace"}), 2);
  EXPECT_EQ(policy->judge({"rm", "/workspace/x"}), 0);
  EXPECT_EQ(policy->judge({"curl", "example.org"}), 1);
  EXPECT_EQ(policy->judge({"ls"}), 0);
  ExecPolicy none;
  none.mode = ExecPolicy::kLocal;
  none.layers = {{{0, true, {"ls", "*"}}}};
  EXPECT_EQ(none.judge({"cat"}), 2) << "no rule matched: deny";
  EXPECT_FALSE(ExecPolicy::decode(std::string(1, '\7') + std::string(4, '\0')).ok()) << "an unknown mode";
  // Version 3's form, the mode byte alone: what a moat-init of version 3 is
  // sent, judging as "ask" where it cannot judge by itself.
  EXPECT_EQ(local.encodeV3(), std::string(1, '\1'));
  EXPECT_EQ(ExecPolicy{}.encodeV3(), std::string(1, '\0'));
  auto v3 = ExecPolicy::decode(std::string(1, '\1'));
  ASSERT_TRUE(v3.ok()) << v3.error().message();
  EXPECT_EQ(v3->mode, ExecPolicy::kAsk);
  EXPECT_FALSE(ExecPolicy::decode(std::string(1, '\2')).ok()) << "mode 2 without its rules";
  auto report = ExecReport::decode(ExecReport{9, 2, "/usr/bin/rm", {"rm", "-rf", "/"}, {"3 sh"}}.encode());
  ASSERT_TRUE(report.ok()) << report.error().message();
  EXPECT_EQ(report->decision, 2);
  EXPECT_EQ(report->parents, (std::vector<std::string>{"3 sh"}));
}

TEST(Protocol, HelloRoundTrip) {
  auto back = Hello::decode(Hello{kProtocolVersion, 4242}.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->version, kProtocolVersion);
  EXPECT_EQ(back->initPid, 4242u);
  // Fixed layout: two little-endian u32.
  EXPECT_EQ((Hello{1, 2}.encode()), (std::string("\1\0\0\0\2\0\0\0", 8)));
}

TEST(Protocol, GuestResumeRoundTrip) {
  GuestResume resume{"a1b2c3", 4ull << 30, 1024, std::string("\0seed\xff", 6), 1796532310123456789ull};
  auto back = GuestResume::decode(resume.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->hostname, "a1b2c3");
  EXPECT_EQ(back->storageBytes, 4ull << 30);
  EXPECT_EQ(back->pids, 1024u);
  EXPECT_EQ(back->seed, std::string("\0seed\xff", 6));
  EXPECT_EQ(back->realtimeNs, 1796532310123456789ull);
}

TEST(Protocol, SpawnedRoundTrip) {
  auto back = Spawned::decode(Spawned{11, 12345}.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 11u);
  EXPECT_EQ(back->pid, 12345u);
}

TEST(Protocol, SpawnFailedRoundTrip) {
  auto back = SpawnFailed::decode(SpawnFailed{3, -5, "chdir"}.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 3u);
  EXPECT_EQ(back->err, -5);
  EXPECT_EQ(back->stage, "chdir");
}

TEST(Protocol, OutputRoundTripBothStreams) {
  for (Stream s : {Stream::kStdout, Stream::kStderr}) {
    std::string data(70000, 'x');
    data[5] = '\0';
    auto back = Output::decode(Output{8, s, data}.encode());
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(back->id, 8u);
    EXPECT_EQ(back->stream, s);
    EXPECT_EQ(back->data, data);
  }
}

TEST(Protocol, OutputUnknownStreamRejected) {
  std::string payload = Encoder().u32(1).u8(3).bytes("x").take();
  auto back = Output::decode(payload);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.error().code, Code::kProtocol);
  payload = Encoder().u32(1).u8(0).bytes("x").take();
  EXPECT_FALSE(Output::decode(payload).ok());
}

TEST(Protocol, StdinDataRoundTrip) {
  auto back = StdinData::decode(StdinData{9, std::string("a\0\xff", 3)}.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 9u);
  EXPECT_EQ(back->data, std::string("a\0\xff", 3));
  auto empty = StdinData::decode(StdinData{1, ""}.encode());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data, "");
}

TEST(Protocol, ProcessRefRoundTrip) {
  auto back = ProcessRef::decode(ProcessRef{0xdeadbeef}.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 0xdeadbeefu);
}

TEST(Protocol, SignalRequestRoundTrip) {
  for (bool group : {true, false}) {
    for (int sig : {1, 15, 64}) {
      auto back = SignalRequest::decode(SignalRequest{2, sig, group}.encode());
      ASSERT_TRUE(back.ok()) << back.error().message();
      EXPECT_EQ(back->id, 2u);
      EXPECT_EQ(back->signo, sig);
      EXPECT_EQ(back->wholeGroup, group);
    }
  }
}

TEST(Protocol, SignalRequestOutOfRangeRejected) {
  for (int sig : {0, -1, 65, 1000, INT32_MIN, INT32_MAX}) {
    auto back = SignalRequest::decode(SignalRequest{2, sig, true}.encode());
    ASSERT_FALSE(back.ok()) << "signal " << sig << " accepted";
    EXPECT_EQ(back.error().code, Code::kProtocol);
    EXPECT_NE(back.error().context.find("signal"), std::string::npos) << back.error().context;
  }
}

TEST(Protocol, ResizeRoundTrip) {
  auto back = Resize::decode(Resize{0xabcdef01u, 40, 120}.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 0xabcdef01u);
  EXPECT_EQ(back->rows, 40u);
  EXPECT_EQ(back->cols, 120u);
  // Three little-endian u32: the sizes are not u16 on the wire.
  EXPECT_EQ((Resize{1, 2, 3}.encode()), (std::string("\1\0\0\0\2\0\0\0\3\0\0\0", 12)));
  auto largest = Resize::decode(Resize{1, 65535, 65535}.encode());
  ASSERT_TRUE(largest.ok()) << largest.error().message();
  EXPECT_EQ(largest->rows, 65535u);
  EXPECT_EQ(largest->cols, 65535u);
  auto smallest = Resize::decode(Resize{1, 1, 1}.encode());
  ASSERT_TRUE(smallest.ok()) << smallest.error().message();
}

TEST(Protocol, ResizeOutOfRangeRejected) {
  struct Case {
    uint32_t rows, cols;
  };
  for (Case c : {Case{0, 80}, Case{24, 0}, Case{0, 0}, Case{65536, 80}, Case{24, 65536}, Case{0xffffffffu, 80}}) {
    auto back = Resize::decode(Encoder().u32(1).u32(c.rows).u32(c.cols).take());
    ASSERT_FALSE(back.ok()) << c.rows << "x" << c.cols << " accepted";
    EXPECT_EQ(back.error().code, Code::kProtocol);
    EXPECT_NE(back.error().context.find("window size"), std::string::npos) << back.error().context;
  }
}

TEST(Protocol, ResizeTrailingBytesRejected) {
  std::string payload = Resize{1, 24, 80}.encode();
  auto back = Resize::decode(payload + std::string(1, '\0'));
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.error().code, Code::kProtocol);
  EXPECT_NE(back.error().context.find("trailing"), std::string::npos) << back.error().context;
  // Sizes as u16 (a shorter encoding) are truncated, not misread.
  EXPECT_FALSE(Resize::decode(Encoder().u32(1).u8(24).u8(0).u8(80).u8(0).take()).ok());
}

TEST(Protocol, ExitedRoundTrip) {
  Exited e = sampleExited();
  auto back = Exited::decode(e.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 9u);
  EXPECT_EQ(back->exitCode, -1);
  EXPECT_EQ(back->signal, 15);
  EXPECT_TRUE(back->timedOut);
  EXPECT_EQ(back->stdoutBytes, 1ull << 40);
  EXPECT_EQ(back->stderrBytes, 12u);
  EXPECT_TRUE(back->stdoutTruncated);
  EXPECT_FALSE(back->stderrTruncated);
  EXPECT_EQ(back->durationUs, 123456789u);

  // Each flag on its own.
  Exited only;
  only.exitCode = 3;
  only.stderrTruncated = true;
  auto b2 = Exited::decode(only.encode());
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(b2->exitCode, 3);
  EXPECT_FALSE(b2->timedOut);
  EXPECT_FALSE(b2->stdoutTruncated);
  EXPECT_TRUE(b2->stderrTruncated);
}

TEST(Protocol, FileRequestRoundTripEveryOp) {
  for (FileOp op : {FileOp::kRead, FileOp::kWrite, FileOp::kStat, FileOp::kList, FileOp::kMkdir, FileOp::kRemove,
                    FileOp::kRename, FileOp::kSync, FileOp::kPause, FileOp::kResume, FileOp::kTasks, FileOp::kClock,
                    FileOp::kQuiesce, FileOp::kChanges}) {
    FileRequest r = sampleFileRequest();
    r.op = op;
    auto back = FileRequest::decode(r.encode());
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(back->tag, 42u);
    EXPECT_EQ(back->op, op);
    EXPECT_EQ(back->path, "/workspace/a");
    EXPECT_EQ(back->target, "/workspace/b");
    EXPECT_EQ(back->data, std::string("bin\0ary", 7));
    EXPECT_EQ(back->offset, 5u);
    EXPECT_EQ(back->length, 1ull << 33);
    EXPECT_EQ(back->mode, 0600u);
    EXPECT_EQ(back->flags, kFileCreateParents | kFileAppend);
  }
}

TEST(Protocol, FileRequestUnknownOpRejected) {
  for (uint8_t op : {0, 15, 255}) {
    std::string payload = sampleFileRequest().encode();
    payload[4] = static_cast<char>(op);  // after the u32 tag
    auto back = FileRequest::decode(payload);
    ASSERT_FALSE(back.ok()) << "op " << int(op);
    EXPECT_EQ(back.error().code, Code::kProtocol);
  }
}

TEST(Protocol, FileResultRoundTripWithEntries) {
  FileResult r = sampleFileResult();
  auto back = FileResult::decode(r.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->tag, 43u);
  EXPECT_EQ(back->err, 2);
  EXPECT_EQ(back->message, r.message);
  EXPECT_EQ(back->data, r.data);
  EXPECT_EQ(back->info.name, "/x");
  EXPECT_EQ(back->info.type, 'f');
  EXPECT_EQ(back->info.size, 10u);
  EXPECT_EQ(back->info.mode, 0644u);
  EXPECT_EQ(back->info.mtimeSec, 1700000000u);
  ASSERT_EQ(back->entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back->entries[i].name, r.entries[i].name);
    EXPECT_EQ(back->entries[i].type, r.entries[i].type);
    EXPECT_EQ(back->entries[i].size, r.entries[i].size);
    EXPECT_EQ(back->entries[i].mode, r.entries[i].mode);
    EXPECT_EQ(back->entries[i].mtimeSec, r.entries[i].mtimeSec);
  }
  EXPECT_EQ(back->offset, 1ull << 40);
  // And without entries.
  auto none = FileResult::decode(FileResult{}.encode());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->entries.empty());
}

// A moat-init before version 6 sends no offset: its answers still decode
// (a moatd re-attached after an upgrade reads through it), and a version 6
// answer without one is truncated.
TEST(Protocol, AFileResultOfAnOlderMoatInitHasNoOffset) {
  std::string v6 = sampleFileResult().encode();
  std::string v5 = v6.substr(0, v6.size() - 8);
  auto older = FileResult::decode(v5, kSparseReadSince - 1);
  ASSERT_TRUE(older.ok()) << older.error().message();
  EXPECT_EQ(older->offset, 0u);
  EXPECT_EQ(older->entries.size(), 3u);
  EXPECT_FALSE(FileResult::decode(v5).ok());
  EXPECT_FALSE(FileResult::decode(v6, kSparseReadSince - 1).ok()) << "trailing bytes for a version 5 answer";
}

TEST(Protocol, UnknownFileFlagsAreRefused) {
  FileRequest r = sampleFileRequest();
  r.flags = kFileSkipHoles;
  EXPECT_TRUE(FileRequest::decode(r.encode()).ok());
  r.flags = 16;
  auto bad = FileRequest::decode(r.encode());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().context.find("flags"), std::string::npos) << bad.error().context;
}

// --- malformed input ----------------------------------------------------------

TEST(Protocol, TruncatedPayloadsFailAtEveryLength) {
  for (const auto& s : allSamples()) {
    ASSERT_TRUE(s.decodes(s.payload)) << s.name << ": the full payload must decode";
    for (size_t len = 0; len < s.payload.size(); ++len) {
      EXPECT_FALSE(s.decodes(s.payload.substr(0, len)))
          << s.name << " decoded from a prefix of " << len << " of " << s.payload.size();
    }
  }
}

TEST(Protocol, TruncatedErrorIsAProtocolError) {
  std::string full = sampleSpawn().encode();
  auto r = SpawnRequest::decode(full.substr(0, full.size() - 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Code::kProtocol);
  EXPECT_NE(r.error().context.find("truncated"), std::string::npos) << r.error().context;
}

TEST(Protocol, TrailingBytesRejected) {
  for (const auto& s : allSamples()) {
    EXPECT_FALSE(s.decodes(s.payload + "x")) << s.name << " accepted a trailing byte";
    EXPECT_FALSE(s.decodes(s.payload + std::string(4, '\0'))) << s.name << " accepted trailing zeros";
  }
  auto r = Hello::decode(Hello{}.encode() + "z");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().context.find("trailing"), std::string::npos) << r.error().context;
}

TEST(Protocol, SpawnWithEmptyArgvRejected) {
  SpawnRequest req = sampleSpawn();
  req.argv.clear();
  auto back = SpawnRequest::decode(req.encode());
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.error().code, Code::kProtocol);
  EXPECT_NE(back.error().context.find("argv"), std::string::npos) << back.error().context;
}

// Offset of the u8 flags in an encoded SpawnRequest: the 8+8 bytes of
// timeoutMs and outputLimit follow it.
size_t spawnFlagsOffset(const std::string& payload) { return payload.size() - 17; }

TEST(Protocol, SpawnUnknownFlagsRejected) {
  std::string payload = sampleSpawn().encode();
  size_t at = spawnFlagsOffset(payload);
  ASSERT_EQ(static_cast<uint8_t>(payload[at]), 1u);  // stdinPipe only: the offset is right
  for (uint8_t flags : {4, 8, 0x80, 0xff}) {
    payload[at] = static_cast<char>(flags);
    auto back = SpawnRequest::decode(payload);
    ASSERT_FALSE(back.ok()) << "flags " << int(flags);
    EXPECT_NE(back.error().context.find("flags"), std::string::npos) << back.error().context;
  }
  payload[at] = 3;
  EXPECT_TRUE(SpawnRequest::decode(payload).ok());
}

TEST(Protocol, ExitedUnknownFlagsRejected) {
  std::string payload = Exited{}.encode();
  // id, exitCode, signal: 12 bytes, then the flags byte.
  ASSERT_EQ(static_cast<uint8_t>(payload[12]), 0u);
  payload[12] = static_cast<char>(0x08);
  auto back = Exited::decode(payload);
  EXPECT_EQ(back.error().code, Code::kProtocol);
}

TEST(Protocol, FileRequestUnknownFlagsRejected) {
  FileRequest r = sampleFileRequest();
  r.flags = 0x40;
  auto back = FileRequest::decode(r.encode());
  EXPECT_EQ(back.error().code, Code::kProtocol);
}

TEST(Protocol, DecoderStringsRejectsCountLargerThanRemaining) {
  // Count 3 with only 8 bytes left: each string needs at least 4.
  std::string data = le32(3) + le32(0) + le32(0);
  Decoder d(data);
  auto r = d.strings();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Code::kProtocol);
  EXPECT_NE(r.error().context.find("count"), std::string::npos) << r.error().context;

  // A huge count must be refused before any allocation.
  std::string huge = le32(0xffffffffu);
  Decoder d2(huge);
  EXPECT_FALSE(d2.strings().ok());

  // Count 2 with exactly two empty strings is fine.
  std::string two = le32(2) + le32(0) + le32(0);
  Decoder d3(two);
  auto ok = d3.strings();
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(ok->size(), 2u);
  EXPECT_TRUE(d3.done());
}

TEST(Protocol, DecoderBytesRejectsLengthBeyondData) {
  std::string data = le32(10) + "abc";
  Decoder d(data);
  auto r = d.bytes();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Code::kProtocol);
  std::string max = le32(0xffffffffu);
  Decoder d2(max);
  EXPECT_FALSE(d2.bytes().ok());
}

TEST(Protocol, DecoderIntegersAreLittleEndian) {
  std::string data("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\xff\xff\xff\xff\x7f", 17);
  Decoder d(data);
  auto a = d.u32();
  auto b = d.u64();
  auto c = d.i32();
  auto e = d.u8();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && e.ok());
  EXPECT_EQ(*a, 0x04030201u);
  EXPECT_EQ(*b, 0x0c0b0a0908070605ull);
  EXPECT_EQ(*c, -1);
  EXPECT_EQ(*e, 0x7fu);
  EXPECT_TRUE(d.done());
  EXPECT_FALSE(d.u8().ok());
}

TEST(Protocol, GarbageNeverCrashesDecoders) {
  std::mt19937 rng(12345);
  auto decoders = allDecoders();
  auto samples = allSamples();
  size_t accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string junk;
    if (iter % 2 == 0) {
      // Pure random bytes.
      size_t len = rng() % 96;
      for (size_t i = 0; i < len; ++i) junk.push_back(static_cast<char>(rng() & 0xff));
    } else {
      // A valid message with a few bytes flipped: reaches deeper into decode().
      junk = samples[rng() % samples.size()].payload;
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips && !junk.empty(); ++f) {
        junk[rng() % junk.size()] = static_cast<char>(rng() & 0xff);
      }
      if (rng() % 4 == 0) junk.resize(rng() % (junk.size() + 1));
    }
    for (const auto& d : decoders) accepted += d.decodes(junk) ? 1 : 0;

    FrameReader reader;
    reader.feed(junk.data(), junk.size());
    Frame frame;
    for (int guard = 0; guard < 200; ++guard) {
      auto next = reader.next(frame);
      if (!next.ok() || !next.value()) break;
      EXPECT_EQ(frame.payload.size() + 1 + 4 <= junk.size(), true);
    }
  }
  // Some of the mutated valid messages still decode: the loop exercised the
  // success path too, not only the first bounds check.
  EXPECT_GT(accepted, 0u);
}

// --- frames --------------------------------------------------------------------

TEST(Protocol, EncodeFrameLayout) {
  std::string f = encodeFrame(MsgType::kSpawned, "abc");
  EXPECT_EQ(f, std::string("\x04\0\0\0", 4) + std::string(1, char(65)) + "abc");
}

TEST(Protocol, FrameReaderOneByteAtATime) {
  std::string stream = encodeFrame(MsgType::kHello, Hello{1, 5}.encode()) +
                       encodeFrame(MsgType::kOutput, Output{1, Stream::kStdout, "hi\n"}.encode()) +
                       encodeFrame(MsgType::kShutdown, "");
  FrameReader reader;
  std::vector<Frame> frames;
  for (char c : stream) {
    reader.feed(&c, 1);
    Frame f;
    auto next = reader.next(f);
    ASSERT_TRUE(next.ok()) << next.error().message();
    if (next.value()) frames.push_back(f);
  }
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].type, MsgType::kHello);
  auto hello = Hello::decode(frames[0].payload);
  ASSERT_TRUE(hello.ok());
  EXPECT_EQ(hello->initPid, 5u);
  EXPECT_EQ(frames[1].type, MsgType::kOutput);
  auto out = Output::decode(frames[1].payload);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->data, "hi\n");
  EXPECT_EQ(frames[2].type, MsgType::kShutdown);
  EXPECT_EQ(frames[2].payload, "");
  Frame none;
  auto last = reader.next(none);
  ASSERT_TRUE(last.ok());
  EXPECT_FALSE(last.value());
}

TEST(Protocol, FrameReaderSeveralFramesInOneFeed) {
  std::string stream;
  for (uint32_t i = 0; i < 5; ++i) stream += encodeFrame(MsgType::kSpawned, Spawned{i, 100 + i}.encode());
  std::string partial = encodeFrame(MsgType::kExited, Exited{}.encode());
  stream += partial.substr(0, 6);  // the start of a sixth frame
  FrameReader reader;
  reader.feed(stream.data(), stream.size());
  Frame f;
  for (uint32_t i = 0; i < 5; ++i) {
    auto next = reader.next(f);
    ASSERT_TRUE(next.ok());
    ASSERT_TRUE(next.value()) << "frame " << i;
    EXPECT_EQ(f.type, MsgType::kSpawned);
    auto sp = Spawned::decode(f.payload);
    ASSERT_TRUE(sp.ok());
    EXPECT_EQ(sp->id, i);
    EXPECT_EQ(sp->pid, 100 + i);
  }
  auto next = reader.next(f);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next.value()) << "a partial frame must wait for more bytes";
  reader.feed(partial.data() + 6, partial.size() - 6);
  next = reader.next(f);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(next.value());
  EXPECT_EQ(f.type, MsgType::kExited);
  EXPECT_TRUE(Exited::decode(f.payload).ok());
}

TEST(Protocol, FrameReaderRejectsZeroLength) {
  FrameReader reader;
  std::string zero = le32(0) + "x";
  reader.feed(zero.data(), zero.size());
  Frame f;
  auto next = reader.next(f);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error().code, Code::kProtocol);
}

TEST(Protocol, FrameReaderRejectsOversizedLength) {
  for (uint32_t length : {kMaxFrame + 2, kMaxFrame + 100, 0xffffffffu}) {
    FrameReader reader;
    std::string header = le32(length);
    reader.feed(header.data(), header.size());
    Frame f;
    auto next = reader.next(f);
    ASSERT_FALSE(next.ok()) << "length " << length;
    EXPECT_EQ(next.error().code, Code::kProtocol);
  }
  // kMaxFrame + 1 (type byte + a maximal payload) is legal: it waits for more.
  FrameReader reader;
  std::string header = le32(kMaxFrame + 1);
  reader.feed(header.data(), header.size());
  Frame f;
  auto next = reader.next(f);
  ASSERT_TRUE(next.ok()) << next.error().message();
  EXPECT_FALSE(next.value());
}

TEST(Protocol, FrameReaderWaitsForHeader) {
  FrameReader reader;
  Frame f;
  auto next = reader.next(f);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next.value());
  reader.feed("\x01\x00\x00", 3);
  next = reader.next(f);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next.value());
  reader.feed("\x00\x03", 2);  // length 1: just a type byte
  next = reader.next(f);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(next.value());
  EXPECT_EQ(f.type, MsgType::kCloseStdin);
  EXPECT_EQ(f.payload, "");
}

TEST(Protocol, WriteFrameRejectsOversizedPayload) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  Status s = writeFrame(fds[1], MsgType::kStdin, std::string(kMaxFrame + 1, 'x'));
  EXPECT_FALSE(s.ok());
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(Protocol, WriteFrameReadFrameOverPipe) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_TRUE(writeFrame(fds[1], MsgType::kSpawned, Spawned{1, 2}.encode()).ok());
  ASSERT_TRUE(writeFrame(fds[1], MsgType::kShutdown, "").ok());
  ::close(fds[1]);
  FrameReader reader;
  auto a = readFrame(fds[0], reader);
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ(a->type, MsgType::kSpawned);
  auto b = readFrame(fds[0], reader);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->type, MsgType::kShutdown);
  auto c = readFrame(fds[0], reader);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, Code::kEof);
  ::close(fds[0]);
}

}  // namespace
}  // namespace moat::init
