// The board (docs/BOARD.md): its page and assets, and its sign-in sessions.
// The assets are public (they hold no data); everything the page shows comes
// from the API, authenticated by the session cookie that POST /ui/session
// sets, with a CSRF header on every state-changing request.
#include <algorithm>

#include "api/api.h"
#include "api/auth.h"
#include "api/board_sessions.h"
#include "api/validation.h"
#include "os/file.h"

namespace moat::api {
namespace {

// Scripts only from moatd itself, nothing inline, no eval, no other origin.
// Inline styles are allowed: xterm.js's renderer writes its theme into
// <style> elements; the page puts no data into markup, so no style (or
// script) reaches it from an environment.
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

void boardHeaders(HttpResponse& r) {
  r.headers.emplace_back("Content-Security-Policy", kContentSecurityPolicy);
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("X-Frame-Options", "DENY");
  r.headers.emplace_back("Referrer-Policy", "no-referrer");
  r.headers.emplace_back("Cache-Control", "no-cache");
}

// A refusal as every API error is (JSON naming the problem), with the
// board's headers.
HttpResponse refusal(int status, const std::string& code, const std::string& message) {
  HttpResponse r = errorResponse({status, code, message, ""});
  boardHeaders(r);
  return r;
}

const char* contentTypeOf(const std::string& name) {
  static const std::pair<const char*, const char*> kTypes[] = {{".html", "text/html; charset=utf-8"},
                                                               {".js", "text/javascript; charset=utf-8"},
                                                               {".css", "text/css; charset=utf-8"},
                                                               {".png", "image/png"},
                                                               {".svg", "image/svg+xml"},
                                                               {".woff2", "font/woff2"},
                                                               {".json", "application/json"},
                                                               {".txt", "text/plain; charset=utf-8"}};
  for (const auto& [suffix, type] : kTypes) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return type;
  }
  return nullptr;
}

// A file name of the board's own directory: no path, no dot first.
bool assetName(const std::string& name) {
  return !name.empty() && name.size() <= 64 && name[0] != '.' &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
             std::string::npos;
}

bool stateChanging(const std::string& method) { return method != "GET" && method != "HEAD"; }

}  // namespace

bool Api::isBoardPath(const std::string& path) {
  return path == "/" || path == "/index.html" || path.rfind("/board/", 0) == 0 || path == "/ui/session";
}

HttpResponse Api::boardAsset(const HttpRequest& req) {
  if (req.method != "GET" && req.method != "HEAD") {
    HttpResponse r = errorResponse({405, "method_not_allowed", req.method + " " + req.path + ": use GET", ""});
    r.headers = {{"Allow", "GET"}};
    return r;
  }
  const std::string name = req.path == "/" ? "index.html" : req.path.substr(req.path.rfind('/') + 1);
  const bool nested = req.path != "/" && req.path != "/index.html" && req.path != "/board/" + name;
  if (nested || !assetName(name) || contentTypeOf(name) == nullptr) {
    return refusal(404, "not_found", "no such file of the board: " + req.path);
  }
  if (options_.boardDir.empty()) return refusal(404, "not_found", "this moatd serves no board (moatd --no-board)");
  auto body = os::readFile(options_.boardDir + "/" + name, 16u << 20);
  if (!body.ok()) {
    if (name == "index.html") {
      return refusal(503, "unavailable",
                     "moat's board is not built: " + options_.boardDir +
                         " has no index.html (make build builds it; moatd --board-dir names another)");
    }
    return refusal(404, "not_found", "no such file of the board: " + req.path);
  }
  HttpResponse r;
  r.contentType = contentTypeOf(name);
  r.body = std::move(body.value());
  boardHeaders(r);
  return r;
}

std::optional<ApiError> Api::boardGuard(const HttpRequest& req) {
  // DNS rebinding: a page that rebinds its own name to moatd's address
  // carries that name in Host. Only names of this machine and addresses.
  if (!hostIsAddressOrLocal(req.host)) {
    return ApiError{403, "forbidden",
                    "the board answers only under localhost or an IP address (Host: " + req.host + ")", ""};
  }
  if (!req.origin.empty() && !sameOrigin(req.origin, req.host)) {
    return ApiError{403, "forbidden", "the board's session refuses requests from the web origin " + req.origin, ""};
  }
  // A browser says where a request comes from. "same-site" is another
  // origin of the same site: a preview (x.preview.localhost:7070) is
  // same-site with localhost:7070, and SameSite=Strict alone would let its
  // pages send the session (docs/PORTS.md). Only the board's own pages
  // ("same-origin") and the user's own doing ("none": typed, bookmarked).
  if (!req.secFetchSite.empty() && req.secFetchSite != "same-origin" && req.secFetchSite != "none") {
    return ApiError{
        403, "forbidden",
        "the board's session refuses requests from other origins (Sec-Fetch-Site: " + req.secFetchSite + ")", ""};
  }
  return std::nullopt;
}

BoardCredentials Api::sessionCredentials(const HttpRequest& req) {
  BoardCredentials c;
  const std::string id = cookieValue(req.cookie, kSessionCookie);
  if (id.empty()) return c;
  c.viaSession = true;
  if (auto refused = boardGuard(req)) {
    c.refusal = std::move(refused);
    return c;
  }
  auto session = boardSessions_.find(id);
  if (!session) {
    c.refusal = ApiError{401, "unauthorized", "the board's session is unknown or expired: sign in again", ""};
    return c;
  }
  // A WebSocket is opened by a page: only this origin's.
  if (req.websocketUpgrade && req.origin.empty()) {
    c.refusal = ApiError{403, "forbidden", "a WebSocket opened with the board's session needs an Origin", ""};
    return c;
  }
  if (stateChanging(req.method) && !constantTimeEquals(req.csrf, session->csrf)) {
    c.refusal = ApiError{403, "forbidden",
                         std::string("a request made with the board's session needs its ") + kCsrfHeader +
                             " header (the csrf value POST /ui/session answered)",
                         ""};
    return c;
  }
  c.token = session->token;
  return c;
}

std::optional<Principal> Api::principalOf(const std::string& token) {
  if (token.empty()) return std::nullopt;
  if (constantTimeEquals(token, masterToken_)) {
    Principal master;
    master.master = true;
    return master;
  }
  auto key = keys_.authenticate(token);
  if (!key.ok()) return std::nullopt;
  return key.value();
}

namespace {

json principalJson(const Principal& p) {
  if (p.master) return {{"master", true}};
  return {{"master", false}, {"key", p.keyId}, {"scopes", p.scopes}};
}

}  // namespace

HttpResponse Api::uiSession(const HttpRequest& req) {
  if (auto refused = boardGuard(req)) return errorResponse(*refused);
  auto answer = [](int status, const json& body) {
    HttpResponse r = respond(status, body);
    r.headers.emplace_back("Cache-Control", "no-store");
    return r;
  };
  const std::string id = cookieValue(req.cookie, kSessionCookie);
  if (req.method == "POST") {
    // A form cannot send JSON, and a page of another origin cannot send it
    // without asking first (CORS), which moatd never grants.
    if (req.contentType.rfind("application/json", 0) != 0) {
      return errorResponse({415, "unsupported_media_type", "POST /ui/session takes application/json", ""});
    }
    ApiError perr{};
    auto body = parseObject(req.body, perr);
    if (!body.ok()) return errorResponse(perr);
    if (auto e = onlyFields(body.value(), {"token"}, "")) return errorResponse(*e);
    if (!body->contains("token") || !(*body)["token"].is_string() || (*body)["token"].get<std::string>().empty()) {
      return errorResponse(invalid("token", "required: the master token or an API key"));
    }
    const std::string token = (*body)["token"];
    auto principal = principalOf(token);
    if (!principal) {
      recordAuthFailure(req, token, "the board's sign-in: not the master token or an active key");
      return errorResponse({401, "unauthorized", "not the master token or an active API key", "token"});
    }
    if (!id.empty()) boardSessions_.close(id);  // a new sign-in replaces the old session
    auto opened = boardSessions_.open(token, principal->owner());
    if (!opened.ok()) return errorResponse(fromError(opened.error()));
    json data = {{"via", "board"}};
    if (!req.remote.empty()) data["remote"] = req.remote;
    audit_.record("session.opened", "", principal->owner(), std::move(data));
    HttpResponse r = answer(200, {{"csrf", opened->csrf}, {"principal", principalJson(*principal)}});
    r.headers.emplace_back("Set-Cookie",
                           std::string(kSessionCookie) + "=" + opened->id + "; Path=/; HttpOnly; SameSite=Strict");
    return r;
  }
  if (req.method != "GET" && req.method != "DELETE") {
    HttpResponse r =
        errorResponse({405, "method_not_allowed", req.method + " /ui/session: use GET, POST or DELETE", ""});
    r.headers = {{"Allow", "GET, POST, DELETE"}};
    return r;
  }
  BoardCredentials c = sessionCredentials(req);
  if (c.refusal) return errorResponse(*c.refusal);
  auto principal = principalOf(c.token);
  if (!principal) {
    if (!id.empty()) boardSessions_.close(id);
    return errorResponse(
        {401, "unauthorized", id.empty() ? "not signed in" : "the session's key was revoked: sign in again", ""});
  }
  if (req.method == "GET") {
    auto session = boardSessions_.find(id);
    if (!session) return errorResponse({401, "unauthorized", "not signed in", ""});
    return answer(200, {{"csrf", session->csrf}, {"principal", principalJson(*principal)}});
  }
  boardSessions_.close(id);
  audit_.record("session.closed", "", principal->owner(), {{"via", "board"}});
  HttpResponse r = noContent();
  r.headers.emplace_back("Set-Cookie", std::string(kSessionCookie) + "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
  r.headers.emplace_back("Cache-Control", "no-store");
  return r;
}

HttpResponse Api::boardRoute(const HttpRequest& req) {
  if (req.path == "/ui/session") return uiSession(req);
  return boardAsset(req);
}

}  // namespace moat::api
