#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"

// What changed between two views of an overlay environment's files: the
// template's lower layer seen through a writable layer (an environment's,
// or a snapshot's), or through none (the template as it is). Only the
// writable layers are walked: whatever is in neither is the template's, the
// same on both sides. Every name is opened from its directory's descriptor,
// following no symlink and crossing no mount (os::openAt, kResolveStrict):
// the layers are written by environments, and a link planted in one leads
// nowhere here. Read only; for a person's review (docs/API.md, "Changes").
namespace moat::isolation::fs {

// A directory of an overlay view: its writable layer's and the lower's
// (either -1 when that layer has none there).
struct LayerView {
  int upperFd = -1;
  int lowerFd = -1;
};

struct LayerChange {
  std::string path;  // absolute, as the environment sees it
  enum class Kind { kAdded, kModified, kDeleted } kind = Kind::kAdded;
  char type = 'f';          // what it is now (deleted: what it was): f(ile), d(ir), l(ink), o(ther)
  uint64_t size = 0;        // now (files: bytes; links: the target's length)
  uint64_t sizeBefore = 0;  // before (modified, deleted)
  std::string modeChange;   // "0644 -> 0755" when only the mode differs, or both
  std::string target;       // a symlink's (now; deleted: before), as data: never followed
  std::string diff;         // a unified diff (files of text, within the limits)
  // Why there is none: "binary", "too_large", "too_different", "budget"
  // (the diffs' bytes are spent), "not_compared" (the request's reading
  // budget or time was spent before its bytes were compared: it may be
  // unchanged; it is listed so that nothing changed goes unseen).
  std::string diffOmitted;
};

struct LayerChangeLimits {
  size_t maxChanges = 5000;                   // beyond: truncated
  size_t maxDiffFileBytes = 256 << 10;        // a larger side: no diff ("too_large")
  size_t maxDiffBytes = 1 << 20;              // all diffs together ("budget")
  size_t maxListBytes = 4 << 20;              // paths and link targets together; beyond: truncated
  uint64_t maxCompareBytes = 256ull << 20;    // file bytes read to compare; beyond: "not_compared"
  std::chrono::milliseconds deadline{10000};  // the whole walk; beyond: truncated
  bool diffs = true;
  // What moat itself writes into every environment (its /etc/hostname and
  // /etc/hosts, a /workspace and /tmp the template lacks), by path: a file
  // holding exactly these bytes in `after` is no change, nor is a directory
  // listed with "/" added (its contents still are).
  std::map<std::string, std::string> baseline;
};

struct LayerChanges {
  std::vector<LayerChange> changes;  // in path order
  // The list is not all there is: more changes than maxChanges, a budget or
  // the deadline spent, or names that went while they were read.
  bool truncated = false;
};

// The changes from `before` to `after`, both views of the same lower
// layer's root.
Result<LayerChanges> compareLayers(LayerView before, LayerView after, const LayerChangeLimits& limits = {});

}  // namespace moat::isolation::fs
