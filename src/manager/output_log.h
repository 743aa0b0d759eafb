#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace moat::manager {

enum class OutputStream : uint8_t { kStdout = 1, kStderr = 2 };

// One piece of what a process printed, or a range that is no longer retained.
struct OutputItem {
  bool dropped = false;                         // true: `length` bytes at `offset` fell out of the log
  OutputStream stream = OutputStream::kStdout;  // for data items
  uint64_t offset = 0;                          // position of the first byte in the process's output
  uint64_t length = 0;                          // dropped items
  std::string data;                             // data items
};

// What moatd keeps of a process's output so that clients can attach, detach
// and read again from an offset. Both streams share one offset space (the
// order in which moat-init forwarded the bytes); each stream keeps at most
// `capPerStream` bytes, oldest first out. Not thread-safe: Process guards it.
class OutputLog {
 public:
  explicit OutputLog(size_t capPerStream) : cap_(capPerStream) {}

  void append(OutputStream stream, const std::string& data);
  // Raises what each stream keeps (never lowers it).
  void keepAtLeast(size_t capPerStream) { cap_ = std::max(cap_, capPerStream); }
  // Offset after the last byte ever appended.
  uint64_t end() const { return end_; }
  uint64_t bytes(OutputStream stream) const { return total_[index(stream)]; }
  uint64_t droppedBytes(OutputStream stream) const { return dropped_[index(stream)]; }
  // Items covering [since, end) in order, at most about `maxBytes` of data;
  // ranges that were evicted come back as dropped items, never silently.
  std::vector<OutputItem> read(uint64_t since, size_t maxBytes) const;
  // Everything retained of one stream, concatenated (for blocking exec).
  std::string collect(OutputStream stream) const;
  // The same, moved out: each chunk's memory is released as it is copied,
  // so a large exec result is not held twice. The counters stay; the taken
  // range reads back as dropped.
  std::string take(OutputStream stream);

 private:
  struct Chunk {
    uint64_t offset;
    OutputStream stream;
    std::string data;
  };
  static size_t index(OutputStream s) { return s == OutputStream::kStdout ? 0 : 1; }
  void evict(OutputStream stream);

  size_t cap_;
  std::deque<Chunk> chunks_;
  uint64_t end_ = 0;
  uint64_t retained_[2] = {0, 0};
  uint64_t total_[2] = {0, 0};
  uint64_t dropped_[2] = {0, 0};
};

}  // namespace moat::manager
