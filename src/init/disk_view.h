#pragma once

#include <sys/statfs.h>

#include <cstdint>
#include <memory>

#include "common/result.h"
#include "common/unique_fd.h"
#include "os/block.h"
#include "os/exec_notify.h"

// What `df` shows inside an environment (docs/SECURITY.md, "Limits
// inside"): statfs and fstatfs of a path on the environment's root answer
// with its volume's qgroup limit and usage, not the storage pool's size.
namespace moat::init {

// The real answer with the sizes a volume of `limitBytes` holding
// `usedBytes` has: as many blocks as the limit, free what is left of it
// (never more than the pool itself has free). limitBytes 0: no limit, the
// real answer unchanged.
struct statfs diskView(const struct statfs& real, uint64_t limitBytes, uint64_t usedBytes);

// Answers the environment's statfs calls on a thread of its own, made
// before the seccomp filter that hands those calls over, so that it does
// not carry it (its own statfs would wait for itself). A call stuck on a
// slow file system holds up only the statfs calls after it.
class DiskView {
 public:
  // Starts the thread. Before any filter with a listener is installed.
  static Result<std::unique_ptr<DiskView>> start(os::QgroupCounters counters);
  // Ends the thread (after the call it answers, if any).
  ~DiskView();
  DiskView(const DiskView&) = delete;
  DiskView& operator=(const DiskView&) = delete;

  // The thread reads the listener's notifications itself (no exec gate:
  // only statfs calls come).
  void serve(UniqueFd listener);
  // The exec gate's listener, whose notifications the caller reads: it
  // hands the statfs ones over with hand().
  void share(int listener);
  // A statfs notification read from `listener`. Never blocks: with the
  // thread behind (or not sharing it), the call runs as it would.
  void hand(int listener, const os::ExecNotification& n);

 private:
  DiskView() = default;
  int listener_ = -1;  // shared: the caller's
  UniqueFd feed_;      // to the thread: its listener, then notifications
};

}  // namespace moat::init
