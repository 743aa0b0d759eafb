#include "backend/microvm/qmp.h"

#include <poll.h>

#include "os/socket.h"

namespace moat::backend::microvm {

Result<nlohmann::json> Qmp::nextMessage() {
  for (;;) {
    if (auto end = buffer_.find('\n'); end != std::string::npos) {
      auto message = nlohmann::json::parse(buffer_.substr(0, end), nullptr, false);
      buffer_.erase(0, end + 1);
      if (message.is_discarded() || !message.is_object()) {
        return Error::make(Code::kProtocol, "QEMU's monitor sent what is not a JSON object");
      }
      return message;
    }
    if (buffer_.size() > (1 << 20)) return Error::make(Code::kProtocol, "QEMU's monitor sent a line over 1 MiB");
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
    pollfd p{socket_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return Error::make(Code::kTimeout, "QEMU's monitor did not answer in time");
    if (n < 0) return Error::fromErrno("poll QEMU's monitor");
    MOAT_ASSIGN(std::string got, os::receiveWithFd(socket_, nullptr));
    buffer_ += got;
  }
}

Status Qmp::open() {
  MOAT_ASSIGN(auto greeting, nextMessage());
  if (!greeting.contains("QMP")) return Error::make(Code::kProtocol, "QEMU's monitor did not greet");
  MOAT_TRY(call("qmp_capabilities"));
  return {};
}

Result<nlohmann::json> Qmp::call(const std::string& command, const nlohmann::json& arguments, int fd) {
  const int64_t id = ++nextId_;
  nlohmann::json request = {{"execute", command}, {"id", id}};
  if (!arguments.is_null()) request["arguments"] = arguments;
  MOAT_TRY(os::sendWithFd(socket_, request.dump() + "\n", fd));
  for (;;) {
    MOAT_ASSIGN(auto message, nextMessage());
    const bool answer = message.contains("return") || message.contains("error");
    if (answer && (!message.contains("id") || message["id"] != id)) continue;  // a late one
    if (message.contains("return")) return message["return"];
    if (message.contains("error")) {
      const auto& error = message["error"];
      const bool described = error.is_object() && error.contains("desc") && error["desc"].is_string();
      return Error::make(Code::kToolFailed, "QEMU refused " + command + ": " +
                                                (described ? error["desc"].get<std::string>() : error.dump()));
    }
    if (message.contains("event") && events_.size() < 64) events_.push_back(std::move(message));
  }
}

Result<nlohmann::json> Qmp::awaitEvent(const std::string& name) {
  for (;;) {
    nlohmann::json message;
    if (!events_.empty()) {
      message = std::move(events_.front());
      events_.pop_front();
    } else {
      MOAT_ASSIGN(message, nextMessage());
    }
    if (message.contains("event") && message["event"] == name) {
      return message.contains("data") && message["data"].is_object() ? message["data"] : nlohmann::json::object();
    }
  }
}

}  // namespace moat::backend::microvm
