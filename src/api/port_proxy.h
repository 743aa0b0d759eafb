#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "api/http.h"

// The mechanics of the port proxy (docs/PORTS.md): one HTTP request, or a
// WebSocket, from a client of moatd to a server listening on a port inside
// an environment. Who may, and which environment, is ports.cc's business;
// this file only forwards bytes, with deadlines, and filters the headers
// that must not cross.
namespace moat::api {

struct PortProxyLimits {
  std::chrono::milliseconds connect{5000};
  // From the request sent until the response head is whole, and silence
  // in either direction afterwards (moatd --port-timeout).
  std::chrono::milliseconds idle{60000};
  // A WebSocket (an upgraded connection) may sit silent longer.
  std::chrono::milliseconds tunnelIdle{std::chrono::minutes(10)};
  size_t maxHeadBytes = 64u << 10;  // the server's response head
};

// How a request reaches the server inside.
struct PortForward {
  uint16_t port = 0;
  std::string target;  // its request target there: "/index.html?x=1"
  // Reached under moatd's own origin (/v1/environments/{id}/ports/...):
  // the answer is sandboxed (Content-Security-Policy: sandbox), and sets no
  // cookie and grants no CORS, so a page served from inside never acts as
  // moatd's origin. Otherwise a preview host: only host-only cookies.
  bool apiOrigin = true;
  // Under moatd's origin: where the port is ("/v1/environments/ID/ports/P")
  // and the Host the client asked, for the Location of an answer.
  std::string prefix;
  std::string host;
  // The Authorization header is moat's credential and stays with moatd.
  bool dropAuthorization = true;
};

// The request head and body as the server inside receives them: the
// client's headers minus hop-by-hop ones, moat's session cookie and (when
// asked) Authorization; Host localhost:PORT; X-Forwarded-Host/-Proto/-For;
// "Connection: close", or the WebSocket upgrade.
std::string upstreamRequest(const HttpRequest& request, const PortForward& forward);

// Set-Cookie of a preview's answer: only a host-only cookie (no Domain
// attribute) passes; one with a Domain could reach moatd's origin or the
// other previews, which share its parent domain.
bool hostOnlyCookie(const std::string& setCookie);

// An answer's Location under moatd's origin. The server inside sees its
// port as the root of its own site: a Location on moatd's origin (a path,
// a relative reference, or a URL with the client's Host) is taken as that
// site's and put under forward.prefix, dot segments resolved so that it
// stays there; a redirect could otherwise send a browser, with the board's
// session cookie, to another environment's port or to the API. Another
// origin's URL and a fragment are left as they are.
std::string locationUnderPrefix(const std::string& location, const PortForward& forward);

struct ProxyOutcome {
  int status = 0;  // the server's, or the one moatd answered (502, 504); 0: none written
  bool upgraded = false;
  uint64_t bytesFromEnvironment = 0;
  uint64_t bytesToEnvironment = 0;  // after the request itself (a WebSocket's frames)
  std::string error;                // why moatd cut it short, if it did
};

// Sends `request` (upstreamRequest's) to `upstream`, answers the client
// with the server's response (its head filtered), and relays the body, or
// both directions once the server switched protocols (101) for a client
// that asked to. A head that does not come within limits.idle is 504
// `port_timeout`; one larger than limits.maxHeadBytes or not HTTP is 502
// `port_bad_response`. Ends when the server's answer ends, either side
// closes, or nothing moves for the idle limit. `client` is left open.
ProxyOutcome relayPort(int client, const std::string& clientPending, int upstream, const std::string& request,
                       const PortForward& forward, bool headRequest, bool wantsUpgrade, const PortProxyLimits& limits);

}  // namespace moat::api
