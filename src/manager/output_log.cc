#include "manager/output_log.h"

#include <algorithm>

namespace moat::manager {
namespace {

// Small writes (a prompt, one line at a time) are merged so that the log's
// bookkeeping stays small next to the bytes it holds.
constexpr size_t kMergeBelow = 4096;

}  // namespace

void OutputLog::append(OutputStream stream, const std::string& data) {
  if (data.empty()) return;
  size_t i = index(stream);
  total_[i] += data.size();
  if (!chunks_.empty() && chunks_.back().stream == stream && chunks_.back().data.size() < kMergeBelow) {
    chunks_.back().data += data;
  } else {
    chunks_.push_back(Chunk{end_, stream, data});
  }
  end_ += data.size();
  retained_[i] += data.size();
  evict(stream);
}

void OutputLog::evict(OutputStream stream) {
  size_t i = index(stream);
  while (retained_[i] > cap_) {
    auto it = std::find_if(chunks_.begin(), chunks_.end(), [&](const Chunk& c) { return c.stream == stream; });
    if (it == chunks_.end()) return;
    uint64_t excess = retained_[i] - cap_;
    if (excess < it->data.size()) {
      // Keep the newest part of a large chunk: the cap holds to the byte.
      it->data.erase(0, excess);
      it->offset += excess;
      retained_[i] -= excess;
      dropped_[i] += excess;
      return;
    }
    retained_[i] -= it->data.size();
    dropped_[i] += it->data.size();
    chunks_.erase(it);
  }
}

std::vector<OutputItem> OutputLog::read(uint64_t since, size_t maxBytes) const {
  std::vector<OutputItem> items;
  uint64_t pos = std::min(since, end_);
  size_t budget = maxBytes;
  // Chunks are in offset order; skip those that end before `pos`.
  auto it = std::lower_bound(chunks_.begin(), chunks_.end(), pos,
                             [](const Chunk& c, uint64_t p) { return c.offset + c.data.size() <= p; });
  for (; it != chunks_.end() && budget > 0; ++it) {
    if (it->offset > pos) {
      items.push_back(OutputItem{true, it->stream, pos, it->offset - pos, {}});
      pos = it->offset;
    }
    size_t skip = static_cast<size_t>(pos - it->offset);
    size_t take = std::min(it->data.size() - skip, budget);
    items.push_back(OutputItem{false, it->stream, pos, 0, it->data.substr(skip, take)});
    pos += take;
    budget -= take;
  }
  if (budget > 0 && pos < end_) {
    items.push_back(OutputItem{true, OutputStream::kStdout, pos, end_ - pos, {}});
  }
  return items;
}

std::string OutputLog::collect(OutputStream stream) const {
  std::string out;
  for (const auto& c : chunks_) {
    if (c.stream == stream) out += c.data;
  }
  return out;
}

std::string OutputLog::take(OutputStream stream) {
  std::string out;
  out.reserve(static_cast<size_t>(retained_[index(stream)]));
  for (auto& c : chunks_) {
    if (c.stream != stream) continue;
    out += c.data;
    std::string().swap(c.data);
  }
  std::erase_if(chunks_, [&](const Chunk& c) { return c.stream == stream; });
  retained_[index(stream)] = 0;
  return out;
}

}  // namespace moat::manager
