#include "init/changes_wire.h"

#include <cstring>

#include "init/protocol.h"

namespace moat::init {

using isolation::fs::LayerChange;
using isolation::fs::LayerChangeLimits;
using isolation::fs::LayerChanges;

std::string encodeChangeLimits(const LayerChangeLimits& limits) {
  Encoder e;
  e.u64(limits.maxChanges)
      .u64(limits.maxDiffFileBytes)
      .u64(limits.maxDiffBytes)
      .u64(limits.maxListBytes)
      .u64(limits.maxCompareBytes)
      .u64(static_cast<uint64_t>(limits.deadline.count()))
      .u8(limits.diffs ? 1 : 0)
      .u32(static_cast<uint32_t>(limits.baseline.size()));
  for (const auto& [path, content] : limits.baseline) e.bytes(path).bytes(content);
  return e.take();
}

Result<LayerChangeLimits> decodeChangeLimits(const std::string& data) {
  Decoder d(data);
  LayerChangeLimits limits;
  MOAT_ASSIGN(uint64_t changes, d.u64());
  MOAT_ASSIGN(uint64_t diffFile, d.u64());
  MOAT_ASSIGN(uint64_t diffs, d.u64());
  MOAT_ASSIGN(uint64_t list, d.u64());
  MOAT_ASSIGN(uint64_t compare, d.u64());
  MOAT_ASSIGN(uint64_t deadlineMs, d.u64());
  MOAT_ASSIGN(uint8_t withDiffs, d.u8());
  MOAT_ASSIGN(uint32_t baseline, d.u32());
  limits.maxChanges = changes;
  limits.maxDiffFileBytes = diffFile;
  limits.maxDiffBytes = diffs;
  limits.maxListBytes = list;
  limits.maxCompareBytes = compare;
  limits.deadline = std::chrono::milliseconds(deadlineMs);
  limits.diffs = withDiffs != 0;
  for (uint32_t i = 0; i < baseline; ++i) {
    MOAT_ASSIGN(std::string path, d.bytes());
    MOAT_ASSIGN(std::string content, d.bytes());
    limits.baseline[path] = content;
  }
  if (!d.done()) return Error::make(Code::kProtocol, "trailing bytes in change limits");
  return limits;
}

std::string encodeChanges(const LayerChanges& changes) {
  Encoder e;
  e.u8(changes.truncated ? 1 : 0).u32(static_cast<uint32_t>(changes.changes.size()));
  for (const LayerChange& c : changes.changes) {
    e.bytes(c.path)
        .u8(static_cast<uint8_t>(c.kind))
        .u8(static_cast<uint8_t>(c.type))
        .u64(c.size)
        .u64(c.sizeBefore)
        .bytes(c.modeChange)
        .bytes(c.target)
        .bytes(c.diff)
        .bytes(c.diffOmitted);
  }
  return e.take();
}

Result<LayerChanges> decodeChanges(const std::string& data, size_t maxChanges) {
  Decoder d(data);
  LayerChanges out;
  MOAT_ASSIGN(uint8_t truncated, d.u8());
  MOAT_ASSIGN(uint32_t count, d.u32());
  if (truncated > 1) return Error::make(Code::kProtocol, "changes: bad truncated flag");
  if (count > maxChanges) {
    return Error::make(Code::kProtocol, "changes: " + std::to_string(count) + " entries, more than the " +
                                            std::to_string(maxChanges) + " asked for");
  }
  out.truncated = truncated != 0;
  for (uint32_t i = 0; i < count; ++i) {
    LayerChange c;
    MOAT_ASSIGN(c.path, d.bytes());
    MOAT_ASSIGN(uint8_t kind, d.u8());
    MOAT_ASSIGN(uint8_t type, d.u8());
    MOAT_ASSIGN(c.size, d.u64());
    MOAT_ASSIGN(c.sizeBefore, d.u64());
    MOAT_ASSIGN(c.modeChange, d.bytes());
    MOAT_ASSIGN(c.target, d.bytes());
    MOAT_ASSIGN(c.diff, d.bytes());
    MOAT_ASSIGN(c.diffOmitted, d.bytes());
    if (c.path.empty() || c.path[0] != '/' || c.path.find('\0') != std::string::npos) {
      return Error::make(Code::kProtocol, "changes: a path that is not absolute");
    }
    if (kind > static_cast<uint8_t>(LayerChange::Kind::kDeleted)) {
      return Error::make(Code::kProtocol, "changes: unknown kind " + std::to_string(kind));
    }
    if (type == 0 || std::strchr("fdlo", static_cast<char>(type)) == nullptr) {
      return Error::make(Code::kProtocol, "changes: unknown type " + std::to_string(type));
    }
    c.kind = static_cast<LayerChange::Kind>(kind);
    c.type = static_cast<char>(type);
    out.changes.push_back(std::move(c));
  }
  if (!d.done()) return Error::make(Code::kProtocol, "trailing bytes in changes");
  return out;
}

}  // namespace moat::init
