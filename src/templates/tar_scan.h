#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

// Counts what a layer's tar stream would make, before anything of it is
// unpacked: an image is untrusted input, and its size, its number of
// entries and what kinds of files it holds are checked against moatd's
// limits here (umoci, which unpacks it afterwards, has none).
namespace moat::templates {

struct LayerLimits {
  uint64_t maxBytes = 0;    // file data, summed over every layer
  uint64_t maxEntries = 0;  // entries (files, directories, links...), summed over every layer
};

// What the layers seen so far hold.
struct LayerTally {
  uint64_t bytes = 0;
  uint64_t entries = 0;
  uint64_t devices = 0;   // character and block devices (dropped after the unpack)
  uint64_t escaping = 0;  // names with ".." or a leading "/" (umoci keeps them inside; counted)
};

// A tar stream fed in pieces of any size. Understands ustar, GNU long
// names and links, and pax headers (their size and path override the
// header's); refuses sparse files (their real size is not the data's).
class TarScanner {
 public:
  TarScanner(LayerLimits limits, LayerTally& tally, std::string layer)
      : limits_(limits), tally_(tally), layer_(std::move(layer)) {}
  // An error (code "too_large" for a limit, "invalid_argument" for a
  // malformed or refused stream) stops the scan.
  Status feed(std::string_view data);
  // At the end of the stream: an error if it stopped inside an entry.
  Status finish() const;

 private:
  Status header(const char* block);
  Status entry(char type, uint64_t size, const std::string& name);

  LayerLimits limits_;
  LayerTally& tally_;
  std::string layer_;
  std::string pending_;    // a block not yet complete
  uint64_t skip_ = 0;      // data bytes of the current entry still to pass
  uint64_t padding_ = 0;   // then its padding to 512
  char collecting_ = 0;    // 'L', 'K', 'x', 'g': the data is a header's, kept
  std::string collected_;  // ... here
  std::string longName_;   // from a GNU 'L' entry, for the next one
  std::string paxPath_;    // from a pax 'x' header, for the next one
  int64_t paxSize_ = -1;   // ... its size
  bool ended_ = false;     // two zero blocks seen
  int zeroBlocks_ = 0;
};

// The size field of a tar header: octal, or base-256 (GNU) when its first
// byte has the high bit set. Exposed for tests.
Result<uint64_t> tarNumber(std::string_view field);

}  // namespace moat::templates
