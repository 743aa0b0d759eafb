#include <chrono>

#include "api/api.h"
#include "api/validation.h"

// GET /v1/events: the audit log as Server-Sent Events, a page at a time or
// followed live; GET /v1/audit/verify: the hash chain checked (docs/API.md,
// "Audit").
namespace moat::api {
namespace {

// A follower with nothing new hears this often that the stream is alive
// (and moatd learns whether the client still is).
constexpr auto kEventsHeartbeat = std::chrono::seconds(15);
// Events per answer without follow, and per read while following.
constexpr size_t kPage = 1000;

json eventJson(const audit::Event& e) {
  return {{"id", e.id},     {"time", timestamp(e.timeMs)},  {"time_ms", e.timeMs},
          {"type", e.type}, {"environment", e.environment}, {"actor", e.actor},
          {"data", e.data}, {"prev_hash", e.prevHash},      {"hash", e.hash}};
}

// One event as an SSE frame. The JSON has no raw newlines, so it is one
// data line.
std::string frame(const audit::Event& e) {
  return "id: " + std::to_string(e.id) + "\nevent: " + e.type +
         "\ndata: " + eventJson(e).dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::optional<ApiError> plainText(const HttpRequest& req, const char* name, size_t max, std::string& out) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return std::nullopt;
  if (it->second.empty() || it->second.size() > max) {
    return invalid(name, "must be 1 to " + std::to_string(max) + " bytes");
  }
  out = it->second;
  return std::nullopt;
}

}  // namespace

HttpResponse Api::eventsRoute(const HttpRequest& req, const Principal& principal) {
  if (log_ == nullptr) return errorResponse({404, "not_found", "the audit log is off", ""});
  if (!principal.may("audit")) {
    return errorResponse({403, "forbidden", "this key lacks the 'audit' scope", ""});
  }
  if (auto e = onlyQuery(req, {"environment", "type", "since", "follow"})) return errorResponse(*e);
  store::EventQuery query;
  query.limit = kPage;
  if (auto e = queryNumber(req, "since", 1ULL << 62, 10, query.afterId)) return errorResponse(*e);
  // A reconnecting EventSource sends the last id it saw: that wins over the
  // `since` of the URL it reuses.
  if (!req.lastEventId.empty()) {
    const std::string& v = req.lastEventId;
    if (v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) {
      return errorResponse(invalid("Last-Event-ID", "must be an event id (a whole number)"));
    }
    query.afterId = std::stoull(v);
  }
  if (auto e = plainText(req, "environment", 64, query.environment)) return errorResponse(*e);
  if (auto e = plainText(req, "type", 128, query.typePrefix)) return errorResponse(*e);
  bool follow = false;
  if (auto e = queryFlag(req, "follow", follow)) return errorResponse(*e);
  // A key sees the events of the environments it created, nothing else.
  if (!principal.master) query.owner = principal.keyId;

  HttpResponse response;
  response.contentType = "text/event-stream";
  if (!follow) {
    // Read your writes: what this client did before asking is in the answer.
    if (Status s = log_->flush(); !s.ok()) return errorResponse(fromError(s.error()));
    auto events = log_->read(query);
    if (!events.ok()) return errorResponse(fromError(events.error()));
    for (const auto& e : events.value()) response.body += frame(e);
    return response;
  }
  // Revoking the key ends it (the revocation is an event: followers wake).
  response.stream = [log = log_, query, stillActive = keys_.stillActive(principal)](const BodyWriter& write) mutable {
    // `scanned`: every matching event up to it was sent. Events are written
    // to the store in id order, so once the log says N is stored, a read
    // sees everything up to N.
    uint64_t scanned = query.afterId;
    for (;;) {
      if (!stillActive()) {
        (void)write(": error: the API key of this request was revoked\n\n");
        return;
      }
      uint64_t stored = log->committedId();
      query.afterId = scanned;
      auto events = log->read(query);
      if (!events.ok()) {
        (void)write(": error: " + events.error().message() + "\n\n");
        return;
      }
      if (!events->empty()) {
        std::string out;
        for (const auto& e : events.value()) out += frame(e);
        if (!write(out)) return;
        scanned = events->back().id;
        if (events->size() == query.limit) continue;  // more right away
      }
      scanned = std::max(scanned, stored);
      if (log->interrupted()) return;  // moatd is stopping
      uint64_t newest = log->waitForNewer(scanned, std::chrono::steady_clock::now() + kEventsHeartbeat);
      if (log->interrupted()) return;
      if (newest <= scanned && !write(": heartbeat\n\n")) return;
    }
  };
  return response;
}

HttpResponse Api::verifyRoute(const HttpRequest& req, const Principal& principal) {
  if (log_ == nullptr) return errorResponse({404, "not_found", "the audit log is off", ""});
  if (!principal.master) {
    return errorResponse({403, "forbidden", "only the master token verifies the audit log", ""});
  }
  if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  if (Status s = log_->flush(); !s.ok()) return errorResponse(fromError(s.error()));
  auto result = log_->verify();
  if (!result.ok()) return errorResponse(fromError(result.error()));
  const audit::VerifyResult& r = result.value();
  json out = {{"ok", r.ok}, {"checked", r.checked}};
  if (r.lastId != 0) out["last"] = {{"id", r.lastId}, {"hash", r.lastHash}};
  if (!r.ok) out["first_broken"] = {{"id", r.firstBrokenId}, {"reason", r.reason}};
  return respond(200, out);
}

}  // namespace moat::api
