#include "isolation/cgroup/cpus.h"

#include <gtest/gtest.h>

namespace moat::isolation::cgroup {
namespace {

TEST(CpuList, ParsesRangesAndSinglesAsTheKernelWritesThem) {
  auto cpus = parseCpuList("0-2,5,8-9\n");
  ASSERT_TRUE(cpus.ok()) << cpus.error().message();
  EXPECT_EQ(cpus.value(), (std::vector<int>{0, 1, 2, 5, 8, 9}));
  EXPECT_EQ(parseCpuList("").value(), std::vector<int>{});
  EXPECT_EQ(parseCpuList("3").value(), std::vector<int>{3});
  EXPECT_EQ(parseCpuList("2,0-1,1").value(), (std::vector<int>{0, 1, 2}));
}

TEST(CpuList, RefusesWhatIsNoCpuList) {
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "0-99999", "1 2", "1-2-3"}) {
    auto cpus = parseCpuList(bad);
    EXPECT_FALSE(cpus.ok()) << bad;
    if (!cpus.ok()) {
      EXPECT_NE(cpus.error().message().find("bad CPU list"), std::string::npos) << bad;
    }
  }
}

TEST(CpuList, FormatsWithRangesJoinedAndRoundTrips) {
  EXPECT_EQ(formatCpuList({0, 1, 2, 5}), "0-2,5");
  EXPECT_EQ(formatCpuList({}), "");
  EXPECT_EQ(formatCpuList({7}), "7");
  EXPECT_EQ(formatCpuList({1, 3, 4}), "1,3-4");
  EXPECT_EQ(formatCpuList(parseCpuList("0-3,6,9-11").value()), "0-3,6,9-11");
}

TEST(ChooseCpus, AsManyAsTheLimitRoundedUpTakenInTurn) {
  const std::vector<int> host = {0, 1, 2, 3};
  EXPECT_EQ(chooseCpus(host, 1, 0), std::vector<int>{0});
  EXPECT_EQ(chooseCpus(host, 1, 1), std::vector<int>{1});
  EXPECT_EQ(chooseCpus(host, 0.25, 6), std::vector<int>{2});
  EXPECT_EQ(chooseCpus(host, 1.5, 0), (std::vector<int>{0, 1}));
  // Wrapping around: returned ascending.
  EXPECT_EQ(chooseCpus(host, 2, 3), (std::vector<int>{0, 3}));
  EXPECT_EQ(chooseCpus(host, 3, 2), (std::vector<int>{0, 2, 3}));
  // The creator's own CPUs, not 0..n-1.
  EXPECT_EQ(chooseCpus({2, 5, 7}, 1, 1), std::vector<int>{5});
}

TEST(ChooseCpus, NoRestrictionForNoLimitOrALimitOfEveryCpu) {
  const std::vector<int> host = {0, 1};
  EXPECT_TRUE(chooseCpus(host, 0, 0).empty());
  EXPECT_TRUE(chooseCpus(host, 2, 0).empty());
  EXPECT_TRUE(chooseCpus(host, 1.01 + 1, 0).empty());
  EXPECT_TRUE(chooseCpus(host, 64, 0).empty());
  EXPECT_TRUE(chooseCpus({}, 1, 0).empty());
  // A whole number is not rounded up past itself by floating-point noise.
  EXPECT_EQ(chooseCpus({0, 1, 2}, 0.1 + 0.2 + 0.7, 0).size(), 1u);
}

}  // namespace
}  // namespace moat::isolation::cgroup
