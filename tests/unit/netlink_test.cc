// What moatd reads of a link's counters: an IFLA_STATS64 attribute as the
// running kernel sends it, whose size differs between kernels.
#include "os/netlink.h"

#include <gtest/gtest.h>
#include <linux/if_link.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace moat::os {
namespace {

std::vector<char> stats64(size_t length, uint64_t rxBytes, uint64_t txBytes) {
  std::vector<char> data(length, '\x7f');
  rtnl_link_stats64 stats{};
  stats.rx_bytes = rxBytes;
  stats.tx_bytes = txBytes;
  if (length > 0) std::memcpy(data.data(), &stats, std::min(length, sizeof stats));
  return data;
}

TEST(LinkCounters, EveryKernelsSizeOfTheStructIsRead) {
  // 192: Linux 4.6 to 5.18; these headers' own size; a later kernel's larger one.
  for (size_t length : {size_t{192}, sizeof(rtnl_link_stats64), sizeof(rtnl_link_stats64) + 16}) {
    auto data = stats64(length, 1234, 5678);
    auto counters = linkCountersIn(data.data(), data.size());
    ASSERT_TRUE(counters.has_value()) << length << " bytes";
    EXPECT_EQ(counters->receivedBytes, 1234u) << length;
    EXPECT_EQ(counters->sentBytes, 5678u) << length;
  }
}

TEST(LinkCounters, AnAttributeTooShortForTheByteCountsGivesNone) {
  const size_t needed = offsetof(rtnl_link_stats64, tx_bytes) + sizeof(uint64_t);
  for (size_t length : {size_t{0}, size_t{8}, needed - 1}) {
    auto data = stats64(length, 1, 2);
    EXPECT_FALSE(linkCountersIn(data.data(), data.size()).has_value()) << length << " bytes";
  }
  auto data = stats64(needed, 1, 2);
  auto counters = linkCountersIn(data.data(), data.size());
  ASSERT_TRUE(counters.has_value());
  EXPECT_EQ(counters->sentBytes, 2u);
}

}  // namespace
}  // namespace moat::os
