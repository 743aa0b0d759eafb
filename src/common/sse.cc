#include "common/sse.h"

namespace moat {

bool SseParser::feed(const std::string& bytes, const std::function<bool(const SseEvent&)>& onEvent) {
  for (char c : bytes) {
    if (c != '\n') {
      line_ += c;
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (line_.empty()) {
      // A blank line ends an event (one with no data is not dispatched).
      bool go = true;
      if (hasData_) go = onEvent(current_);
      current_ = SseEvent();
      hasData_ = false;
      if (!go) return false;
      continue;
    }
    if (line_[0] != ':') {  // ':' starts a comment (heartbeats)
      auto colon = line_.find(':');
      std::string field = line_.substr(0, colon);
      std::string value = colon == std::string::npos ? "" : line_.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (field == "data") {
        if (hasData_) current_.data += '\n';
        current_.data += value;
        hasData_ = true;
      } else if (field == "id") {
        current_.id = value;
      } else if (field == "event") {
        current_.event = value;
      }
    }
    line_.clear();
  }
  return true;
}

}  // namespace moat
