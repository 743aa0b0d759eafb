#include "api/board_sessions.h"

#include <gtest/gtest.h>

#include <chrono>

namespace moat::api {
namespace {

using namespace std::chrono_literals;

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  BoardSessions::Clock fn() {
    return [this] { return now; };
  }
};

TEST(BoardSessions, ASessionIsFoundByItsIdAndHoldsItsTokenAndCsrf) {
  BoardSessions sessions;
  auto a = sessions.open("token-a", "master");
  auto b = sessions.open("token-b", "master");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->id.size(), 64u);
  EXPECT_NE(a->id, b->id);
  EXPECT_NE(a->csrf, a->id);
  auto found = sessions.find(a->id);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->token, "token-a");
  EXPECT_EQ(found->csrf, a->csrf);
  EXPECT_FALSE(sessions.find(std::string(64, '0')));
  EXPECT_FALSE(sessions.find(a->id.substr(0, 63)));
  sessions.close(a->id);
  EXPECT_FALSE(sessions.find(a->id));
  EXPECT_TRUE(sessions.find(b->id));
}

TEST(BoardSessions, AnIdleOrOldSessionExpires) {
  FakeClock clock;
  BoardSessionLimits limits;
  limits.idle = 10min;
  limits.lifetime = 60min;
  BoardSessions sessions(limits, clock.fn());
  auto s = sessions.open("t", "master");
  ASSERT_TRUE(s.ok());
  // Used every 9 minutes, it lives until its lifetime ends.
  for (int i = 0; i < 6; ++i) {
    clock.now += 9min;
    EXPECT_TRUE(sessions.find(s->id)) << "after " << (i + 1) * 9 << " min";
  }
  clock.now += 9min;  // 63 min old
  EXPECT_FALSE(sessions.find(s->id));
  auto idle = sessions.open("t", "master");
  clock.now += 10min;
  EXPECT_FALSE(sessions.find(idle->id));
  EXPECT_EQ(sessions.size(), 0u);
}

TEST(BoardSessions, BeyondTheCapTheLeastRecentlyUsedGoes) {
  FakeClock clock;
  BoardSessionLimits limits;
  limits.maxSessions = 3;
  BoardSessions sessions(limits, clock.fn());
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    clock.now += 1s;
    ids.push_back(sessions.open("t" + std::to_string(i), "k" + std::to_string(i))->id);
  }
  clock.now += 1s;
  EXPECT_TRUE(sessions.find(ids[0]));  // the oldest, used now
  clock.now += 1s;
  auto fourth = sessions.open("t3", "k3");
  EXPECT_EQ(sessions.size(), 3u);
  EXPECT_TRUE(sessions.find(ids[0]));
  EXPECT_FALSE(sessions.find(ids[1])) << "the least recently used";
  EXPECT_TRUE(sessions.find(ids[2]));
  EXPECT_TRUE(sessions.find(fourth->id));
}

TEST(BoardSessions, OneOwnerSigningInAgainAndAgainEvictsOnlyItsOwn) {
  FakeClock clock;
  BoardSessionLimits limits;
  limits.maxSessions = 8;
  limits.maxPerOwner = 2;
  BoardSessions sessions(limits, clock.fn());
  clock.now += 1s;
  auto master = sessions.open("m", "master");
  for (int i = 0; i < 50; ++i) {
    clock.now += 1s;
    ASSERT_TRUE(sessions.open("k", "key1").ok());
  }
  EXPECT_TRUE(sessions.find(master->id)) << "another owner's session survives";
  EXPECT_EQ(sessions.size(), 3u);
}

TEST(BoardSessions, CookieValueFindsExactlyTheNamedCookie) {
  EXPECT_EQ(cookieValue("moat_session=abc", "moat_session"), "abc");
  EXPECT_EQ(cookieValue("a=1; moat_session=abc; b=2", "moat_session"), "abc");
  EXPECT_EQ(cookieValue("xmoat_session=abc; moat_session_old=d", "moat_session"), "");
  EXPECT_EQ(cookieValue("a=1;moat_session=z", "moat_session"), "z");
  EXPECT_EQ(cookieValue("", "moat_session"), "");
  EXPECT_EQ(cookieValue("moat_session", "moat_session"), "");
}

TEST(BoardSessions, OnlyLocalNamesAndAddressesAreHostsTheBoardAnswers) {
  for (const char* ok : {"localhost", "localhost:7070", "127.0.0.1", "127.0.0.1:7070", "10.1.2.3:80", "[::1]",
                         "[::1]:7070", "LOCALHOST:1"}) {
    EXPECT_TRUE(hostIsAddressOrLocal(ok)) << ok;
  }
  for (const char* bad : {"", "evil.example", "evil.example:7070", "127.0.0.1.nip.io", "localhost.evil.example",
                          "127.0.0.1:", "127.0.0.1:70x", "[::1", "[::1]x", "[evil]:80", "127.1", "1.2.3.4:123456"}) {
    EXPECT_FALSE(hostIsAddressOrLocal(bad)) << bad;
  }
  EXPECT_TRUE(sameOrigin("http://127.0.0.1:7070", "127.0.0.1:7070"));
  EXPECT_TRUE(sameOrigin("HTTPS://LOCALHOST", "localhost"));
  EXPECT_FALSE(sameOrigin("http://127.0.0.1:7071", "127.0.0.1:7070"));
  EXPECT_FALSE(sameOrigin("http://evil.example", "127.0.0.1:7070"));
  EXPECT_FALSE(sameOrigin("null", "127.0.0.1:7070"));
  EXPECT_FALSE(sameOrigin("http://", ""));
}

}  // namespace
}  // namespace moat::api
