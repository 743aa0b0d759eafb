#include "templates/tar_scan.h"

#include <algorithm>
#include <cstring>

namespace moat::templates {

namespace {

constexpr size_t kBlock = 512;
// A pax or GNU long-name header's data is kept whole: bounded.
constexpr uint64_t kMaxMetaBytes = 1 << 20;

std::string field(const char* block, size_t offset, size_t size) {
  const char* start = block + offset;
  const char* end = static_cast<const char*>(std::memchr(start, '\0', size));
  return std::string(start, end ? static_cast<size_t>(end - start) : size);
}

bool escapes(const std::string& name) {
  if (!name.empty() && name[0] == '/') return true;
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    if (slash == std::string::npos) slash = name.size();
    if (name.compare(start, slash - start, "..") == 0 && slash - start == 2) return true;
    start = slash + 1;
  }
  return false;
}

}  // namespace

Result<uint64_t> tarNumber(std::string_view f) {
  if (!f.empty() && (static_cast<unsigned char>(f[0]) & 0x80)) {
    if (static_cast<unsigned char>(f[0]) & 0x40) return Error::make(Code::kInvalidArgument, "negative size");
    uint64_t v = static_cast<unsigned char>(f[0]) & 0x3f;
    for (size_t i = 1; i < f.size(); ++i) {
      if (v >> 56) return Error::make(Code::kInvalidArgument, "size out of range");
      v = (v << 8) | static_cast<unsigned char>(f[i]);
    }
    return v;
  }
  uint64_t v = 0;
  size_t i = 0;
  while (i < f.size() && (f[i] == ' ' || f[i] == '\0')) ++i;
  for (; i < f.size() && f[i] >= '0' && f[i] <= '7'; ++i) {
    if (v >> 60) return Error::make(Code::kInvalidArgument, "size out of range");
    v = v * 8 + static_cast<uint64_t>(f[i] - '0');
  }
  for (; i < f.size(); ++i) {
    if (f[i] != ' ' && f[i] != '\0') return Error::make(Code::kInvalidArgument, "a number field that is not octal");
  }
  return v;
}

Status TarScanner::feed(std::string_view data) {
  while (!data.empty()) {
    if (ended_) return {};  // what follows the end marker is never read by an unpacker
    if (skip_ > 0) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(skip_, data.size()));
      if (collecting_) collected_.append(data.substr(0, n));
      skip_ -= n;
      data.remove_prefix(n);
      if (skip_ == 0 && collecting_) {
        char kind = collecting_;
        collecting_ = 0;
        if (kind == 'L') {
          longName_ = collected_.substr(0, collected_.find('\0'));
        } else if (kind == 'x') {
          // "<len> <key>=<value>\n" records.
          size_t pos = 0;
          while (pos < collected_.size()) {
            size_t space = collected_.find(' ', pos);
            if (space == std::string::npos) break;
            uint64_t len = 0;
            for (size_t i = pos; i < space; ++i) {
              if (collected_[i] < '0' || collected_[i] > '9' || len > kMaxMetaBytes) {
                return Error::make(Code::kInvalidArgument, layer_ + ": a malformed pax header");
              }
              len = len * 10 + static_cast<uint64_t>(collected_[i] - '0');
            }
            if (len == 0 || pos + len > collected_.size()) {
              return Error::make(Code::kInvalidArgument, layer_ + ": a malformed pax header");
            }
            std::string record = collected_.substr(space + 1, pos + len - space - 2);
            size_t eq = record.find('=');
            if (eq != std::string::npos) {
              std::string key = record.substr(0, eq);
              std::string value = record.substr(eq + 1);
              if (key == "path") paxPath_ = value;
              if (key == "size") {
                uint64_t size = 0;
                for (char c : value) {
                  if (c < '0' || c > '9' || size > (UINT64_MAX / 10)) {
                    return Error::make(Code::kInvalidArgument, layer_ + ": a pax size that is not a number");
                  }
                  size = size * 10 + static_cast<uint64_t>(c - '0');
                }
                paxSize_ = static_cast<int64_t>(std::min<uint64_t>(size, INT64_MAX));
              }
              if (key.rfind("GNU.sparse.", 0) == 0) {
                return Error::make(Code::kInvalidArgument, layer_ + ": sparse files are refused");
              }
            }
            pos += len;
          }
        }
        collected_.clear();
      }
      continue;
    }
    if (padding_ > 0) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(padding_, data.size()));
      padding_ -= n;
      data.remove_prefix(n);
      continue;
    }
    size_t want = kBlock - pending_.size();
    size_t n = std::min(want, data.size());
    pending_.append(data.substr(0, n));
    data.remove_prefix(n);
    if (pending_.size() == kBlock) {
      std::string block = std::move(pending_);
      pending_.clear();
      MOAT_TRY(header(block.data()));
    }
  }
  return {};
}

Status TarScanner::header(const char* block) {
  if (std::all_of(block, block + kBlock, [](char c) { return c == '\0'; })) {
    if (++zeroBlocks_ >= 2) ended_ = true;
    return {};
  }
  zeroBlocks_ = 0;
  // The checksum: the header's bytes with the checksum field as spaces.
  MOAT_ASSIGN(uint64_t stored, tarNumber(std::string_view(block + 148, 8)));
  uint64_t sum = 0;
  for (size_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(block[i]);
  if (sum != stored)
    return Error::make(Code::kInvalidArgument, layer_ + ": not a tar stream (a header's checksum is wrong)");
  MOAT_ASSIGN(uint64_t size, tarNumber(std::string_view(block + 124, 12)));
  const char type = block[156];
  std::string name = field(block, 0, 100);
  if (std::memcmp(block + 257, "ustar", 5) == 0) {
    std::string prefix = field(block, 345, 155);
    if (!prefix.empty()) name = prefix + "/" + name;
  }
  if (type == 'L' || type == 'K' || type == 'x' || type == 'g') {
    if (size > kMaxMetaBytes)
      return Error::make(Code::kInvalidArgument, layer_ + ": a long name or pax header over 1 MiB");
    collecting_ = size > 0 ? type : 0;
    collected_.clear();
    skip_ = size;
    padding_ = (kBlock - size % kBlock) % kBlock;
    return {};
  }
  if (!longName_.empty()) name = std::move(longName_);
  if (!paxPath_.empty()) name = std::move(paxPath_);
  if (paxSize_ >= 0) size = static_cast<uint64_t>(paxSize_);
  longName_.clear();
  paxPath_.clear();
  paxSize_ = -1;
  MOAT_TRY(entry(type, size, name));
  // Hard links, symlinks, directories, devices and FIFOs have no data;
  // anything else (regular files and types unknown) has `size` bytes.
  const bool hasData = !(type == '1' || type == '2' || type == '3' || type == '4' || type == '5' || type == '6');
  skip_ = hasData ? size : 0;
  padding_ = hasData ? (kBlock - size % kBlock) % kBlock : 0;
  return {};
}

Status TarScanner::entry(char type, uint64_t size, const std::string& name) {
  if (type == 'S') return Error::make(Code::kInvalidArgument, layer_ + ": sparse files are refused (" + name + ")");
  ++tally_.entries;
  if (type == '3' || type == '4') ++tally_.devices;
  if (escapes(name)) ++tally_.escaping;
  const bool hasData = !(type == '1' || type == '2' || type == '3' || type == '4' || type == '5' || type == '6');
  if (hasData) tally_.bytes += size;
  if (limits_.maxEntries && tally_.entries > limits_.maxEntries) {
    return Error::make(Code::kTooLarge, "the image has more than " + std::to_string(limits_.maxEntries) +
                                            " files (the limit on entries; moatd --template-max-files)");
  }
  if (limits_.maxBytes && tally_.bytes > limits_.maxBytes) {
    return Error::make(Code::kTooLarge, "the image's files hold more than " + std::to_string(limits_.maxBytes) +
                                            " bytes (the limit on size; moatd --template-max-bytes)");
  }
  return {};
}

Status TarScanner::finish() const {
  if (skip_ > 0 || padding_ > 0 || !pending_.empty()) {
    return Error::make(Code::kInvalidArgument, layer_ + ": the tar stream ends inside an entry");
  }
  return {};
}

}  // namespace moat::templates
