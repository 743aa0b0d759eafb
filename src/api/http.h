#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/result.h"
#include "websocket/connection.h"

// moatd's HTTP/1.1 transport (Boost.Beast underneath, kept out of this
// header so the API layer is plain data in, plain data out).
namespace moat::api {

struct HttpRequest {
  std::string method;
  std::string path;                          // decoded, without the query
  std::string target;                        // as the client sent it: undecoded, with the query
  std::map<std::string, std::string> query;  // decoded; the last value wins
  std::vector<std::pair<std::string, std::string>> queryAll;
  std::string body;
  std::string authorization;
  std::string cookie;  // the Cookie header (the board's session: docs/BOARD.md)
  std::string csrf;    // X-Moat-CSRF: a board session's state-changing requests carry it
  std::string host;
  std::string origin;
  std::string prefer;       // the Prefer header ("respond-async": answer 202 instead of waiting)
  std::string lastEventId;  // Last-Event-ID: where a Server-Sent Events client resumes
  std::string accept;
  std::string contentType;
  std::string mcpSessionId;        // Mcp-Session-Id (docs/MCP.md)
  std::string mcpProtocolVersion;  // MCP-Protocol-Version
  std::string secFetchSite;        // Sec-Fetch-Site: a browser's word on where a request comes from
  // Every header as sent, in order (the port proxy forwards them: docs/PORTS.md).
  std::vector<std::pair<std::string, std::string>> headers;
  // Who is on the other end, for the audit log: "127.0.0.1:50312", or
  // "unix pid=812 uid=0" (the peer's credentials on the unix socket).
  std::string remote;
  // A valid WebSocket handshake (GET, Upgrade: websocket, version 13, a key).
  bool websocketUpgrade = false;
  std::string websocketKey;
};

// Writes one piece of a streamed body; false once the client is gone.
using BodyWriter = std::function<bool(const std::string& chunk)>;

struct HttpResponse {
  int status = 200;
  std::string contentType = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra response headers
  // Set: the body is streamed (chunked) by this function instead, on the
  // connection's thread; the connection closes after it returns.
  std::function<void(const BodyWriter& write)> stream;
  // Set (on a request with websocketUpgrade): the server answers 101 and
  // runs this with the WebSocket on the connection's thread.
  std::function<void(websocket::Connection& socket)> websocket;
  // Set: the server hands the connection over to this function on the
  // connection's thread: it writes the whole answer itself, raw, and may
  // read on (`pending`: bytes the server read past the request). The
  // connection closes after it returns. (The port proxy: docs/PORTS.md.)
  std::function<void(int fd, std::string pending)> takeover;
  // Released once the answer is written (or the stream ends).
  std::shared_ptr<void> hold;
};

using Handler = std::function<HttpResponse(const HttpRequest&)>;

// Decided from the request line and headers, before the body is read: an
// unauthenticated client never gets to make moatd hold a large body.
struct Preflight {
  bool reject = false;
  HttpResponse response;  // when rejected
  size_t bodyLimit = 1u << 20;
  // Kept by the server until the request is answered (or its stream or
  // WebSocket ends), then released: what the preflight counted goes back.
  std::shared_ptr<void> hold;
};
using PreflightHandler = std::function<Preflight(const HttpRequest& head)>;

struct ServerLimits {
  size_t maxBodyBytes = 17u << 20;  // without a preflight
  size_t maxHeaderBytes = 16u << 10;
  // At this many, a new connection takes the place of the one that has
  // waited longest for its next request (idle keep-alive, or a request
  // head still arriving); only when every one is busy is it refused (503).
  // TCP clients get all but a sixteenth of them (from 16 on): the unix
  // socket's, the host's own operator's, find a place when TCP clients
  // hold every other one busy.
  size_t maxConnections = 512;
  int idleTimeoutS = 120;  // a connection silent this long is closed
  // stop(): how long a request in progress may take to write its answer
  // before its connection is cut.
  std::chrono::milliseconds stopGrace{5000};
};

class HttpServer {
 public:
  // `refused`: called for each connection turned away with 503 (every
  // connection busy, or stopping), which no handler sees.
  explicit HttpServer(Handler handler, PreflightHandler preflight = nullptr, ServerLimits limits = {},
                      std::function<void()> refused = nullptr);
  ~HttpServer();
  // host:port (port 0 picks one; see tcpPort()) and a unix socket path
  // (created 0600 by the caller's umask rules; an old socket is replaced).
  Status listenTcp(const std::string& hostPort);
  // `group`: its members may connect too (mode 0660); else root alone (0600).
  Status listenUnix(const std::string& path, std::optional<gid_t> group = std::nullopt);
  int tcpPort() const { return tcpPort_; }
  // From now on no request starts and newcomers get 503; requests in
  // progress go on and write their answers. For the caller to call before
  // it tells those requests to end, so that none of them is taken for idle.
  void beginStop();
  // beginStop(), then ends the connections: idle ones at once, each busy one
  // once its answer is written, or after limits.stopGrace. Returns when all
  // are gone.
  void stop();

 private:
  // `unixSocket`: the unix socket's listener (its root peers may take the
  // places kept from everyone else).
  void acceptLoop(int listenFd, bool unixSocket);
  // Whether a newcomer (local or TCP) finds no place free. Under mutex_.
  bool fullFor(bool local) const;
  // The places TCP clients may hold: all but a sixteenth (from 16 on).
  size_t tcpPlaces() const;
  void serve(int fd);

  Handler handler_;
  PreflightHandler preflight_;
  ServerLimits limits_;
  std::function<void()> refused_;
  std::vector<int> listenFds_;
  std::vector<std::thread> acceptors_;
  // One connection: busy from a complete request head until its answer is
  // written; otherwise idle since `since` (and may be closed for a newcomer).
  struct Connection {
    bool busy = false;
    bool evicted = false;
    bool local = false;  // root on the unix socket: may take the places kept back
    std::chrono::steady_clock::time_point since;
  };
  // Called by the connection's thread around each request: false when the
  // connection was evicted meanwhile (the request must not run).
  bool markBusy(int fd, bool busy);

  std::mutex mutex_;
  std::map<int, Connection> connections_;
  std::vector<std::thread> finished_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  int tcpPort_ = 0;
  size_t active_ = 0;
  size_t activeTcp_ = 0;
  std::condition_variable_any idle_;
};

std::string urlDecode(const std::string& s, bool plusIsSpace);
// "/a%20b?x=1&y" -> path "/a b", query {x: 1, y: ""} (decoded).
void parseTarget(const std::string& target, HttpRequest& request);

}  // namespace moat::api
