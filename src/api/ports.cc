// Ports and previews (docs/PORTS.md): a server listening inside an
// environment, reached through moatd without opening any host port. The
// connection is made inside the environment's own network namespace, so it
// works whatever the environment's network policy (none included) and
// changes nothing of what the environment may reach.
#include <nlohmann/json.hpp>

#include "api/api.h"
#include "api/auth.h"
#include "api/port_proxy.h"
#include "api/validation.h"
#include "common/encoding.h"
#include "common/text.h"

namespace moat::api {
namespace {

constexpr const char* kNoPreview =
    "no such preview: its URL is wrong, or it expired, was revoked, or its environment ended";

// "80" -> 80; none for anything but a decimal port from 1 to 65535.
std::optional<uint16_t> portNumber(const std::string& text) {
  if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos) return {};
  const int n = std::stoi(text);
  if (n < 1 || n > 65535) return {};
  return static_cast<uint16_t>(n);
}

// The request target after /v1/environments/{id}/ports/{port} (undecoded,
// as the client sent it): "/a/b?x=1"; "/" when nothing follows.
std::string targetInside(const std::string& raw) {
  const size_t query = raw.find('?');
  const std::string path = raw.substr(0, query);
  size_t slash = 0;
  for (int seen = 0; seen < 6 && slash != std::string::npos; ++seen) {
    slash = path.find('/', seen == 0 ? 0 : slash + 1);
  }
  std::string inside = slash == std::string::npos ? "/" : path.substr(slash);
  if (query != std::string::npos) inside += raw.substr(query);
  return inside;
}

}  // namespace

bool Api::carriesMoatCredential(const std::string& authorization) const {
  auto holds = [this](const std::string& text) {
    if (!masterToken_.empty() && text.find(masterToken_) != std::string::npos) return true;
    // A key's token: moat_<12 hex>_<secret>, anywhere in the value.
    for (size_t at = text.find("moat_"); at != std::string::npos; at = text.find("moat_", at + 1)) {
      if (keyTokenStartsAt(text, at)) return true;
    }
    return false;
  };
  if (holds(authorization)) return true;
  // Basic credentials are base64 of "user:password"; either may be a token.
  const size_t first = authorization.find_first_not_of(" \t");
  const std::string value = first == std::string::npos ? "" : authorization.substr(first);
  if (value.size() > 6 && asciiLower(value.substr(0, 6)) == "basic ") {
    std::string encoded = value.substr(6);
    std::erase_if(encoded, [](char c) { return c == ' ' || c == '\t'; });
    auto decoded = base64Decode(encoded);
    // What does not decode is not passed on: it could be a token in a
    // spelling a server decodes anyway (unpadded, base64url).
    if (!decoded.ok() || holds(decoded.value())) return true;
  }
  return false;
}

Api::PortAdmission Api::admitPortConnection(const std::string& id, const std::string& owner, bool viaPreview) {
  std::lock_guard<std::mutex> lock(portConnectionsMutex_);
  auto refuse = [](const std::string& why) {
    return PortAdmission{nullptr,
                         ApiError{429, "capacity", why + " proxied connections open already; retry later", ""}};
  };
  if (portConnectionsTotal_ >= options_.maxPortConnections) {
    return refuse("moatd has " + std::to_string(options_.maxPortConnections) +
                  " (half of its --max-connections: the rest are the API's)");
  }
  size_t& byOwner = portConnectionsByOwner_[owner];
  if (byOwner >= options_.maxPortConnectionsPerOwner) {
    // A preview's visitor, who may be anyone, learns no key's id.
    const std::string who = viaPreview          ? std::string("this preview's maker")
                            : owner == "master" ? std::string("the master token")
                                                : "key " + owner;
    return refuse(who + " has " + std::to_string(options_.maxPortConnectionsPerOwner));
  }
  size_t& open = portConnections_[id];
  if (open >= kPortConnectionsPerEnvironment) {
    if (byOwner == 0) portConnectionsByOwner_.erase(owner);
    return refuse((viaPreview ? std::string("this preview's environment") : "environment " + id) + " has " +
                  std::to_string(kPortConnectionsPerEnvironment));
  }
  ++open;
  ++byOwner;
  ++portConnectionsTotal_;
  // The deleter gives the places back.
  return PortAdmission{std::shared_ptr<void>(static_cast<void*>(this),
                                             [this, id, owner](void*) {
                                               std::lock_guard<std::mutex> lock(portConnectionsMutex_);
                                               auto it = portConnections_.find(id);
                                               if (it != portConnections_.end() && --it->second == 0)
                                                 portConnections_.erase(it);
                                               auto o = portConnectionsByOwner_.find(owner);
                                               if (o != portConnectionsByOwner_.end() && --o->second == 0)
                                                 portConnectionsByOwner_.erase(o);
                                               --portConnectionsTotal_;
                                             }),
                       std::nullopt};
}

HttpResponse Api::proxyToPort(const HttpRequest& req, const std::string& id, const PortForward& forward,
                              const std::string& actor, const std::string& owner, const std::string& previewId) {
  nlohmann::json data = {
      {"port", forward.port}, {"method", req.method}, {"via", previewId.empty() ? "api" : "preview"}};
  if (!previewId.empty()) data["preview"] = previewId;
  if (!req.remote.empty()) data["remote"] = req.remote;
  // One event per connection (a request, or a WebSocket), never per byte;
  // a preview's visitors are anyone holding its URL: recorded at the pace
  // of the environment's own events.
  auto record = [this, id, actor, previewId](nlohmann::json data) {
    if (previewId.empty()) {
      audit_.record("port.connection", id, actor, std::move(data));
    } else {
      audit_.recordByEnvironment("port.connection", id, std::move(data), kEnvironmentGateEvents);
    }
  };
  auto admitted = admitPortConnection(id, owner, !previewId.empty());
  if (admitted.refusal) return errorResponse(*admitted.refusal);
  auto hold = std::move(admitted.hold);
  auto upstream = networks_.connectToPort(id, forward.port, options_.portLimits.connect);
  const Code failed = upstream.ok() ? Code::kInternal : upstream.error().code;
  const bool unreachable = failed == Code::kRefused || failed == Code::kTimeout || failed == Code::kSyscall;
  const bool ended = failed == Code::kConflict || failed == Code::kNotFound || failed == Code::kGone;
  // A preview's environment that ended is no preview (its end revokes it).
  if (!upstream.ok() && ended && !previewId.empty()) return errorResponse({404, "not_found", kNoPreview, ""});
  if (!upstream.ok() && !unreachable) return errorResponse(fromError(upstream.error()));
  if (!upstream.ok()) {
    data["status"] = 502;
    data["error"] = upstream.error().message();
    record(std::move(data));
    const std::string why = upstream.error().code == Code::kRefused   ? "nothing listens on port "
                            : upstream.error().code == Code::kTimeout ? "no answer from port "
                                                                      : "cannot connect to port ";
    return errorResponse({502, "port_unreachable",
                          why + std::to_string(forward.port) + " inside environment " + id +
                              " (a server there must listen on 127.0.0.1 or 0.0.0.0)",
                          ""});
  }
  auto connection = std::make_shared<UniqueFd>(std::move(upstream.value()));
  HttpResponse r;
  r.hold = hold;
  const std::string request = upstreamRequest(req, forward);
  const bool head = req.method == "HEAD";
  const bool upgrade = req.websocketUpgrade;
  r.takeover = [this, connection, request, forward, head, upgrade, data, record, hold](int fd,
                                                                                       std::string pending) mutable {
    ProxyOutcome outcome =
        relayPort(fd, pending, connection->get(), request, forward, head, upgrade, options_.portLimits);
    connection->reset();
    data["status"] = outcome.status;
    if (outcome.upgraded) data["upgraded"] = true;
    data["bytes_in"] = outcome.bytesToEnvironment + request.size();
    data["bytes_out"] = outcome.bytesFromEnvironment;
    if (!outcome.error.empty()) data["error"] = outcome.error;
    record(std::move(data));
    hold.reset();
  };
  return r;
}

HttpResponse Api::portsRoute(const HttpRequest& req, const Principal& principal, const std::string& id,
                             const std::string& portText) {
  auto port = portNumber(portText);
  if (!port) return errorResponse(invalid("port", "must be a port number from 1 to 65535 (got \"" + portText + "\")"));
  PortForward forward;
  forward.port = *port;
  forward.target = targetInside(req.target);
  forward.apiOrigin = true;
  forward.prefix = "/v1/environments/" + id + "/ports/" + std::to_string(*port);
  forward.host = req.host;
  forward.dropAuthorization = true;
  return proxyToPort(req, id, forward, principal.owner(), principal.owner(), "");
}

HttpResponse Api::previewRequest(const HttpRequest& req, const std::string& secret) {
  auto preview = secret.empty() ? std::nullopt : previews_.resolve(secret);
  if (!preview) {
    return errorResponse({404, "not_found", kNoPreview, ""});
  }
  if (req.target.empty() || req.target[0] != '/') {
    return errorResponse({400, "bad_request", "a preview takes an origin-form request target (\"/path\")", ""});
  }
  PortForward forward;
  forward.port = preview->port;
  forward.target = req.target;
  forward.apiOrigin = false;
  // The app's own Authorization passes; moat's credentials never reach it,
  // in whatever form or header they come.
  forward.dropAuthorization = false;
  for (const auto& [name, value] : req.headers) {
    if (asciiLower(name) == "authorization" && carriesMoatCredential(value)) forward.dropAuthorization = true;
  }
  return proxyToPort(req, preview->environment, forward, "", preview->owner, preview->id);
}

std::string Api::previewUrl(const std::string& secret, const HttpRequest& req) const {
  int port = previewPort_.load();
  std::string portText = port > 0 ? std::to_string(port) : "";
  if (portText.empty()) {  // no TCP listener known: the port the client used
    const size_t colon = req.host.rfind(':');
    if (colon != std::string::npos && req.host.find(']', colon) == std::string::npos)
      portText = req.host.substr(colon + 1);
  }
  return "http://" + secret + "." + options_.previewDomain +
         (portText.empty() || portText == "80" ? "" : ":" + portText) + "/";
}

HttpResponse Api::previewsRoute(const HttpRequest& req, const Principal& principal, const std::string& id,
                                const std::string& previewId) {
  auto previewJson = [](const Preview& p) {
    return json{{"id", p.id},
                {"port", p.port},
                {"created_at", timestamp(p.createdAtMs)},
                {"expires_at", timestamp(p.expiresAtMs)}};
  };
  if (req.method == "DELETE") {
    auto gone = previews_.revoke(id, previewId);
    if (!gone) return errorResponse({404, "not_found", "environment " + id + " has no preview " + previewId, ""});
    audit_.record("preview.revoked", id, principal.owner(),
                  {{"preview", gone->id}, {"port", gone->port}, {"reason", "revoked"}});
    return noContent();
  }
  if (req.method == "GET") {
    // An environment that does not exist has no list to show (404), as every other of its resources.
    auto known = environments_.get(id);
    if (!known.ok()) return errorResponse(fromError(known.error()));
    json list = json::array();
    for (const auto& p : previews_.list(id)) list.push_back(previewJson(p));
    return respond(200, {{"previews", list}});
  }
  ApiError perr{};
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  const json& j = body.value();
  if (auto e = onlyFields(j, {"port", "ttl_s"}, "")) return errorResponse(*e);
  if (!j.contains("port") || !j["port"].is_number_integer() || j["port"].get<int64_t>() < 1 ||
      j["port"].get<int64_t>() > 65535) {
    return errorResponse(invalid("port", "required: a port number from 1 to 65535"));
  }
  int64_t ttl = Previews::kDefaultTtlS;
  if (j.contains("ttl_s")) {
    if (!j["ttl_s"].is_number_integer() || j["ttl_s"].get<int64_t>() < 1 ||
        j["ttl_s"].get<int64_t>() > Previews::kMaxTtlS) {
      return errorResponse(
          invalid("ttl_s", "must be a whole number of seconds from 1 to " + std::to_string(Previews::kMaxTtlS)));
    }
    ttl = j["ttl_s"].get<int64_t>();
  }
  auto record = environments_.get(id);
  if (!record.ok()) return errorResponse(fromError(record.error()));
  if (record->state != store::EnvironmentState::kRunning) {
    return errorResponse({409, "conflict",
                          "environment " + id + " is " + std::string(store::stateName(record->state)) + ": no preview",
                          ""});
  }
  const auto port = static_cast<uint16_t>(j["port"].get<int64_t>());
  auto created = previews_.create(id, port, ttl, principal.owner());
  if (!created.ok()) return errorResponse(fromError(created.error()));
  // The environment may have ended meanwhile: its end revoked what it had,
  // not this one.
  auto again = environments_.get(id);
  if (!again.ok() || again->state != store::EnvironmentState::kRunning) {
    previews_.revoke(id, created->preview.id);
    return errorResponse({409, "conflict", "environment " + id + " ended: no preview", ""});
  }
  audit_.record(
      "preview.created", id, principal.owner(),
      {{"preview", created->preview.id}, {"port", port}, {"expires_at", timestamp(created->preview.expiresAtMs)}});
  json out = previewJson(created->preview);
  out["url"] = previewUrl(created->secret, req);
  HttpResponse r = respond(201, out);
  r.headers.emplace_back("Cache-Control", "no-store");
  return r;
}

void Api::portsEnvironmentEnded(const std::string& id) {
  for (const auto& p : previews_.endEnvironment(id)) {
    audit_.record("preview.revoked", id, "moatd",
                  {{"preview", p.id}, {"port", p.port}, {"reason", "environment ended"}});
  }
}

}  // namespace moat::api
