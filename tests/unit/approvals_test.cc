#include "gate/approvals.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "os/file.h"
#include "store/store.h"

namespace moat::gate {
namespace {

class ApprovalsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moat-approvals-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto store = store::openSqliteStore(dir_ + "/moat.db");
    ASSERT_TRUE(store.ok()) << store.error().message();
    store_ = std::move(store.value());
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) {
      EXPECT_TRUE(os::removeTree(dir_).ok());
    }
  }
  std::string dir_;
  std::unique_ptr<store::Store> store_;
};

// Found by fuzz/permissions.cc: a file path is bytes (GET .../files?path=%FF
// carries any), and storing the action of an approval for one that is not
// UTF-8 threw from the JSON serializer: the request failed with a 500
// instead of asking. The bytes are now stored as U+FFFD.
TEST_F(ApprovalsTest, PathThatIsNotUtf8CanBeAskedAbout) {
  ApprovalCenter approvals(*store_);
  Action action;
  action.scope = Scope::kReadFile;
  action.path = "/data/caf\xe9\xff.txt";
  action.op = "read";
  auto requested = approvals.request("0123456789ab", action, "master");
  ASSERT_TRUE(requested.ok()) << requested.error().message();
  auto stored = actionFromJson(requested->action);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->path, "/data/caf\xef\xbf\xbd\xef\xbf\xbd.txt");
  EXPECT_FALSE(nlohmann::json::parse(requested->action, nullptr, false).is_discarded());
  // It is decided like any other.
  auto decided = approvals.decide(requested->id, false, "master", "no", false);
  ASSERT_TRUE(decided.ok()) << decided.error().message();
  EXPECT_EQ(decided->state, store::ApprovalState::kDenied);
}

}  // namespace
}  // namespace moat::gate
