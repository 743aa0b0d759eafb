// The QMP client against a stand-in QEMU on a socketpair: what it sends,
// and which answer it takes for its own.
#include "backend/microvm/qmp.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "backend/microvm/vm.h"
#include "os/socket.h"

namespace moat::backend::microvm {
namespace {

std::string readLine(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

void say(int fd, const std::string& line) {
  ASSERT_EQ(::write(fd, (line + "\n").data(), line.size() + 1), ssize_t(line.size() + 1));
}

// A command that timed out gets its answer late: the next command must
// not take it for its own (each carries an id), and events between are kept.
TEST(Qmp, AnAnswerToAnEarlierCommandIsNeverTakenForTheNextOnes) {
  auto pair = os::streamSocketPair();
  ASSERT_TRUE(pair.ok());
  const int qemu = pair->second.get();
  say(qemu, R"({"QMP": {"version": {}, "capabilities": []}})");
  Qmp qmp(pair->first.get(), std::chrono::steady_clock::now() + std::chrono::seconds(5));
  // The stand-in answers qmp_capabilities only once asked (sent below).
  auto asked = nlohmann::json::parse(R"({"return": {}, "id": 1})");
  say(qemu, asked.dump());
  ASSERT_TRUE(qmp.open().ok());
  EXPECT_EQ(nlohmann::json::parse(readLine(qemu))["execute"], "qmp_capabilities");
  // The first command gets no answer in time.
  qmp.setDeadline(std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
  auto late = qmp.call("human-monitor-command", {{"command-line", "first"}});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().code, Code::kTimeout);
  auto first = nlohmann::json::parse(readLine(qemu));
  EXPECT_EQ(first["id"], 2);
  // Its answer comes now, then an event, then the second command's.
  say(qemu, R"({"return": "first's answer", "id": 2})");
  say(qemu, R"({"event": "RTC_CHANGE", "data": {"offset": 1}})");
  say(qemu, R"({"return": "second's answer", "id": 3})");
  qmp.setDeadline(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  auto second = qmp.call("human-monitor-command", {{"command-line", "second"}});
  ASSERT_TRUE(second.ok()) << second.error().message();
  EXPECT_EQ(second.value(), "second's answer");
  EXPECT_EQ(nlohmann::json::parse(readLine(qemu))["id"], 3);
  auto event = qmp.awaitEvent("RTC_CHANGE");
  ASSERT_TRUE(event.ok());
  EXPECT_EQ(event.value()["offset"], 1);
}

// A re-attach reads up to its nonce's frame and not a byte past it, even
// when the mark comes a byte at a time or straddles what was read before;
// it gives up past its bound or its deadline.
TEST(ReadThrough, StopsRightAfterTheMarkWhereverItFalls) {
  const std::string mark = "\x01MARK-nonce-0123456789";
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{7}, size_t{64 << 10}}) {
    auto pair = os::streamSocketPair();
    ASSERT_TRUE(pair.ok());
    const std::string stale = std::string(100000, 'x') + "\x01MARK-nonce-01234" + "MARK";  // near misses
    const std::string sent = stale + mark + "HELLO";
    std::thread writer([&] {
      for (size_t at = 0; at < sent.size(); at += chunk) {
        const std::string piece = sent.substr(at, chunk);
        ASSERT_EQ(::write(pair->second.get(), piece.data(), piece.size()), ssize_t(piece.size()));
      }
    });
    Status read = readThrough(pair->first.get(), mark, std::chrono::seconds(20), 1 << 20);
    writer.join();
    ASSERT_TRUE(read.ok()) << "chunk " << chunk << ": " << read.error().message();
    char next[5];
    ASSERT_EQ(::read(pair->first.get(), next, sizeof next), 5) << "chunk " << chunk;
    EXPECT_EQ(std::string(next, 5), "HELLO") << "chunk " << chunk;
  }
  auto pair = os::streamSocketPair();
  ASSERT_TRUE(pair.ok());
  const std::string flood(70000, 'y');
  ASSERT_EQ(::write(pair->second.get(), flood.data(), flood.size()), ssize_t(flood.size()));
  auto over = readThrough(pair->first.get(), mark, std::chrono::seconds(5), 60000);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, Code::kProtocol);
  auto late = readThrough(pair->first.get(), mark, std::chrono::milliseconds(200), 1 << 20);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().code, Code::kTimeout);
}

}  // namespace
}  // namespace moat::backend::microvm
