#include "manager/capacity.h"

#include <string>

namespace moat::manager {

Status Capacity::take(uint64_t ramMb) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (environments_ >= maxEnvironments_) {
    return Error::make(Code::kCapacity, "at capacity: " + std::to_string(maxEnvironments_) + " environments exist");
  }
  if (ramMb > maxMemoryMb_ || memoryMb_ > maxMemoryMb_ - ramMb) {
    return Error::make(Code::kCapacity, "at capacity: " + std::to_string(memoryMb_) + " of " +
                                            std::to_string(maxMemoryMb_) + " MB of memory are reserved");
  }
  ++environments_;
  memoryMb_ += ramMb;
  return {};
}

void Capacity::count(uint64_t ramMb) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++environments_;
  memoryMb_ += ramMb;
}

void Capacity::release(uint64_t ramMb) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (environments_ > 0) --environments_;
  memoryMb_ = memoryMb_ > ramMb ? memoryMb_ - ramMb : 0;
}

size_t Capacity::environments() {
  std::lock_guard<std::mutex> lock(mutex_);
  return environments_;
}

uint64_t Capacity::memoryMb() {
  std::lock_guard<std::mutex> lock(mutex_);
  return memoryMb_;
}

}  // namespace moat::manager
