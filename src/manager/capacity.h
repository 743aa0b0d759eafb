#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "common/result.h"

namespace moat::manager {

// What moatd holds at once against its limits (moatd --max-environments,
// the host's memory): every environment counts, running, being made or
// kept warm, with the memory it reserves. Its own lock, held only to count.
class Capacity {
 public:
  Capacity(size_t maxEnvironments, uint64_t maxMemoryMb)
      : maxEnvironments_(maxEnvironments), maxMemoryMb_(maxMemoryMb) {}
  // One more environment of `ramMb`, or `capacity` naming the limit it
  // would pass (and nothing taken).
  Status take(uint64_t ramMb);
  // One that is there already (re-attached after a restart): counted even
  // beyond the limits, which then hold off new ones until enough are gone.
  void count(uint64_t ramMb);
  // An environment that took or was counted is gone.
  void release(uint64_t ramMb);
  size_t environments();
  uint64_t memoryMb();

 private:
  const size_t maxEnvironments_;
  const uint64_t maxMemoryMb_;
  std::mutex mutex_;
  size_t environments_ = 0;
  uint64_t memoryMb_ = 0;
};

}  // namespace moat::manager
