// The port proxy's filters and the previews' table (docs/PORTS.md), without
// a daemon: what crosses to a server inside, what comes back, and what a
// preview's secret opens. The real thing is in tests/integration/ports_test.cc.
#include "api/port_proxy.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "api/previews.h"

namespace moat::api {
namespace {

HttpRequest requestWith(std::vector<std::pair<std::string, std::string>> headers) {
  HttpRequest r;
  r.method = "POST";
  r.target = "/v1/environments/abc/ports/8000/submit?x=1";
  r.host = "localhost:7070";
  r.remote = "127.0.0.1:50312";
  r.body = "hello";
  r.headers = std::move(headers);
  return r;
}

TEST(PortProxy, MoatsCredentialsAndHopByHopHeadersNeverReachTheServerInside) {
  HttpRequest r = requestWith({{"Authorization", "Bearer master-secret"},
                               {"Cookie", "theme=dark; moat_session=s3cr3t; lang=en"},
                               {"X-Moat-CSRF", "csrf-secret"},
                               {"Connection", "keep-alive, X-Private"},
                               {"X-Private", "hop"},
                               {"Keep-Alive", "timeout=5"},
                               {"Proxy-Authorization", "Basic eA=="},
                               {"Transfer-Encoding", "chunked"},
                               {"Content-Length", "999"},
                               {"X-Forwarded-For", "6.6.6.6"},
                               {"Host", "evil.example"},
                               {"Accept", "text/html"}});
  r.authorization = "Bearer master-secret";
  PortForward f;
  f.port = 8000;
  f.target = "/submit?x=1";
  const std::string up = upstreamRequest(r, f);
  EXPECT_EQ(up.rfind("POST /submit?x=1 HTTP/1.1\r\nHost: localhost:8000\r\n", 0), 0u) << up;
  for (const char* secret : {"master-secret", "s3cr3t", "moat_session", "csrf-secret", "X-Private", "timeout=5",
                             "Basic eA", "chunked", "999", "6.6.6.6", "evil.example"}) {
    EXPECT_EQ(up.find(secret), std::string::npos) << secret << " crossed:\n" << up;
  }
  EXPECT_NE(up.find("Cookie: theme=dark; lang=en\r\n"), std::string::npos) << up;
  EXPECT_NE(up.find("Accept: text/html\r\n"), std::string::npos);
  EXPECT_NE(up.find("X-Forwarded-Host: localhost:7070\r\n"), std::string::npos);
  EXPECT_NE(up.find("X-Forwarded-For: 127.0.0.1\r\n"), std::string::npos);
  EXPECT_NE(up.find("Connection: close\r\n"), std::string::npos);
  EXPECT_NE(up.find("Content-Length: 5\r\n\r\nhello"), std::string::npos) << up;

  // A preview's request keeps the app's own Authorization.
  f.dropAuthorization = false;
  EXPECT_NE(
      upstreamRequest(requestWith({{"Authorization", "Basic YXBwOnB3"}}), f).find("Authorization: Basic YXBwOnB3"),
      std::string::npos);
}

TEST(PortProxy, APreviewKeepsOnlyHostOnlyCookies) {
  EXPECT_TRUE(hostOnlyCookie("a=1; Path=/; HttpOnly"));
  EXPECT_TRUE(hostOnlyCookie("domainish=1; Path=/"));
  EXPECT_FALSE(hostOnlyCookie("moat_session=x; Domain=localhost; Path=/"));
  EXPECT_FALSE(hostOnlyCookie("a=1; path=/; DOMAIN = preview.localhost"));
}

// The server inside, as a socketpair: what relayPort does with its answer.
struct Relay {
  int client[2];
  int upstream[2];
  Relay() {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, client), 0);
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, upstream), 0);
  }
  ~Relay() {
    for (int fd : {client[0], client[1], upstream[0], upstream[1]}) ::close(fd);
  }
  std::string readClient() {
    ::shutdown(client[0], SHUT_WR);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(client[1], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }
};

ProxyOutcome answerWith(Relay& relay, const std::string& answer, bool apiOrigin, PortProxyLimits limits = {}) {
  std::thread server([&] {
    char buf[4096];
    ssize_t got = ::read(relay.upstream[1], buf, sizeof buf);
    ssize_t sent = ::write(relay.upstream[1], answer.data(), answer.size());
    (void)got;
    (void)sent;
    ::shutdown(relay.upstream[1], SHUT_WR);
  });
  PortForward f;
  f.port = 8000;
  f.apiOrigin = apiOrigin;
  ProxyOutcome o = relayPort(relay.client[0], "", relay.upstream[0], "GET / HTTP/1.1\r\n\r\n", f, false, false, limits);
  server.join();
  ::shutdown(relay.client[0], SHUT_WR);
  return o;
}

TEST(PortProxy, UnderMoatdsOriginAnAnswerIsSandboxedAndSetsNoCookieNorCors) {
  Relay relay;
  auto o = answerWith(relay,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nSet-Cookie: moat_session=evil\r\n"
                      "Access-Control-Allow-Origin: *\r\nClear-Site-Data: \"cookies\"\r\nConnection: keep-alive\r\n"
                      "Refresh: 0; url=/v1/keys\r\n"
                      "Content-Length: 5\r\n\r\nhello!!",
                      true);
  EXPECT_EQ(o.status, 200);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(relay.client[1], buf, sizeof buf, MSG_DONTWAIT)) > 0) got.append(buf, static_cast<size_t>(n));
  EXPECT_NE(got.find("Content-Security-Policy: sandbox\r\n"), std::string::npos) << got;
  EXPECT_EQ(got.find("Set-Cookie"), std::string::npos) << got;
  EXPECT_EQ(got.find("Access-Control"), std::string::npos) << got;
  EXPECT_EQ(got.find("Clear-Site-Data"), std::string::npos) << "it would sign the board out: " << got;
  EXPECT_EQ(got.find("Refresh"), std::string::npos) << "it navigates like a redirect: " << got;
  EXPECT_EQ(got.find("keep-alive"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
  EXPECT_EQ(got.substr(got.size() - 5), "hello") << "the body ends at its Content-Length";
}

// A redirect under moatd's origin stays under the port's own path: the
// server inside sees its port as its site's root; nothing it answers can
// send a browser (with the board's cookie) to another environment's port
// or to the API.
TEST(PortProxy, UnderMoatdsOriginALocationStaysUnderThePortsPath) {
  PortForward f;
  f.prefix = "/v1/environments/abcdefabcdef/ports/8000";
  f.host = "localhost:7070";
  f.target = "/app/page?x=1";
  const std::string p = f.prefix;
  EXPECT_EQ(locationUnderPrefix("/login", f), p + "/login");
  EXPECT_EQ(locationUnderPrefix("/", f), p + "/");
  EXPECT_EQ(locationUnderPrefix("next?y=2#top", f), p + "/app/next?y=2#top");
  EXPECT_EQ(locationUnderPrefix("?y=2", f), p + "/app/page?y=2");
  EXPECT_EQ(locationUnderPrefix("#top", f), "#top");
  // Out of the port's path, by any road: kept under it.
  EXPECT_EQ(locationUnderPrefix("/v1/environments/other1234567/ports/80/delete", f),
            p + "/v1/environments/other1234567/ports/80/delete");
  EXPECT_EQ(locationUnderPrefix("../../../../other1234567/ports/80/", f), p + "/other1234567/ports/80/");
  EXPECT_EQ(locationUnderPrefix("/a/../../../v1/keys", f), p + "/v1/keys");
  EXPECT_EQ(locationUnderPrefix("http://localhost:7070/v1/keys", f), p + "/v1/keys");
  EXPECT_EQ(locationUnderPrefix("HTTP://LOCALHOST:7070/../v1", f), p + "/v1");
  EXPECT_EQ(locationUnderPrefix("//localhost:7070/v1/keys", f), p + "/v1/keys");
  EXPECT_EQ(locationUnderPrefix("http://user@localhost:7070?q", f), p + "/?q");
  EXPECT_EQ(locationUnderPrefix("/a/./b/.", f), p + "/a/b/");
  // A browser's other spellings of moatd's origin, and of a path.
  EXPECT_EQ(locationUnderPrefix("http:/v1/keys", f), p + "/v1/keys");
  EXPECT_EQ(locationUnderPrefix("http:v1", f), p + "/app/v1");
  EXPECT_EQ(locationUnderPrefix("http://%6cocalhost:7070/v1", f), p + "/v1");
  EXPECT_EQ(locationUnderPrefix("http://localhost.:7070/v1", f), p + "/v1");
  EXPECT_EQ(locationUnderPrefix("/a\\..\\..\\v1", f), p + "/v1");
  EXPECT_EQ(locationUnderPrefix("/a/%2e%2E/.%2e/v1", f), p + "/v1");
  EXPECT_EQ(locationUnderPrefix("/a/.\t./../v1", f), p + "/v1");
  EXPECT_EQ(locationUnderPrefix("http://2130706433:7070/v1", f), p + "/v1") << "an address may be moatd's";
  EXPECT_EQ(locationUnderPrefix("http://[::1]:7070/v1", f), p + "/v1");
  EXPECT_EQ(locationUnderPrefix("http://localhost:07070/v1", f), p + "/v1") << "a port is a number";
  EXPECT_EQ(locationUnderPrefix("a_:/../../../../v1/keys", f), p + "/v1/keys") << "no scheme: a relative path";
  EXPECT_EQ(locationUnderPrefix("a b:/../../../../v1/keys", f), p + "/v1/keys");
  // Another origin is another site's business.
  EXPECT_EQ(locationUnderPrefix("http://localhost:7071/x", f), "http://localhost:7071/x");
  EXPECT_EQ(locationUnderPrefix("https://example.com/x", f), "https://example.com/x");
  EXPECT_EQ(locationUnderPrefix("mailto:a@b", f), "mailto:a@b");
}

TEST(PortProxy, AHugeOrBrokenHeadIs502AndASilentServer504) {
  {
    Relay relay;
    PortProxyLimits limits;
    limits.maxHeadBytes = 1024;
    auto o = answerWith(relay, "HTTP/1.1 200 OK\r\nX: " + std::string(4096, 'a') + "\r\n\r\n", true, limits);
    EXPECT_EQ(o.status, 502);
    EXPECT_NE(relay.readClient().find("port_bad_response"), std::string::npos);
  }
  {
    Relay relay;
    auto o = answerWith(relay, "SSH-2.0-OpenSSH\r\n\r\n", true);
    EXPECT_EQ(o.status, 502);
  }
  {
    Relay relay;
    PortProxyLimits limits;
    limits.idle = std::chrono::milliseconds(200);
    PortForward f;
    f.port = 8000;
    auto start = std::chrono::steady_clock::now();
    auto o = relayPort(relay.client[0], "", relay.upstream[0], "GET / HTTP/1.1\r\n\r\n", f, false, false, limits);
    EXPECT_EQ(o.status, 504);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    ::shutdown(relay.client[0], SHUT_WR);
    EXPECT_NE(relay.readClient().find("port_timeout"), std::string::npos);
  }
}

TEST(Previews, ASecretOpensItsPreviewUntilExpiryRevocationOrTheEnvironmentsEnd) {
  std::atomic<int64_t> now{1000000};
  Previews previews([&] { return now.load(); });
  auto a = previews.create("env1", 8000, 60, "master");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->secret.size(), 32u) << "128 bits";
  EXPECT_EQ(a->secret.find_first_not_of("0123456789abcdef"), std::string::npos);
  auto b = previews.create("env1", 9000, 3600, "master");
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->secret, b->secret);
  ASSERT_TRUE(previews.resolve(a->secret));
  EXPECT_EQ(previews.resolve(a->secret)->port, 8000);
  EXPECT_FALSE(previews.resolve(std::string(32, '0')));
  EXPECT_FALSE(previews.resolve(a->secret.substr(0, 31)));
  EXPECT_EQ(previews.list("env1").size(), 2u);

  now += 60 * 1000;  // a's ttl
  EXPECT_FALSE(previews.resolve(a->secret)) << "expired";
  EXPECT_EQ(previews.list("env1").size(), 1u);
  EXPECT_FALSE(previews.revoke("env2", b->preview.id)) << "another environment's id";
  EXPECT_TRUE(previews.revoke("env1", b->preview.id));
  EXPECT_FALSE(previews.resolve(b->secret)) << "revoked";

  auto c = previews.create("env1", 80, 60, "master");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(previews.endEnvironment("env1").size(), 1u);
  EXPECT_FALSE(previews.resolve(c->secret)) << "the environment ended";

  for (size_t i = 0; i < Previews::kMaxPerEnvironment; ++i) ASSERT_TRUE(previews.create("env3", 80, 60, "k").ok());
  EXPECT_EQ(previews.create("env3", 80, 60, "k").error().code, Code::kCapacity);
}

TEST(Previews, OnlyHostsUnderThePreviewDomainArePreviews) {
  const std::string secret(32, 'a');
  EXPECT_EQ(previewSecretOf(secret + ".preview.localhost:7070", "preview.localhost"), secret);
  EXPECT_EQ(previewSecretOf(secret + ".PREVIEW.localhost.", "preview.localhost"), secret);
  EXPECT_EQ(previewSecretOf("preview.localhost:7070", "preview.localhost"), "") << "a preview host naming none";
  EXPECT_EQ(previewSecretOf("x." + secret + ".preview.localhost", "preview.localhost"), "");
  EXPECT_EQ(previewSecretOf("short.preview.localhost", "preview.localhost"), "");
  EXPECT_FALSE(previewSecretOf("localhost:7070", "preview.localhost"));
  EXPECT_FALSE(previewSecretOf(secret + ".xpreview.localhost", "preview.localhost"));
  EXPECT_FALSE(previewSecretOf("", "preview.localhost"));
}

}  // namespace
}  // namespace moat::api
