// McpSessions: the table of open MCP sessions, its limits, and who may use
// a session. The sessions' REST calls go to a recorder: what is tested is
// the table, not the tools.
#include "api/mcp_sessions.h"

#include <gtest/gtest.h>

#include <atomic>

namespace moat::api {
namespace {

class Recorder final : public mcp::RestBackend {
 public:
  mcp::RestResponse call(const std::string&, const std::string&, const std::string&) override {
    ++calls;
    return {404, "{}", "application/json"};
  }
  std::atomic<int> calls{0};
};

std::shared_ptr<McpHttpSession> session(const std::string& token, const std::string& owner) {
  auto s = std::make_shared<McpHttpSession>();
  s->authorization = "Bearer " + token;
  s->owner = owner;
  s->master = owner == "master";
  s->rest = std::make_unique<Recorder>();
  s->session = std::make_unique<mcp::Session>(*s->rest, "moat", "test");
  return s;
}

TEST(McpSessions, OnlyTheTokenThatOpenedASessionFindsOrEndsIt) {
  McpSessions sessions;
  ASSERT_FALSE(sessions.add("s1", session("alice", "k1")));
  EXPECT_TRUE(sessions.find("s1", "Bearer alice"));
  EXPECT_FALSE(sessions.find("s1", "Bearer mallory"));
  EXPECT_FALSE(sessions.remove("s1", "Bearer mallory"));
  EXPECT_EQ(sessions.size(), 1u);
  EXPECT_TRUE(sessions.remove("s1", "Bearer alice"));
  EXPECT_FALSE(sessions.find("s1", "Bearer alice"));
}

TEST(McpSessions, AKeyGetsItsShareAndTheMasterOnlyTheOverallLimit) {
  McpSessions sessions(McpSessionLimits{3, 2, std::chrono::minutes(30)});
  ASSERT_FALSE(sessions.add("a", session("k", "k1")));
  ASSERT_FALSE(sessions.add("b", session("k", "k1")));
  auto third = sessions.add("c", session("k", "k1"));
  ASSERT_TRUE(third);
  EXPECT_EQ(*third, "this key has 2 MCP sessions open (at most 2 per key); end some with DELETE /mcp");
  ASSERT_FALSE(sessions.add("m", session("root", "master")));
  auto full = sessions.add("n", session("root", "master"));
  ASSERT_TRUE(full);
  EXPECT_EQ(*full, "too many MCP sessions open (3); end some with DELETE /mcp");
}

TEST(McpSessions, SessionsUnusedLongerThanTheLimitAreEnded) {
  McpSessions sessions(McpSessionLimits{10, 10, std::chrono::seconds(60)});
  ASSERT_FALSE(sessions.add("old", session("k", "k1")));
  ASSERT_FALSE(sessions.add("other", session("k", "k1")));
  const auto later = std::chrono::steady_clock::now() + std::chrono::seconds(61);
  sessions.expire(later - std::chrono::seconds(30));  // 31 s unused: both kept
  EXPECT_EQ(sessions.size(), 2u);
  sessions.expire(later);
  EXPECT_EQ(sessions.size(), 0u);
  ASSERT_FALSE(sessions.add("again", session("k", "k1")));
  sessions.closeAll();
  EXPECT_EQ(sessions.size(), 0u);
}

}  // namespace
}  // namespace moat::api
