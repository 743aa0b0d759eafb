#pragma once

#include <utility>

namespace moat {

// Runs a callable when the scope ends unless dismissed: the undo step of a
// multi-step create, so a failure halfway leaves nothing behind.
template <class F>
class ScopeExit {
 public:
  explicit ScopeExit(F fn) : fn_(std::move(fn)) {}
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;
  ~ScopeExit() {
    if (active_) fn_();
  }
  void dismiss() { active_ = false; }
  // Runs it now rather than at the end of the scope (once).
  void run() {
    if (active_) {
      active_ = false;
      fn_();
    }
  }

 private:
  F fn_;
  bool active_ = true;
};

}  // namespace moat
