#include "api/key_admission.h"

#include <chrono>

namespace moat::api {

KeyAdmission::Verdict KeyAdmission::admit(const std::string& id) {
  Verdict v;
  {
    std::lock_guard<std::mutex> lock(inFlightMutex_);
    size_t& n = inFlight_[id];
    if (n >= maxInFlight_) {
      v.refusal = ApiError{
          429, "capacity",
          "at capacity: this key has " + std::to_string(n) + " requests in progress; retry when some have ended", ""};
      v.retryAfter = "1";
      return v;
    }
    ++n;
  }
  // A request waiting for its turn below counts as in progress.
  v.hold = std::shared_ptr<void>(nullptr, [this, id](void*) {
    std::lock_guard<std::mutex> lock(inFlightMutex_);
    auto it = inFlight_.find(id);
    if (it != inFlight_.end() && --it->second == 0) inFlight_.erase(it);
  });
  auto turn = rate_.admit(id, RateLimiter::Clock::now());
  if (!turn.admitted) {
    v.hold.reset();
    v.retryAfter = std::to_string(std::chrono::ceil<std::chrono::seconds>(turn.retryAfter).count());
    v.refusal =
        ApiError{429, "capacity",
                 "rate limited: this key may send " + std::to_string(static_cast<long>(rate_.limits().perSecond)) +
                     " requests per second (moatd --key-rate); retry in " + v.retryAfter + " s",
                 ""};
    return v;
  }
  if (turn.wait.count() > 0) {
    std::unique_lock<std::mutex> lock(turnMutex_);
    auto waiting = metrics_.waiting();
    if (turnCv_.wait_for(lock, turn.wait, [this] { return stopping_; })) {
      v.hold.reset();
      v.refusal = ApiError{503, "unavailable", "moatd is stopping", ""};
    }
  }
  return v;
}

void KeyAdmission::stop() {
  {
    std::lock_guard<std::mutex> lock(turnMutex_);
    stopping_ = true;
  }
  turnCv_.notify_all();
}

}  // namespace moat::api
