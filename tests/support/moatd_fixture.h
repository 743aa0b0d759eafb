#pragma once

// A real moatd per test, and the calls most tests make to it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "moat_process.h"
#include "moatd_process.h"

namespace moat::test {

class MoatdFixture : public ::testing::Test {
 protected:
  using json = nlohmann::json;

  void SetUp() override {
    if (!isRoot()) GTEST_SKIP() << "needs root: moatd creates namespaces, cgroups and mounts (CI runs as root)";
    daemon_ = std::make_unique<Moatd>();
  }

  json call(const std::string& method, const std::string& target, const json& body, int expectStatus) {
    auto r = daemon_->request(method, target, body.is_null() ? "" : body.dump());
    EXPECT_EQ(r.status, expectStatus) << method << " " << target << " -> " << r.body;
    if (r.body.empty()) return json();
    auto j = json::parse(r.body, nullptr, false);
    return j;
  }

  std::string createEnv(const json& body = json::object()) {
    json env = call("POST", "/v1/environments", body, 201);
    return env.value("id", "");
  }

  json exec(const std::string& id, const json& body) {
    return call("POST", "/v1/environments/" + id + "/exec", body, 200);
  }

  // Polls (bounded) until a process named `name` runs in the environment.
  bool waitForProcess(const std::string& id, const std::string& name) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      auto ps = daemon_->request("POST", "/v1/environments/" + id + "/exec", json{{"cmd", {"pgrep", name}}}.dump());
      if (json::parse(ps.body)["exit_code"] == 0) return true;
    }
    return false;
  }

  // A counter a program in environment `id` keeps in a file (the pause
  // tests'), read through the files API: -1 when it is not there yet.
  long counter(const std::string& id, const std::string& path = "/workspace/n") {
    auto r = daemon_->request("GET", "/v1/environments/" + id + "/files?path=" + path);
    if (r.status != 200 || r.body.empty()) return -1;
    return std::strtol(r.body.c_str(), nullptr, 10);
  }

  // Waits (bounded: 10 s, or 60 s in a microVM on TCG) until the counter
  // passes `from`.
  bool counts(const std::string& id, long from, const std::string& path = "/workspace/n",
              std::chrono::seconds wait = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      if (counter(id, path) > from) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // Stopped: the counter stays where it is over a span of time (what
  // "stopped" means can only be seen over one).
  void staysStill(const std::string& id, const std::string& path = "/workspace/n") {
    const long at = counter(id, path);
    EXPECT_GT(at, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(counter(id, path), at) << "a paused process ran";
  }

  // The audit log's answer to GET /v1/events`query` ("?type=...&environment=...")
  // once it holds `needle`, or its last answer after 30 s. The log writes in
  // batches and a program's events come after its answer: bounded polling,
  // with a pause between reads (each read flushes the log).
  std::string eventsUntil(const std::string& query, const std::string& needle) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::string body;
    for (;;) {
      body = daemon_->request("GET", "/v1/events" + query).body;
      if (body.find(needle) != std::string::npos || std::chrono::steady_clock::now() > deadline) return body;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  std::unique_ptr<Moatd> daemon_;
};

}  // namespace moat::test
