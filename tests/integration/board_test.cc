// The board's surface in moatd (docs/BOARD.md): its assets, its sign-in
// sessions, and what a request made with the session cookie may do. The
// page itself is tested in a browser (tests/board).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "moatd_fixture.h"
#include "moatd_process.h"
#include "os/file.h"

namespace moat::test {
namespace {

using json = nlohmann::json;

class Board : public MoatdFixture {
 protected:
  void SetUp() override {
    if (!isRoot()) GTEST_SKIP() << "needs root: moatd creates namespaces, cgroups and mounts (CI runs as root)";
    boardDir_ = ::testing::TempDir() + "board-" + std::to_string(::getpid());
    ASSERT_TRUE(os::makeDirs(boardDir_).ok());
    ASSERT_TRUE(os::writeFile(boardDir_ + "/index.html", "<!doctype html><title>moat</title>").ok());
    ASSERT_TRUE(os::writeFile(boardDir_ + "/board.js", "console.log('board')").ok());
    daemon_ = std::make_unique<Moatd>(std::vector<std::string>{"--board-dir", boardDir_});
  }
  void TearDown() override {
    daemon_.reset();
    (void)os::removeTree(boardDir_);
  }

  // Signs in with `token`: the session cookie ("moat_session=...") and csrf.
  std::pair<std::string, std::string> signIn(const std::string& token) {
    auto r = daemon_->request("POST", "/ui/session", json{{"token", token}}.dump(), false);
    EXPECT_EQ(r.status, 200) << r.body;
    const std::string setCookie = r.headers["set-cookie"];
    EXPECT_NE(setCookie.find("HttpOnly"), std::string::npos) << setCookie;
    EXPECT_NE(setCookie.find("SameSite=Strict"), std::string::npos) << setCookie;
    EXPECT_NE(setCookie.find("Path=/"), std::string::npos) << setCookie;
    return {setCookie.substr(0, setCookie.find(';')), json::parse(r.body).value("csrf", "")};
  }

  HttpResult withSession(const std::string& method, const std::string& target, const std::string& cookie,
                         std::map<std::string, std::string> headers = {}, const std::string& body = "") {
    headers["Cookie"] = cookie;
    return daemon_->request(method, target, body, false, headers);
  }

  std::string boardDir_;
};

TEST_F(Board, ThePageAndItsAssetsComeWithAStrictPolicyAndNeedNoToken) {
  auto page = daemon_->request("GET", "/", "", false);
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.contentType, "text/html; charset=utf-8");
  EXPECT_EQ(page.body, "<!doctype html><title>moat</title>");
  const std::string csp = page.headers["content-security-policy"];
  EXPECT_NE(csp.find("script-src 'self';"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe-eval"), std::string::npos) << csp;
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos) << csp;
  EXPECT_EQ(page.headers["x-content-type-options"], "nosniff");
  auto script = daemon_->request("GET", "/board/board.js", "", false);
  EXPECT_EQ(script.status, 200);
  EXPECT_EQ(script.contentType, "text/javascript; charset=utf-8");
  // Only the board's own flat files: no other path, no dot files, no
  // unknown kinds of file.
  ASSERT_TRUE(os::writeFile(boardDir_ + "/.secret.js", "x").ok());
  for (const char* path : {"/board/.secret.js", "/board/%2e%2e%2fmaster-token.js", "/board/x/board.js",
                           "/board/board.js.map", "/board/missing.js", "/board/"}) {
    auto r = daemon_->request("GET", path, "", false);
    EXPECT_EQ(r.status, 404) << path << " -> " << r.body;
  }
  EXPECT_EQ(daemon_->request("POST", "/board/board.js", "", false).status, 405);
  // A token is still needed for everything else.
  EXPECT_EQ(daemon_->request("GET", "/v1/environments", "", false).status, 401);
}

TEST_F(Board, AMoatdWithoutABuiltBoardSaysSo) {
  ASSERT_TRUE(os::removeTree(boardDir_).ok());
  ASSERT_TRUE(os::makeDirs(boardDir_).ok());
  auto page = daemon_->request("GET", "/", "", false);
  EXPECT_EQ(page.status, 503);
  EXPECT_NE(page.body.find("make build"), std::string::npos) << page.body;
}

TEST_F(Board, ASessionActsAsItsTokenAndStateChangesNeedTheCsrfHeader) {
  auto [cookie, csrf] = signIn(daemon_->token());
  ASSERT_EQ(csrf.size(), 64u);
  auto who = withSession("GET", "/ui/session", cookie);
  EXPECT_EQ(who.status, 200) << who.body;
  EXPECT_EQ(json::parse(who.body)["principal"]["master"], true);
  EXPECT_EQ(json::parse(who.body)["csrf"], csrf);
  // Reading needs only the cookie.
  EXPECT_EQ(withSession("GET", "/v1/environments", cookie).status, 200);
  // A state change without the header, or with another value, is refused
  // and changes nothing.
  auto bare = withSession("POST", "/v1/environments", cookie, {}, "{}");
  EXPECT_EQ(bare.status, 403) << bare.body;
  EXPECT_NE(bare.body.find("X-Moat-CSRF"), std::string::npos) << bare.body;
  auto wrong = withSession("POST", "/v1/environments", cookie, {{"X-Moat-CSRF", std::string(64, 'a')}}, "{}");
  EXPECT_EQ(wrong.status, 403) << wrong.body;
  EXPECT_EQ(json::parse(call("GET", "/v1/environments", nullptr, 200).dump())["environments"].size(), 0u);
  auto made = withSession("POST", "/v1/environments", cookie, {{"X-Moat-CSRF", csrf}}, "{}");
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = json::parse(made.body)["id"];
  auto stats = withSession("GET", "/v1/stats", cookie);
  ASSERT_EQ(stats.status, 200) << stats.body;
  ASSERT_EQ(json::parse(stats.body)["environments"].size(), 1u) << stats.body;
  EXPECT_EQ(json::parse(stats.body)["environments"][0]["id"], id);
  EXPECT_GT(json::parse(stats.body)["environments"][0]["pids"].get<int>(), 0);
  EXPECT_EQ(withSession("DELETE", "/v1/environments/" + id, cookie).status, 403);
  EXPECT_EQ(withSession("DELETE", "/v1/environments/" + id, cookie, {{"X-Moat-CSRF", csrf}}).status, 204);
  // What calls this API again in process with the caller's token (an agent
  // run making its environment) gets the session's.
  auto run = withSession("POST", "/v1/agents", cookie, {{"X-Moat-CSRF", csrf}},
                         json{{"instruction", "x"},
                              {"provider", {{"kind", "openai"}, {"model", "m"}, {"base_url", "http://127.0.0.1:9/v1"}}}}
                             .dump());
  ASSERT_EQ(run.status, 201) << run.body;
  const std::string runId = json::parse(run.body)["id"];
  EXPECT_EQ(withSession("POST", "/v1/agents/" + runId + "/stop", cookie, {{"X-Moat-CSRF", csrf}}).status, 200);
}

TEST_F(Board, ForeignOriginsAndRebindingHostsAreRefused) {
  auto [cookie, csrf] = signIn(daemon_->token());
  auto foreign =
      withSession("POST", "/v1/environments", cookie, {{"X-Moat-CSRF", csrf}, {"Origin", "http://evil.example"}}, "{}");
  EXPECT_EQ(foreign.status, 403) << foreign.body;
  EXPECT_NE(foreign.body.find("http://evil.example"), std::string::npos) << foreign.body;
  auto rebound = withSession("GET", "/v1/environments", cookie, {{"Host", "evil.example:7070"}});
  EXPECT_EQ(rebound.status, 403) << rebound.body;
  auto signInRebound = daemon_->request("POST", "/ui/session", json{{"token", daemon_->token()}}.dump(), false,
                                        {{"Host", "attacker.example"}});
  EXPECT_EQ(signInRebound.status, 403) << signInRebound.body;
  // The same origin, and addresses, are fine.
  EXPECT_EQ(
      withSession("GET", "/v1/environments", cookie, {{"Host", "127.0.0.1:7070"}, {"Origin", "http://127.0.0.1:7070"}})
          .status,
      200);
  EXPECT_EQ(withSession("GET", "/v1/environments", cookie, {{"Host", "[::1]:7070"}}).status, 200);
  // A form cannot sign in (it cannot send JSON).
  auto form = daemon_->request("POST", "/ui/session", "token=" + daemon_->token(), false,
                               {{"Content-Type", "application/x-www-form-urlencoded"}});
  EXPECT_EQ(form.status, 415) << form.body;
  // A WebSocket opened with the cookie needs an Origin, and the same one.
  std::string id = createEnv();
  auto noOrigin = daemon_->websocket("/v1/environments/" + id + "/shell", false, {{"Cookie", cookie}});
  EXPECT_EQ(noOrigin.status, 403);
  auto otherOrigin = daemon_->websocket("/v1/environments/" + id + "/shell", false,
                                        {{"Cookie", cookie}, {"Origin", "http://evil.example"}});
  EXPECT_EQ(otherOrigin.status, 403);
  auto own = daemon_->websocket("/v1/environments/" + id + "/shell", false,
                                {{"Cookie", cookie}, {"Origin", "http://localhost"}});
  EXPECT_EQ(own.status, 101);
  for (int fd : {noOrigin.fd, otherOrigin.fd, own.fd}) {
    if (fd >= 0) ::close(fd);
  }
}

// A preview's page (x.preview.localhost:7070) is same-site with the board
// (localhost:7070): SameSite=Strict sends the cookie along. Without an
// Origin (a GET, an <img>, a navigation) only Sec-Fetch-Site tells them
// apart: each of these passed the Host, Origin and CSRF checks alone.
TEST_F(Board, TheSessionServesOnlyItsOwnOriginNotASameSitePreview) {
  auto [cookie, csrf] = signIn(daemon_->token());
  std::string id = createEnv();
  for (const char* site : {"same-site", "cross-site"}) {
    auto read = withSession("GET", "/v1/environments", cookie, {{"Sec-Fetch-Site", site}});
    EXPECT_EQ(read.status, 403) << site << ": " << read.body;
    EXPECT_NE(read.body.find("Sec-Fetch-Site"), std::string::npos) << read.body;
    auto write = withSession("POST", "/v1/environments/" + id + "/exec", cookie,
                             {{"Sec-Fetch-Site", site}, {"X-Moat-CSRF", csrf}}, R"({"cmd":["true"]})");
    EXPECT_EQ(write.status, 403) << site << ": " << write.body;
    auto again = withSession("GET", "/ui/session", cookie, {{"Sec-Fetch-Site", site}});
    EXPECT_EQ(again.status, 403) << "the csrf value must not be readable either: " << again.body;
    auto ws = daemon_->websocket("/v1/environments/" + id + "/shell", false,
                                 {{"Cookie", cookie}, {"Origin", "http://localhost"}, {"Sec-Fetch-Site", site}});
    EXPECT_EQ(ws.status, 403) << site;
    if (ws.fd >= 0) ::close(ws.fd);
    auto proxied = withSession("GET", "/v1/environments/" + id + "/ports/8000/", cookie, {{"Sec-Fetch-Site", site}});
    EXPECT_EQ(proxied.status, 403) << site << ": " << proxied.body;
  }
  // The board's own pages, and the person's own doing, are fine.
  EXPECT_EQ(withSession("GET", "/v1/environments", cookie, {{"Sec-Fetch-Site", "same-origin"}}).status, 200);
  EXPECT_EQ(withSession("GET", "/v1/environments", cookie, {{"Sec-Fetch-Site", "none"}}).status, 200);
  // A token is not a session: Sec-Fetch-Site does not matter to it.
  EXPECT_EQ(daemon_->request("GET", "/v1/environments", "", true, {{"Sec-Fetch-Site", "cross-site"}}).status, 200);
}

TEST_F(Board, ABadTokenSignsNobodyInAndSignOutEndsTheSession) {
  auto bad = daemon_->request("POST", "/ui/session",
                              json{{"token", "moat_000000000000_" + std::string(64, '0')}}.dump(), false);
  EXPECT_EQ(bad.status, 401) << bad.body;
  EXPECT_EQ(bad.headers.count("set-cookie"), 0u);
  EXPECT_EQ(daemon_->request("POST", "/ui/session", json{{"token", 7}}.dump(), false).status, 400);
  EXPECT_EQ(daemon_->request("POST", "/ui/session", json{{"token", "x"}, {"remember", true}}.dump(), false).status,
            400);
  EXPECT_EQ(withSession("GET", "/v1/environments", "moat_session=" + std::string(64, 'f')).status, 401);
  auto [cookie, csrf] = signIn(daemon_->token());
  EXPECT_EQ(withSession("DELETE", "/ui/session", cookie).status, 403);  // no CSRF header
  auto out = withSession("DELETE", "/ui/session", cookie, {{"X-Moat-CSRF", csrf}});
  EXPECT_EQ(out.status, 204);
  EXPECT_NE(out.headers["set-cookie"].find("Max-Age=0"), std::string::npos);
  EXPECT_EQ(withSession("GET", "/v1/environments", cookie).status, 401);
  EXPECT_EQ(withSession("GET", "/ui/session", cookie).status, 401);
  // Sign-in and sign-out are in the audit log, without the token.
  auto log = daemon_->request("GET", "/v1/events?type=session.").body;
  EXPECT_NE(log.find("\"session.opened\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"session.closed\""), std::string::npos) << log;
  EXPECT_EQ(log.find(daemon_->token()), std::string::npos);
}

TEST_F(Board, AKeysSessionHasItsScopesAndOwnEnvironmentsAndEndsWithTheKey) {
  json key = call("POST", "/v1/keys", {{"name", "viewer"}, {"scopes", {"read", "create"}}}, 201);
  std::string theirs = createEnv();  // the master's
  auto [cookie, csrf] = signIn(key["token"]);
  auto who = json::parse(withSession("GET", "/ui/session", cookie).body);
  EXPECT_EQ(who["principal"]["master"], false);
  EXPECT_EQ(who["principal"]["key"], key["id"]);
  auto made = withSession("POST", "/v1/environments", cookie, {{"X-Moat-CSRF", csrf}}, "{}");
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string mine = json::parse(made.body)["id"];
  auto list = json::parse(withSession("GET", "/v1/environments", cookie).body)["environments"];
  ASSERT_EQ(list.size(), 1u) << list;
  EXPECT_EQ(list[0]["id"], mine);
  auto stats = json::parse(withSession("GET", "/v1/stats", cookie).body)["environments"];
  ASSERT_EQ(stats.size(), 1u) << stats;
  EXPECT_EQ(stats[0]["id"], mine);
  EXPECT_EQ(withSession("GET", "/v1/environments/" + theirs, cookie).status, 404);
  // Without the destroy scope, the session cannot destroy either.
  EXPECT_EQ(withSession("DELETE", "/v1/environments/" + mine, cookie, {{"X-Moat-CSRF", csrf}}).status, 403);
  EXPECT_EQ(withSession("GET", "/v1/keys", cookie).status, 403);
  // A revoked key's session ends with it.
  call("DELETE", "/v1/keys/" + key["id"].get<std::string>(), nullptr, 204);
  EXPECT_EQ(withSession("GET", "/v1/environments", cookie).status, 401);
  EXPECT_EQ(withSession("GET", "/ui/session", cookie).status, 401);
}

TEST_F(Board, TheFleetsStatsComeAsAStreamOfReadings) {
  std::string id = createEnv();
  auto stream = daemon_->stream("/v1/stats?follow=1&interval_ms=500");
  ASSERT_EQ(stream.status(), 200);
  // Three readings, each naming the environment; the second one only after
  // the interval (not all at once).
  std::vector<std::chrono::steady_clock::time_point> arrived;
  std::string line;
  while (arrived.size() < 3 && stream.nextLine(line, 5000)) {
    if (line.rfind("data: ", 0) != 0) continue;
    arrived.push_back(std::chrono::steady_clock::now());
    auto reading = json::parse(line.substr(6));
    ASSERT_EQ(reading["environments"].size(), 1u) << line;
    EXPECT_EQ(reading["environments"][0]["id"], id);
  }
  ASSERT_EQ(arrived.size(), 3u);
  EXPECT_GE(arrived[2] - arrived[0], std::chrono::milliseconds(900));
  // A destroyed environment leaves the readings.
  call("DELETE", "/v1/environments/" + id, nullptr, 204);
  bool emptied = false;
  for (int i = 0; i < 10 && !emptied && stream.nextLine(line, 5000);) {
    if (line.rfind("data: ", 0) != 0) continue;
    ++i;
    emptied = json::parse(line.substr(6))["environments"].empty();
  }
  EXPECT_TRUE(emptied);
  EXPECT_EQ(daemon_->request("GET", "/v1/stats?follow=1&interval_ms=100").status, 400);
  EXPECT_EQ(daemon_->request("GET", "/v1/stats?interval_ms=x").status, 400);
}

TEST_F(Board, ARevokedKeysStatsStreamEnds) {
  json key = call("POST", "/v1/keys", {{"name", "watcher"}, {"scopes", {"read"}}}, 201);
  auto stream = daemon_->stream("/v1/stats?follow=1&interval_ms=500",
                                {{"Authorization", "Bearer " + key["token"].get<std::string>()}}, false);
  ASSERT_EQ(stream.status(), 200);
  std::string line;
  ASSERT_TRUE(stream.nextLine(line, 5000));
  call("DELETE", "/v1/keys/" + key["id"].get<std::string>(), nullptr, 204);
  bool ended = false;
  for (int i = 0; i < 20 && !ended; ++i) {
    if (!stream.nextLine(line, 5000)) break;
    ended = line.find("revoked") != std::string::npos;
  }
  EXPECT_TRUE(ended) << "the stream went on after the revocation";
}

}  // namespace
}  // namespace moat::test
