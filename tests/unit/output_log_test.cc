#include "manager/output_log.h"

#include <gtest/gtest.h>

namespace moat::manager {
namespace {

std::string joined(const std::vector<OutputItem>& items, OutputStream stream) {
  std::string out;
  for (const auto& i : items) {
    if (!i.dropped && i.stream == stream) out += i.data;
  }
  return out;
}

TEST(OutputLog, ReadsFromAnyOffsetInOrder) {
  OutputLog log(1024);
  log.append(OutputStream::kStdout, "hello ");
  log.append(OutputStream::kStderr, "oops ");
  log.append(OutputStream::kStdout, "world");
  EXPECT_EQ(log.end(), 16u);
  auto all = log.read(0, 1 << 20);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1].stream, OutputStream::kStderr);
  EXPECT_EQ(all[1].offset, 6u);
  auto tail = log.read(8, 1 << 20);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].data, "ps ");
  EXPECT_EQ(tail[0].offset, 8u);
  EXPECT_EQ(joined(tail, OutputStream::kStdout), "world");
  EXPECT_TRUE(log.read(16, 100).empty());
  EXPECT_TRUE(log.read(1000, 100).empty()) << "past the end is nothing, not garbage";
}

TEST(OutputLog, SmallWritesMergeButStreamsStaySeparate) {
  OutputLog log(1024);
  for (int i = 0; i < 100; ++i) log.append(OutputStream::kStdout, "x");
  log.append(OutputStream::kStderr, "e");
  log.append(OutputStream::kStdout, "y");
  auto items = log.read(0, 1 << 20);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].data, std::string(100, 'x'));
  EXPECT_EQ(log.collect(OutputStream::kStdout), std::string(100, 'x') + "y");
  EXPECT_EQ(log.collect(OutputStream::kStderr), "e");
}

TEST(OutputLog, EvictionIsPerStreamAndReportedAsDropped) {
  OutputLog log(10);
  log.append(OutputStream::kStderr, "E");
  log.append(OutputStream::kStdout, std::string(8, 'a'));
  log.append(OutputStream::kStdout, std::string(8, 'b'));  // 6 bytes of 'a' must go
  EXPECT_EQ(log.droppedBytes(OutputStream::kStdout), 6u);
  EXPECT_EQ(log.droppedBytes(OutputStream::kStderr), 0u);
  EXPECT_EQ(log.collect(OutputStream::kStdout), "aabbbbbbbb");
  EXPECT_EQ(log.collect(OutputStream::kStderr), "E") << "stderr keeps its own share";
  auto items = log.read(0, 1 << 20);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].data, "E");
  EXPECT_TRUE(items[1].dropped);
  EXPECT_EQ(items[1].offset, 1u);
  EXPECT_EQ(items[1].length, 6u);
  EXPECT_EQ(items[2].offset, 7u);
  // Offsets still add up to the end.
  EXPECT_EQ(items[2].offset + items[2].data.size(), log.end());
}

TEST(OutputLog, ReadsAreBoundedAndResumable) {
  OutputLog log(1 << 20);
  log.append(OutputStream::kStdout, std::string(10000, 'z'));
  auto first = log.read(0, 4096);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].data.size(), 4096u);
  auto second = log.read(4096, 1 << 20);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].offset, 4096u);
  EXPECT_EQ(second[0].data.size(), 10000u - 4096u);
}

TEST(OutputLog, EverythingDroppedIsStillAccountedFor) {
  OutputLog log(4);
  log.append(OutputStream::kStdout, "0123456789");
  auto items = log.read(0, 1 << 20);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_TRUE(items[0].dropped);
  EXPECT_EQ(items[0].length, 6u);
  EXPECT_EQ(items[1].data, "6789");
  EXPECT_EQ(log.bytes(OutputStream::kStdout), 10u);
}

TEST(OutputLog, TakeMovesOneStreamOutAndKeepsTheCounts) {
  // A blocking exec's result: each stream taken once, never held twice.
  OutputLog log(1u << 20);
  for (int i = 0; i < 50; ++i) {
    log.append(OutputStream::kStdout, std::string(5000, 'o'));
    log.append(OutputStream::kStderr, "e");
  }
  EXPECT_EQ(log.take(OutputStream::kStdout), std::string(250000, 'o'));
  EXPECT_EQ(log.collect(OutputStream::kStdout), "") << "taken, not copied";
  EXPECT_EQ(log.take(OutputStream::kStderr), std::string(50, 'e'));
  EXPECT_EQ(log.bytes(OutputStream::kStdout), 250000u);
  EXPECT_EQ(log.droppedBytes(OutputStream::kStdout), 0u);
  EXPECT_EQ(log.end(), 250050u);
  log.append(OutputStream::kStdout, "later");
  EXPECT_EQ(log.collect(OutputStream::kStdout), "later");
}

}  // namespace
}  // namespace moat::manager
