#include <gtest/gtest.h>

#include "init/protocol.h"

namespace moat::init {
namespace {

TEST(Protocol, SpawnRoundTrip) {
  SpawnRequest req;
  req.id = 7;
  req.argv = {"sh", "-c", "echo hi"};
  req.env = {"A=1"};
  req.cwd = "/workspace";
  req.stdinPipe = true;
  req.timeoutMs = 1500;
  req.outputLimit = 4096;
  auto back = SpawnRequest::decode(req.encode());
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->id, 7u);
  EXPECT_EQ(back->argv, req.argv);
  EXPECT_EQ(back->env, req.env);
  EXPECT_EQ(back->cwd, "/workspace");
  EXPECT_TRUE(back->stdinPipe);
  EXPECT_FALSE(back->pty);
  EXPECT_EQ(back->timeoutMs, 1500u);
  EXPECT_EQ(back->outputLimit, 4096u);
}

}  // namespace
}  // namespace moat::init
