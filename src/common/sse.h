#pragma once

#include <functional>
#include <string>

namespace moat {

// Server-Sent Events (text/event-stream: what moatd's GET /v1/events
// answers, and what model providers stream), fed as bytes arrive: each
// complete event goes to the callback.
struct SseEvent {
  std::string id;
  std::string event;
  std::string data;  // data lines joined with '\n'
};

class SseParser {
 public:
  // False when `onEvent` said stop.
  bool feed(const std::string& bytes, const std::function<bool(const SseEvent&)>& onEvent);

 private:
  std::string line_;
  SseEvent current_;
  bool hasData_ = false;
};

}  // namespace moat
