// moat-init's protocol (src/init/protocol.h): both ends treat the other as
// untrusted, so every byte stream must come out as whole frames or an error,
// and every decoder must refuse what it cannot read, never read past it.
//
// Input: a stream of frames. It is fed to a FrameReader in two pieces (split
// where the first byte says), and each frame's payload goes to the decoder of
// its type; every payload is also tried with every decoder (and as a guest's
// list of changes). A message that
// decodes must encode to something that decodes to the same encoding again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "init/changes_wire.h"
#include "init/protocol.h"

using namespace moat::init;

namespace {

[[noreturn]] void fail(const char* what) {
  __builtin_printf("init_protocol: %s\n", what);
  std::abort();
}

template <class T>
void roundTrip(const std::string& payload) {
  auto first = T::decode(payload);
  if (!first.ok()) return;
  std::string encoded = first.value().encode();
  auto second = T::decode(encoded);
  if (!second.ok()) fail("a decoded message does not decode after encoding");
  if (second.value().encode() != encoded) fail("encode(decode(encode(m))) differs from encode(m)");
}

// A microVM guest's list of changed files (FileOp kChanges) and the limits
// sent with it: decoded as untrusted, and stable across a round trip.
void changes(const std::string& payload) {
  if (auto list = decodeChanges(payload, 100000); list.ok()) {
    std::string encoded = encodeChanges(list.value());
    auto again = decodeChanges(encoded, 100000);
    if (!again.ok() || encodeChanges(again.value()) != encoded) fail("a list of changes does not round-trip");
  }
  if (auto limits = decodeChangeLimits(payload); limits.ok()) {
    std::string encoded = encodeChangeLimits(limits.value());
    auto again = decodeChangeLimits(encoded);
    if (!again.ok() || encodeChangeLimits(again.value()) != encoded) fail("change limits do not round-trip");
  }
}

void everyDecoder(const std::string& payload) {
  changes(payload);
  roundTrip<Hello>(payload);
  roundTrip<SpawnRequest>(payload);
  roundTrip<Spawned>(payload);
  roundTrip<SpawnFailed>(payload);
  roundTrip<Output>(payload);
  roundTrip<StdinData>(payload);
  roundTrip<ProcessRef>(payload);
  roundTrip<SignalRequest>(payload);
  roundTrip<Resize>(payload);
  roundTrip<OutputCredit>(payload);
  roundTrip<StdinTaken>(payload);
  roundTrip<ExecPolicy>(payload);
  roundTrip<ExecCheck>(payload);
  roundTrip<ExecVerdict>(payload);
  roundTrip<ExecReport>(payload);
  roundTrip<Exited>(payload);
  roundTrip<FileRequest>(payload);
  roundTrip<FileResult>(payload);
}

void decodeAs(MsgType type, const std::string& payload) {
  switch (type) {
    case MsgType::kSpawn:
      roundTrip<SpawnRequest>(payload);
      break;
    case MsgType::kStdin:
      roundTrip<StdinData>(payload);
      break;
    case MsgType::kCloseStdin:
      roundTrip<ProcessRef>(payload);
      break;
    case MsgType::kSignal:
      roundTrip<SignalRequest>(payload);
      break;
    case MsgType::kResize:
      roundTrip<Resize>(payload);
      break;
    case MsgType::kOutputCredit:
      roundTrip<OutputCredit>(payload);
      break;
    case MsgType::kStdinTaken:
      roundTrip<StdinTaken>(payload);
      break;
    case MsgType::kExecPolicy:
      roundTrip<ExecPolicy>(payload);
      break;
    case MsgType::kExecCheck:
      roundTrip<ExecCheck>(payload);
      break;
    case MsgType::kExecVerdict:
      roundTrip<ExecVerdict>(payload);
      break;
    case MsgType::kExecReport:
      roundTrip<ExecReport>(payload);
      break;
    case MsgType::kFile:
      roundTrip<FileRequest>(payload);
      break;
    case MsgType::kHello:
      roundTrip<Hello>(payload);
      break;
    case MsgType::kSpawned:
      roundTrip<Spawned>(payload);
      break;
    case MsgType::kSpawnFailed:
      roundTrip<SpawnFailed>(payload);
      break;
    case MsgType::kOutput:
      roundTrip<Output>(payload);
      break;
    case MsgType::kExited:
      roundTrip<Exited>(payload);
      break;
    case MsgType::kFileResult:
      roundTrip<FileResult>(payload);
      break;
    default:
      break;
  }
}

// The primitives on their own: reads stop at the end, never past it.
void primitives(const std::string& data) {
  Decoder d(data);
  for (size_t i = 0; i < data.size() + 1 && !d.done(); ++i) {
    uint8_t op = static_cast<uint8_t>(data[i % data.size()]) % 6;
    bool ok = true;
    switch (op) {
      case 0:
        ok = d.u8().ok();
        break;
      case 1:
        ok = d.u32().ok();
        break;
      case 2:
        ok = d.u64().ok();
        break;
      case 3:
        ok = d.i32().ok();
        break;
      case 4:
        ok = d.bytes().ok();
        break;
      case 5:
        ok = d.strings().ok();
        break;
    }
    if (!ok) break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  if (!input.empty()) primitives(input);
  everyDecoder(input);

  FrameReader reader;
  size_t split = size == 0 ? 0 : data[0] % (size + 1);
  reader.feed(input.data(), split);
  Frame frame;
  bool fedRest = false;
  for (int frames = 0; frames < 64; ++frames) {
    auto next = reader.next(frame);
    if (!next.ok()) break;  // a corrupt stream: the connection ends
    if (!next.value()) {
      if (fedRest) break;
      reader.feed(input.data() + split, size - split);
      fedRest = true;
      continue;
    }
    if (frame.payload.size() > kMaxFrame) fail("a frame larger than kMaxFrame");
    decodeAs(frame.type, frame.payload);
    // What comes out must go back in as the same frame.
    std::string again = encodeFrame(frame.type, frame.payload);
    FrameReader check;
    check.feed(again.data(), again.size());
    Frame same;
    auto got = check.next(same);
    if (!got.ok() || !got.value() || same.type != frame.type || same.payload != frame.payload) {
      fail("encodeFrame does not read back as the same frame");
    }
  }
  return 0;
}
