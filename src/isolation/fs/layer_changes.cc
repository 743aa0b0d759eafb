#include "isolation/fs/layer_changes.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>

#include "common/unified_diff.h"
#include "common/unique_fd.h"
#include "os/tree.h"

namespace moat::isolation::fs {
namespace {

constexpr uint64_t kResolve = os::kResolveStrict | RESOLVE_NO_XDEV;
constexpr size_t kMaxNamesPerDirectory = 100000;
constexpr int kMaxDepth = 128;

// One name as a view shows it.
struct Entry {
  bool present = false;
  struct stat st {};
  int dirFd = -1;  // the layer directory it is in
  bool upper = false;
  bool vanished = false;  // listed in the writable layer, gone when looked at
};

char typeOf(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return 'f';
  if (S_ISDIR(st.st_mode)) return 'd';
  if (S_ISLNK(st.st_mode)) return 'l';
  return 'o';
}

bool whiteout(const struct stat& st) { return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0); }

// listed: the name was in the view's writable layer when it was listed.
Entry entryOf(const LayerView& view, const std::string& name, bool listed) {
  Entry e;
  if (view.upperFd >= 0) {
    auto st = os::statAt(view.upperFd, name);
    if (!st.ok() && listed) e.vanished = true;
    if (st.ok()) {
      if (whiteout(st.value())) return e;  // deleted in this view
      e.present = true;
      e.st = st.value();
      e.dirFd = view.upperFd;
      e.upper = true;
      return e;
    }
  }
  if (view.lowerFd >= 0) {
    auto st = os::statAt(view.lowerFd, name);
    if (st.ok()) {
      e.present = true;
      e.st = st.value();
      e.dirFd = view.lowerFd;
    }
  }
  return e;
}

// Host root mounts the overlay (not with userxattr): only the trusted
// attribute counts, which the environment cannot set.
bool opaque(int dirFd) {
  auto v = os::xattrFd(dirFd, "trusted.overlay.opaque");
  return v.ok() && v.value() == "y";
}

// The view of directory `name` below `view`, given that `entry` (a
// directory) is what the view shows there. Opened descriptors go to `held`.
LayerView subView(const LayerView& view, const Entry& entry, const std::string& name, std::vector<UniqueFd>& held) {
  LayerView sub;
  auto openDir = [&](int parent) -> int {
    auto fd = os::openAt(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, kResolve);
    if (!fd.ok()) return -1;
    held.push_back(std::move(fd.value()));
    return held.back().get();
  };
  if (!entry.present || !S_ISDIR(entry.st.st_mode)) return sub;
  bool hidesLower = false;
  if (entry.upper) {
    sub.upperFd = openDir(view.upperFd);
    hidesLower = sub.upperFd >= 0 && opaque(sub.upperFd);
  }
  if (view.lowerFd >= 0 && !hidesLower) {
    auto st = os::statAt(view.lowerFd, name);
    if (st.ok() && S_ISDIR(st->st_mode)) sub.lowerFd = openDir(view.lowerFd);
  }
  return sub;
}

std::optional<std::string> readRegular(const Entry& e, const std::string& name, size_t maxBytes, bool& truncated) {
  auto fd = os::openAt(e.dirFd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, kResolve);
  if (!fd.ok()) return std::nullopt;
  auto st = os::statFd(fd->get());
  if (!st.ok() || !S_ISREG(st->st_mode)) return std::nullopt;  // replaced meanwhile
  auto bytes = os::readUpTo(fd->get(), maxBytes);
  if (!bytes.ok()) return std::nullopt;
  truncated = bytes->truncated;
  return std::move(bytes->data);
}

enum class Same { kYes, kNo, kUnknown };

bool sameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

// Whether two regular files hold the same bytes, read side by side from
// `budget` (unknown once it is spent).
Same sameBytes(const Entry& a, const Entry& b, const std::string& name, uint64_t& budget) {
  if (a.st.st_size != b.st.st_size) return Same::kNo;
  // A snapshot's file that its environment has not touched since: the same
  // inode in another subvolume, with the change time only the kernel sets.
  if (a.st.st_dev != b.st.st_dev && a.st.st_ino == b.st.st_ino && sameTime(a.st.st_ctim, b.st.st_ctim) &&
      sameTime(a.st.st_mtim, b.st.st_mtim)) {
    return Same::kYes;
  }
  auto fa = os::openAt(a.dirFd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, kResolve);
  auto fb = os::openAt(b.dirFd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, kResolve);
  if (!fa.ok() || !fb.ok()) return Same::kNo;
  auto sa = os::statFd(fa->get());
  auto sb = os::statFd(fb->get());
  if (!sa.ok() || !sb.ok() || !S_ISREG(sa->st_mode) || !S_ISREG(sb->st_mode)) return Same::kNo;
  // Both read whole (a sparse file's holes too), or not at all.
  const uint64_t cost = 2 * static_cast<uint64_t>(sa->st_size);
  if (cost > budget) return Same::kUnknown;
  budget -= cost;
  constexpr size_t kChunk = 1 << 16;
  for (uint64_t left = static_cast<uint64_t>(sa->st_size) + 1;;) {
    auto ca = os::readExactly(fa->get(), kChunk);
    auto cb = os::readExactly(fb->get(), kChunk);
    if (!ca.ok() || !cb.ok() || ca.value() != cb.value()) return Same::kNo;
    if (ca->empty()) return Same::kYes;
    // Grown while read: more than was paid for.
    if (ca->size() >= left) return Same::kUnknown;
    left -= ca->size();
  }
}

std::string octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

class Walk {
 public:
  explicit Walk(const LayerChangeLimits& limits)
      : limits_(limits),
        compareBudget_(limits.maxCompareBytes),
        deadline_(std::chrono::steady_clock::now() + limits.deadline) {}
  LayerChanges result;

  // Compares directory `path` ("" for the root) as the two views show it.
  void directory(const std::string& path, const LayerView& before, const LayerView& after, int depth) {
    if (full()) return;
    if (depth > kMaxDepth) {
      result.truncated = true;
      return;
    }
    std::set<std::string> names;
    auto add = [&](int fd, std::set<std::string>* listed) {
      if (fd < 0) return;
      auto list = os::listDirFd(fd, kMaxNamesPerDirectory);
      if (!list.ok()) {
        result.truncated = true;
        return;
      }
      names.insert(list->begin(), list->end());
      if (listed) listed->insert(list->begin(), list->end());
    };
    std::set<std::string> inBefore;
    std::set<std::string> inAfter;
    add(before.upperFd, &inBefore);
    add(after.upperFd, &inAfter);
    // The template's own names differ only where one view hides them.
    if ((before.lowerFd >= 0) != (after.lowerFd >= 0))
      add(before.lowerFd >= 0 ? before.lowerFd : after.lowerFd, nullptr);
    for (const std::string& name : names) {
      if (full()) return;
      one(path + "/" + name, name, before, after, depth, inBefore.count(name) > 0, inAfter.count(name) > 0);
    }
  }

 private:
  bool full() {
    if (result.changes.size() < limits_.maxChanges && listBytes_ <= limits_.maxListBytes &&
        std::chrono::steady_clock::now() < deadline_) {
      return false;
    }
    result.truncated = true;
    return true;
  }

  void one(const std::string& path, const std::string& name, const LayerView& before, const LayerView& after, int depth,
           bool listedBefore, bool listedAfter) {
    const Entry a = entryOf(before, name, listedBefore);
    const Entry b = entryOf(after, name, listedAfter);
    if (a.vanished || b.vanished) result.truncated = true;  // it went while the walk read the tree
    if (!a.present && !b.present) return;
    if (a.present && b.present && !a.upper && !b.upper) return;  // the template's, on both sides
    std::vector<UniqueFd> held;
    const char ta = a.present ? typeOf(a.st) : 0;
    const char tb = b.present ? typeOf(b.st) : 0;
    if (auto own = limits_.baseline.find(path); own != limits_.baseline.end() && b.present) {
      if (tb == 'd' && own->second == "/" && !a.present) {  // moat made it: only what is in it
        directory(path, LayerView{}, subView(after, b, name, held), depth + 1);
        return;
      }
      bool cut = false;
      if (tb == 'f' && readRegular(b, name, own->second.size(), cut) == own->second && !cut) return;
    }
    if (ta != tb) {
      if (a.present) {
        report(path, LayerChange::Kind::kDeleted, &a, nullptr, name);
        if (ta == 'd') directory(path, subView(before, a, name, held), LayerView{}, depth + 1);
      }
      if (b.present) {
        report(path, LayerChange::Kind::kAdded, nullptr, &b, name);
        if (tb == 'd') directory(path, LayerView{}, subView(after, b, name, held), depth + 1);
      }
      return;
    }
    const bool modeDiffers = (a.st.st_mode & 07777) != (b.st.st_mode & 07777) && tb != 'l';
    bool differs = modeDiffers;
    bool unread = false;
    if (tb == 'f' && !differs) {
      const Same same = sameBytes(a, b, name, compareBudget_);
      differs = same != Same::kYes;
      unread = same == Same::kUnknown;
    } else if (tb == 'l') {
      auto la = os::readLinkAt(a.dirFd, name);
      auto lb = os::readLinkAt(b.dirFd, name);
      differs = !la.ok() || !lb.ok() || la.value() != lb.value();
    } else if (tb == 'o') {
      differs = differs || (a.st.st_mode & S_IFMT) != (b.st.st_mode & S_IFMT) || a.st.st_rdev != b.st.st_rdev;
    }
    if (differs) report(path, LayerChange::Kind::kModified, &a, &b, name, unread);
    if (tb == 'd') directory(path, subView(before, a, name, held), subView(after, b, name, held), depth + 1);
  }

  // a, b: the entry on each side (null where there is none).
  // unread: its bytes could not be compared (listed as possibly modified).
  void report(const std::string& path, LayerChange::Kind kind, const Entry* a, const Entry* b, const std::string& name,
              bool unread = false) {
    LayerChange c;
    c.path = path;
    c.kind = kind;
    const Entry& shown = b ? *b : *a;
    c.type = typeOf(shown.st);
    if (b) c.size = static_cast<uint64_t>(b->st.st_size);
    if (a) c.sizeBefore = static_cast<uint64_t>(a->st.st_size);
    if (a && b && (a->st.st_mode & 07777) != (b->st.st_mode & 07777) && c.type != 'l') {
      c.modeChange = octal(a->st.st_mode) + " -> " + octal(b->st.st_mode);
    }
    if (c.type == 'l') {
      auto target = os::readLinkAt(shown.dirFd, name);
      if (target.ok()) c.target = target.value();
    }
    if (unread) {
      c.diffOmitted = "not_compared";
    } else if (c.type == 'f' && limits_.diffs) {
      diff(c, a, b, name);
    }
    listBytes_ += c.path.size() + c.target.size();
    result.changes.push_back(std::move(c));
  }

  void diff(LayerChange& c, const Entry* a, const Entry* b, const std::string& name) {
    const uint64_t larger = static_cast<uint64_t>(std::max<off_t>(a ? a->st.st_size : 0, b ? b->st.st_size : 0));
    if (larger > limits_.maxDiffFileBytes) {
      c.diffOmitted = "too_large";
      return;
    }
    if (diffBytes_ >= limits_.maxDiffBytes) {
      c.diffOmitted = "budget";
      return;
    }
    std::string before;
    std::string after;
    bool cut = false;
    if (a) {
      auto text = readRegular(*a, name, limits_.maxDiffFileBytes, cut);
      if (!text) return;
      before = std::move(*text);
    }
    if (b) {
      auto text = readRegular(*b, name, limits_.maxDiffFileBytes, cut);
      if (!text) return;
      after = std::move(*text);
    }
    if (cut) {
      c.diffOmitted = "too_large";  // it grew while read
      return;
    }
    if (!looksLikeText(before) || !looksLikeText(after)) {
      c.diffOmitted = "binary";
      return;
    }
    auto d = unifiedDiff(before, after);
    if (!d) {
      c.diffOmitted = "too_different";
      return;
    }
    if (diffBytes_ + d->size() > limits_.maxDiffBytes) {
      c.diffOmitted = "budget";
      return;
    }
    diffBytes_ += d->size();
    c.diff = std::move(*d);
  }

  const LayerChangeLimits& limits_;
  size_t diffBytes_ = 0;
  size_t listBytes_ = 0;
  uint64_t compareBudget_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace

Result<LayerChanges> compareLayers(LayerView before, LayerView after, const LayerChangeLimits& limits) {
  Walk walk(limits);
  walk.directory("", before, after, 0);
  return std::move(walk.result);
}

}  // namespace moat::isolation::fs
