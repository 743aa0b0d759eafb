// ExecOutputBudget: what one caller's execs in flight may hold of output.
#include "manager/exec_output_budget.h"

#include <gtest/gtest.h>

namespace moat::manager {
namespace {

TEST(ExecOutputBudget, ACallerBeyondItsBudgetIsToldAndAnotherCallerIsNot) {
  ExecOutputBudget budget(100u << 20);
  auto a = budget.reserve("key-a", 60u << 20);
  ASSERT_TRUE(a.ok());
  auto over = budget.reserve("key-a", 60u << 20);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, Code::kCapacity);
  EXPECT_NE(over.error().message().find("already hold 60 MiB"), std::string::npos) << over.error().message();
  auto b = budget.reserve("key-b", 60u << 20);  // a budget of its own
  EXPECT_TRUE(b.ok());
  EXPECT_EQ(budget.held("key-a"), 60u << 20);
}

TEST(ExecOutputBudget, AReleasedReservationIsGivenBackWhole) {
  ExecOutputBudget budget(100u << 20);
  {
    auto a = budget.reserve("key-a", 100u << 20);
    ASSERT_TRUE(a.ok());
    EXPECT_FALSE(budget.reserve("key-a", 1).ok());
  }
  EXPECT_EQ(budget.held("key-a"), 0u);
  EXPECT_TRUE(budget.reserve("key-a", 100u << 20).ok());
}

TEST(ExecOutputBudget, AReservationLargerThanTheWholeBudgetDoesNotWrapAround) {
  ExecOutputBudget budget(100u << 20);
  auto a = budget.reserve("key-a", 10);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(budget.reserve("key-a", UINT64_MAX - 5).ok());
  EXPECT_FALSE(budget.reserve("key-b", (100u << 20) + 1).ok());
}

}  // namespace
}  // namespace moat::manager
