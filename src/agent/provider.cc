#include "agent/provider.h"

#include <algorithm>

#include "mcp/protocol.h"

namespace moat::agent {
namespace {

bool retryable(int status) { return status == 408 || status == 409 || status == 429 || status >= 500; }

// Retry-After in seconds (an HTTP date is not worth the parse: the backoff
// stands in for it).
std::chrono::milliseconds retryAfter(const HttpAnswer& answer, std::chrono::milliseconds backoff) {
  auto it = answer.headers.find("retry-after");
  if (it == answer.headers.end() || it->second.empty() || it->second.size() > 6 ||
      it->second.find_first_not_of("0123456789") != std::string::npos) {
    return backoff;
  }
  return std::chrono::milliseconds(std::min<int64_t>(std::stoll(it->second), 300) * 1000);
}

}  // namespace

Provider::Provider(ProviderConfig config, RetryPolicy retry, PostOptions post)
    : config_(std::move(config)), retry_(retry), post_(post), wire_(wireFor(config_.kind)) {}

std::string Provider::baseUrl() const { return config_.baseUrl.empty() ? wire_->defaultBaseUrl() : config_.baseUrl; }

Status Provider::check() const {
  auto url = parseUrl(baseUrl());
  if (!url.ok()) return url.error();
  return {};
}

Result<ModelTurn> Provider::complete(const ModelRequest& request, const std::function<void(const std::string&)>& onText,
                                     const std::function<void(const std::string&)>& onRetry, Cancel& cancel) {
  MOAT_ASSIGN(Url url, parseUrl(baseUrl()));
  const std::string name = providerName(config_.kind);
  const std::string body = wire_->request(request).dump(-1, ' ', false, json::error_handler_t::replace);
  auto headers = wire_->headers(config_.apiKey);
  std::chrono::milliseconds backoff = retry_.firstDelay;
  for (int attempt = 1;; ++attempt) {
    auto decoder = wire_->decoder();
    SseParser parser;
    Status streamed;
    std::string plain;
    bool eventStream = false;
    auto onBody = [&](const std::string& bytes) {
      if (!eventStream) {
        // A server that ignored "stream" answers one JSON document.
        if (plain.empty() && bytes.find("data:") == std::string::npos && bytes.find("event:") == std::string::npos) {
          plain += bytes;
          return true;
        }
        if (!plain.empty()) {
          plain += bytes;
          return true;
        }
        eventStream = true;
      }
      return parser.feed(bytes, [&](const SseEvent& event) {
        streamed = decoder->feed(event, onText);
        return streamed.ok() && !decoder->done();
      });
    };
    std::function<bool(const std::string&)> reader;
    if (request.stream) reader = onBody;
    auto answer = post(url, url.path + wire_->path(), headers, body, reader, post_, &cancel);
    std::string why;
    if (!answer.ok()) {
      // Stopped, refused by moatd's own rules, or a certificate that does
      // not verify: trying again changes nothing.
      const Code code = answer.error().code;
      if (cancel.cancelled() || code == Code::kRefused || code == Code::kTls || code == Code::kInvalidArgument) {
        return answer.error();
      }
      // Not reached, or the connection broke: worth another try.
      why = answer.error().message();
    } else if (answer->status == 200) {
      if (!streamed.ok()) return streamed.error();
      if (!request.stream || !plain.empty()) {
        json j = mcp::parseBounded(request.stream ? plain : answer->body);
        if (j.is_discarded()) return Error::make(Code::kProtocol, name + " answered 200 with a body that is not JSON");
        return wire_->response(j);
      }
      if (!decoder->done()) {
        why = name + "'s stream ended before the answer did";
      } else {
        return decoder->finish();
      }
    } else {
      const int status = answer->status;
      std::string said = errorMessageOf(answer->body);
      std::string sentence = name + " answered " + std::to_string(status) + (said.empty() ? "" : ": " + said);
      if (wire_->contextTooLong(status, answer->body)) {
        return Error::make(Code::kTooLarge, "the conversation no longer fits the model's context (" + sentence + ")");
      }
      if (status == 401 || status == 403) {
        return Error::make(Code::kUnauthorized, sentence + " (check the provider's API key)");
      }
      if (!retryable(status)) return Error::make(Code::kRefused, sentence);
      why = sentence;
      backoff = retryAfter(answer.value(), backoff);
    }
    if (attempt >= retry_.attempts) {
      return Error::make(Code::kUnavailable, why + " (gave up after " + std::to_string(attempt) + " attempts)");
    }
    if (onRetry) onRetry(why + "; trying again in " + std::to_string(backoff.count()) + " ms");
    if (!cancel.sleepFor(backoff)) return Error::make(Code::kGone, "stopped while waiting to retry " + name);
    backoff = std::min(retry_.maxDelay, backoff * 2);
  }
}

}  // namespace moat::agent
