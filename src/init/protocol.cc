#include "init/protocol.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/glob.h"

namespace moat::init {

Encoder& Encoder::u8(uint8_t v) {
  out_.push_back(static_cast<char>(v));
  return *this;
}

Encoder& Encoder::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}

Encoder& Encoder::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}

Encoder& Encoder::bytes(const std::string& v) {
  u32(static_cast<uint32_t>(v.size()));
  out_ += v;
  return *this;
}

Encoder& Encoder::strings(const std::vector<std::string>& v) {
  u32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) bytes(s);
  return *this;
}

Status Decoder::need(size_t n) {
  if (data_.size() - pos_ < n) return Error::make(Code::kProtocol, "truncated message");
  return {};
}

Result<uint8_t> Decoder::u8() {
  MOAT_TRY(need(1));
  return static_cast<uint8_t>(data_[pos_++]);
}

Result<uint32_t> Decoder::u32() {
  MOAT_TRY(need(4));
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(data_[pos_++])) << (8 * i);
  return v;
}

Result<uint64_t> Decoder::u64() {
  MOAT_TRY(need(8));
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_++])) << (8 * i);
  return v;
}

Result<int32_t> Decoder::i32() {
  MOAT_ASSIGN(uint32_t v, u32());
  return static_cast<int32_t>(v);
}

Result<std::string> Decoder::bytes() {
  MOAT_ASSIGN(uint32_t n, u32());
  MOAT_TRY(need(n));
  std::string s = data_.substr(pos_, n);
  pos_ += n;
  return s;
}

Result<std::vector<std::string>> Decoder::strings() {
  MOAT_ASSIGN(uint32_t count, u32());
  // Each string costs at least its 4-byte length: a larger count is a lie.
  if (count > (data_.size() - pos_) / 4) return Error::make(Code::kProtocol, "string count too large");
  std::vector<std::string> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    MOAT_ASSIGN(std::string s, bytes());
    out.push_back(std::move(s));
  }
  return out;
}

#define FINISH(dec) \
  if (!(dec).done()) return Error::make(Code::kProtocol, "trailing bytes in message")

std::string Hello::encode() const { return Encoder().u32(version).u32(initPid).take(); }
Result<Hello> Hello::decode(const std::string& payload) {
  Decoder d(payload);
  Hello m;
  MOAT_ASSIGN(m.version, d.u32());
  MOAT_ASSIGN(m.initPid, d.u32());
  FINISH(d);
  return m;
}

std::string GuestResume::encode() const {
  return Encoder().bytes(hostname).u64(storageBytes).u64(pids).bytes(seed).u64(realtimeNs).take();
}
Result<GuestResume> GuestResume::decode(const std::string& payload) {
  Decoder d(payload);
  GuestResume m;
  MOAT_ASSIGN(m.hostname, d.bytes());
  MOAT_ASSIGN(m.storageBytes, d.u64());
  MOAT_ASSIGN(m.pids, d.u64());
  MOAT_ASSIGN(m.seed, d.bytes());
  MOAT_ASSIGN(m.realtimeNs, d.u64());
  FINISH(d);
  return m;
}

std::string SpawnRequest::encode() const {
  uint8_t flags = (stdinPipe ? 1 : 0) | (pty ? 2 : 0);
  return Encoder()
      .u32(id)
      .strings(argv)
      .strings(env)
      .bytes(cwd)
      .u32(uid)
      .u32(gid)
      .u8(flags)
      .u64(timeoutMs)
      .u64(outputLimit)
      .take();
}

Result<SpawnRequest> SpawnRequest::decode(const std::string& payload) {
  Decoder d(payload);
  SpawnRequest m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(m.argv, d.strings());
  MOAT_ASSIGN(m.env, d.strings());
  MOAT_ASSIGN(m.cwd, d.bytes());
  MOAT_ASSIGN(m.uid, d.u32());
  MOAT_ASSIGN(m.gid, d.u32());
  MOAT_ASSIGN(uint8_t flags, d.u8());
  MOAT_ASSIGN(m.timeoutMs, d.u64());
  MOAT_ASSIGN(m.outputLimit, d.u64());
  FINISH(d);
  if (flags & ~3u) return Error::make(Code::kProtocol, "unknown spawn flags");
  m.stdinPipe = flags & 1;
  m.pty = flags & 2;
  if (m.argv.empty()) return Error::make(Code::kProtocol, "spawn without argv");
  return m;
}

std::string Spawned::encode() const { return Encoder().u32(id).u32(pid).take(); }
Result<Spawned> Spawned::decode(const std::string& payload) {
  Decoder d(payload);
  Spawned m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(m.pid, d.u32());
  FINISH(d);
  return m;
}

std::string SpawnFailed::encode() const { return Encoder().u32(id).i32(err).bytes(stage).take(); }
Result<SpawnFailed> SpawnFailed::decode(const std::string& payload) {
  Decoder d(payload);
  SpawnFailed m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(m.err, d.i32());
  MOAT_ASSIGN(m.stage, d.bytes());
  FINISH(d);
  return m;
}

std::string Output::encode() const { return Encoder().u32(id).u8(static_cast<uint8_t>(stream)).bytes(data).take(); }
Result<Output> Output::decode(const std::string& payload) {
  Decoder d(payload);
  Output m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(uint8_t stream, d.u8());
  if (stream != 1 && stream != 2) return Error::make(Code::kProtocol, "unknown output stream");
  m.stream = static_cast<Stream>(stream);
  MOAT_ASSIGN(m.data, d.bytes());
  FINISH(d);
  return m;
}

std::string StdinData::encode() const { return Encoder().u32(id).bytes(data).take(); }
Result<StdinData> StdinData::decode(const std::string& payload) {
  Decoder d(payload);
  StdinData m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(m.data, d.bytes());
  FINISH(d);
  return m;
}

std::string ProcessRef::encode() const { return Encoder().u32(id).take(); }
Result<ProcessRef> ProcessRef::decode(const std::string& payload) {
  Decoder d(payload);
  ProcessRef m;
  MOAT_ASSIGN(m.id, d.u32());
  FINISH(d);
  return m;
}

std::string SignalRequest::encode() const { return Encoder().u32(id).i32(signo).u8(wholeGroup ? 1 : 0).take(); }
Result<SignalRequest> SignalRequest::decode(const std::string& payload) {
  Decoder d(payload);
  SignalRequest m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(m.signo, d.i32());
  MOAT_ASSIGN(uint8_t group, d.u8());
  FINISH(d);
  m.wholeGroup = group != 0;
  if (m.signo < 1 || m.signo > 64) return Error::make(Code::kProtocol, "signal out of range");
  return m;
}

std::string OutputCredit::encode() const { return Encoder().u32(id).u64(upTo).take(); }
Result<OutputCredit> OutputCredit::decode(const std::string& payload) {
  Decoder d(payload);
  OutputCredit m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(m.upTo, d.u64());
  FINISH(d);
  return m;
}

std::string StdinTaken::encode() const { return Encoder().u32(id).u64(total).take(); }
Result<StdinTaken> StdinTaken::decode(const std::string& payload) {
  Decoder d(payload);
  StdinTaken m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(m.total, d.u64());
  FINISH(d);
  return m;
}

uint8_t ExecPolicy::judge(const std::vector<std::string>& argv) const {
  uint8_t strictest = 0;
  for (const auto& layer : layers) {
    uint8_t decision = 2;  // no rule matched: deny
    for (const auto& rule : layer) {
      if (!rule.hasMatch || argvMatch(rule.match, argv)) {
        decision = rule.decision;
        break;
      }
    }
    strictest = std::max(strictest, decision);
  }
  return strictest;
}

std::string ExecPolicy::encodeV3() const { return Encoder().u8(mode == kAllowAll ? kAllowAll : kAsk).take(); }

std::string ExecPolicy::encode() const {
  Encoder e;
  e.u8(mode).u32(static_cast<uint32_t>(layers.size()));
  for (const auto& layer : layers) {
    e.u32(static_cast<uint32_t>(layer.size()));
    for (const auto& rule : layer) e.u8(rule.decision).u8(rule.hasMatch ? 1 : 0).strings(rule.match);
  }
  return e.take();
}
Result<ExecPolicy> ExecPolicy::decode(const std::string& payload) {
  Decoder d(payload);
  ExecPolicy m;
  MOAT_ASSIGN(m.mode, d.u8());
  if (m.mode > kLocal) return Error::make(Code::kProtocol, "unknown exec policy " + std::to_string(m.mode));
  if (payload.size() == 1 && m.mode != kLocal) return m;  // version 3's form
  MOAT_ASSIGN(uint32_t layers, d.u32());
  if (layers > kMaxLayers) return Error::make(Code::kProtocol, "too many exec policy layers");
  for (uint32_t i = 0; i < layers; ++i) {
    MOAT_ASSIGN(uint32_t rules, d.u32());
    if (rules > kMaxRules) return Error::make(Code::kProtocol, "too many exec policy rules");
    std::vector<ExecRule> layer;
    for (uint32_t j = 0; j < rules; ++j) {
      ExecRule rule;
      MOAT_ASSIGN(rule.decision, d.u8());
      MOAT_ASSIGN(uint8_t hasMatch, d.u8());
      MOAT_ASSIGN(rule.match, d.strings());
      if (rule.decision > 2 || hasMatch > 1) return Error::make(Code::kProtocol, "bad exec policy rule");
      rule.hasMatch = hasMatch == 1;
      layer.push_back(std::move(rule));
    }
    m.layers.push_back(std::move(layer));
  }
  FINISH(d);
  return m;
}

std::string ExecReport::encode() const {
  return Encoder().u32(pid).u8(decision).bytes(filename).strings(argv).strings(parents).take();
}
Result<ExecReport> ExecReport::decode(const std::string& payload) {
  Decoder d(payload);
  ExecReport m;
  MOAT_ASSIGN(m.pid, d.u32());
  MOAT_ASSIGN(m.decision, d.u8());
  if (m.decision != 0 && m.decision != 2) return Error::make(Code::kProtocol, "bad exec report decision");
  MOAT_ASSIGN(m.filename, d.bytes());
  MOAT_ASSIGN(m.argv, d.strings());
  MOAT_ASSIGN(m.parents, d.strings());
  FINISH(d);
  return m;
}

std::string ExecCheck::encode() const {
  return Encoder().u64(id).u32(pid).bytes(filename).strings(argv).strings(parents).take();
}
Result<ExecCheck> ExecCheck::decode(const std::string& payload) {
  Decoder d(payload);
  ExecCheck m;
  MOAT_ASSIGN(m.id, d.u64());
  MOAT_ASSIGN(m.pid, d.u32());
  MOAT_ASSIGN(m.filename, d.bytes());
  MOAT_ASSIGN(m.argv, d.strings());
  MOAT_ASSIGN(m.parents, d.strings());
  FINISH(d);
  return m;
}

std::string ExecVerdict::encode() const { return Encoder().u64(id).u8(allow ? 1 : 0).take(); }
Result<ExecVerdict> ExecVerdict::decode(const std::string& payload) {
  Decoder d(payload);
  ExecVerdict m;
  MOAT_ASSIGN(m.id, d.u64());
  MOAT_ASSIGN(uint8_t allow, d.u8());
  if (allow > 1) return Error::make(Code::kProtocol, "exec verdict is not 0 or 1");
  m.allow = allow == 1;
  FINISH(d);
  return m;
}

std::string Resize::encode() const { return Encoder().u32(id).u32(rows).u32(cols).take(); }
Result<Resize> Resize::decode(const std::string& payload) {
  Decoder d(payload);
  Resize m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(uint32_t rows, d.u32());
  MOAT_ASSIGN(uint32_t cols, d.u32());
  FINISH(d);
  if (rows < 1 || rows > 0xffff || cols < 1 || cols > 0xffff) {
    return Error::make(Code::kProtocol, "window size out of range");
  }
  m.rows = static_cast<uint16_t>(rows);
  m.cols = static_cast<uint16_t>(cols);
  return m;
}

std::string Exited::encode() const {
  uint8_t flags = (timedOut ? 1 : 0) | (stdoutTruncated ? 2 : 0) | (stderrTruncated ? 4 : 0);
  return Encoder().u32(id).i32(exitCode).i32(signal).u8(flags).u64(stdoutBytes).u64(stderrBytes).u64(durationUs).take();
}
Result<Exited> Exited::decode(const std::string& payload) {
  Decoder d(payload);
  Exited m;
  MOAT_ASSIGN(m.id, d.u32());
  MOAT_ASSIGN(m.exitCode, d.i32());
  MOAT_ASSIGN(m.signal, d.i32());
  MOAT_ASSIGN(uint8_t flags, d.u8());
  MOAT_ASSIGN(m.stdoutBytes, d.u64());
  MOAT_ASSIGN(m.stderrBytes, d.u64());
  MOAT_ASSIGN(m.durationUs, d.u64());
  FINISH(d);
  if (flags & ~7u) return Error::make(Code::kProtocol, "unknown exit flags");
  m.timedOut = flags & 1;
  m.stdoutTruncated = flags & 2;
  m.stderrTruncated = flags & 4;
  return m;
}

std::string FileRequest::encode() const {
  return Encoder()
      .u32(tag)
      .u8(static_cast<uint8_t>(op))
      .bytes(path)
      .bytes(target)
      .bytes(data)
      .u64(offset)
      .u64(length)
      .u32(mode)
      .u8(flags)
      .take();
}
Result<FileRequest> FileRequest::decode(const std::string& payload) {
  Decoder d(payload);
  FileRequest m;
  MOAT_ASSIGN(m.tag, d.u32());
  MOAT_ASSIGN(uint8_t op, d.u8());
  if (op < 1 || op > static_cast<uint8_t>(FileOp::kChanges))
    return Error::make(Code::kProtocol, "unknown file operation");
  m.op = static_cast<FileOp>(op);
  MOAT_ASSIGN(m.path, d.bytes());
  MOAT_ASSIGN(m.target, d.bytes());
  MOAT_ASSIGN(m.data, d.bytes());
  MOAT_ASSIGN(m.offset, d.u64());
  MOAT_ASSIGN(m.length, d.u64());
  MOAT_ASSIGN(m.mode, d.u32());
  MOAT_ASSIGN(m.flags, d.u8());
  FINISH(d);
  if (m.flags & ~(kFileCreateParents | kFileAppend | kFileRecursive | kFileSkipHoles)) {
    return Error::make(Code::kProtocol, "unknown file flags");
  }
  return m;
}

static void encodeInfo(Encoder& e, const FileInfo& info) {
  e.bytes(info.name).u8(info.type).u64(info.size).u32(info.mode).u64(info.mtimeSec);
}

static Result<FileInfo> decodeInfo(Decoder& d) {
  FileInfo info;
  MOAT_ASSIGN(info.name, d.bytes());
  MOAT_ASSIGN(info.type, d.u8());
  MOAT_ASSIGN(info.size, d.u64());
  MOAT_ASSIGN(info.mode, d.u32());
  MOAT_ASSIGN(info.mtimeSec, d.u64());
  return info;
}

std::string FileResult::encode() const {
  Encoder e;
  e.u32(tag).i32(err).bytes(message).bytes(data);
  encodeInfo(e, info);
  e.u32(static_cast<uint32_t>(entries.size()));
  for (const auto& entry : entries) encodeInfo(e, entry);
  e.u64(offset);
  return e.take();
}
Result<FileResult> FileResult::decode(const std::string& payload, uint32_t version) {
  Decoder d(payload);
  FileResult m;
  MOAT_ASSIGN(m.tag, d.u32());
  MOAT_ASSIGN(m.err, d.i32());
  MOAT_ASSIGN(m.message, d.bytes());
  MOAT_ASSIGN(m.data, d.bytes());
  MOAT_ASSIGN(m.info, decodeInfo(d));
  MOAT_ASSIGN(uint32_t count, d.u32());
  for (uint32_t i = 0; i < count; ++i) {
    MOAT_ASSIGN(FileInfo entry, decodeInfo(d));
    m.entries.push_back(std::move(entry));
  }
  if (version >= kSparseReadSince) {
    MOAT_ASSIGN(m.offset, d.u64());
  }
  FINISH(d);
  return m;
}

std::string encodeFrame(MsgType type, const std::string& payload) {
  std::string frame = Encoder().u32(static_cast<uint32_t>(payload.size() + 1)).take();
  frame.push_back(static_cast<char>(type));
  frame += payload;
  return frame;
}

Result<bool> FrameReader::next(Frame& out) {
  if (buffer_.size() < 4) return false;
  Decoder d(buffer_);
  MOAT_ASSIGN(uint32_t length, d.u32());
  if (length == 0 || length > kMaxFrame + 1) return Error::make(Code::kProtocol, "bad frame length");
  if (buffer_.size() - 4 < length) return false;
  out.type = static_cast<MsgType>(static_cast<uint8_t>(buffer_[4]));
  out.payload = buffer_.substr(5, length - 1);
  buffer_.erase(0, 4 + length);
  return true;
}

Status writeFrame(int fd, MsgType type, const std::string& payload) {
  if (payload.size() > kMaxFrame) return Error::make(Code::kProtocol, "frame too large");
  return writeFrames(fd, encodeFrame(type, payload));
}

Status writeFrames(int fd, const std::string& frame) {
  size_t off = 0;
  while (off < frame.size()) {
    ssize_t n = ::write(fd, frame.data() + off, frame.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno("write frame");
    }
    off += static_cast<size_t>(n);
  }
  return {};
}

Result<Frame> readFrame(int fd, FrameReader& reader) {
  Frame frame;
  for (;;) {
    MOAT_ASSIGN(bool have, reader.next(frame));
    if (have) return frame;
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno("read frame");
    }
    if (n == 0) return Error::make(Code::kEof, "peer closed the connection");
    reader.feed(buf, static_cast<size_t>(n));
  }
}

}  // namespace moat::init
