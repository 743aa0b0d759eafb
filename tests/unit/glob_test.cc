#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "gate/permissions.h"

// gate::globMatch: the gate's path, argv and host rules, the egress policy's
// hosts and paths, and the hosts a secret is bound to.
namespace moat::gate {
namespace {

TEST(Glob, Semantics) {
  EXPECT_TRUE(globMatch("/etc/*", "/etc/passwd", true));
  EXPECT_FALSE(globMatch("/etc/*", "/etc/ssh/config", true));  // '*' stays in a segment
  EXPECT_TRUE(globMatch("/etc/**", "/etc/ssh/config", true));  // '**' crosses
  EXPECT_TRUE(globMatch("/etc/**", "/etc/", true));
  EXPECT_TRUE(globMatch("/a/**/b", "/a/x/y/b", true));
  EXPECT_TRUE(globMatch("/a/***", "/a/x/y", true));  // "**" then "*"
  EXPECT_FALSE(globMatch("/a?b", "/a/b", true));     // '?' is not '/'
  EXPECT_TRUE(globMatch("/a?b", "/a/b", false));
  EXPECT_TRUE(globMatch("*", "a/b", false));  // outside paths '*' takes anything
  EXPECT_TRUE(globMatch("**", "", true));
  EXPECT_TRUE(globMatch("", "", false));
  EXPECT_FALSE(globMatch("", "a", false));
  EXPECT_TRUE(globMatch("\\*", "*", false));  // escapes
  EXPECT_FALSE(globMatch("\\*", "a", false));
  EXPECT_TRUE(globMatch("a\\", "a\\", false));  // a last backslash is itself
  EXPECT_TRUE(globMatch("*.pypi.org", "files.pypi.org", false));
  EXPECT_FALSE(globMatch("*.pypi.org", "pypi.org", false));
  EXPECT_TRUE(globMatch(globEscape("/data/*?\\x"), "/data/*?\\x", true));
  EXPECT_FALSE(globMatch(globEscape("/data/*"), "/data/x", true));
}

// Found while writing fuzz/permissions.cc: matching backtracked over every
// '*', in time exponential in the number of stars. A rule's pattern against
// a path or argument from inside an environment held moatd's thread for
// minutes and more; now it is one pass over the text.
TEST(Glob, ManyStarsAgainstLongTextsAreFast) {
  auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(globMatch("*a*a*a*a*a*a*a*a*a*a*a*a*b", std::string(4096, 'a'), false));
  EXPECT_FALSE(globMatch("/a/*b*b*b*b*b*b*b*b*c/**", "/a/" + std::string(65536, 'b'), true));
  EXPECT_TRUE(globMatch("/a/*b*b*b*b*b*b*b*b*c/**", "/a/" + std::string(65536, 'b') + "c/x", true));
  std::string stars;
  for (int i = 0; i < 200; ++i) stars += "*?";
  EXPECT_TRUE(globMatch(stars, std::string(400, 'x'), false));  // more stars than the old depth limit of 64
  EXPECT_FALSE(globMatch(stars + "!", std::string(4096, 'x'), false));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
}

// A program's rule sees the file the exec names, whatever argv[0] says.
TEST(Glob, AProgramIsJudgedByTheFileItNames) {
  EXPECT_EQ(judgedArgv("/usr/bin/rm", {"ls", "-rf", "/"}), (std::vector<std::string>{"/usr/bin/rm", "-rf", "/"}));
  EXPECT_EQ(judgedArgv("/bin/true", {}), (std::vector<std::string>{"/bin/true"}));
  EXPECT_TRUE(argvMatch({"rm", "*"}, judgedArgv("/usr/bin/rm", {"ls", "-rf", "/"})));
  auto rules = Permissions::parse(
      nlohmann::json{{"run_command", {{{"match", {"rm", "*"}}, {"action", "deny"}}, {{"action", "allow"}}}}},
      Permissions::defaults());
  ASSERT_TRUE(rules.ok()) << rules.error().message();
  Action program;
  program.scope = Scope::kRunCommand;
  program.op = "program";
  program.program = "/usr/bin/rm";
  program.argv = {"ls", "-rf", "/workspace"};
  EXPECT_EQ(rules->evaluate(program).decision, Decision::kDeny);
  // A command moatd runs names its program in argv[0].
  Action command;
  command.scope = Scope::kRunCommand;
  command.argv = {"ls", "/workspace"};
  EXPECT_EQ(rules->evaluate(command).decision, Decision::kAllow);
}

}  // namespace
}  // namespace moat::gate
