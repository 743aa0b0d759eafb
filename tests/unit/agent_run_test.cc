// The run's state machine without a network or root: a recorded model
// (ReplayModel) and a toolbox that records what it is asked.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "agent/replay.h"
#include "agent/run.h"

namespace moat::agent {
namespace {

class RecordingToolbox final : public Toolbox {
 public:
  std::vector<ToolSpec> tools() override { return {{"run_command", "runs", {{"type", "object"}}}}; }
  ToolResult call(const ToolCall& c) override {
    std::unique_lock<std::mutex> lock(mutex_);
    calls.push_back(c);
    if (block) cv_.wait(lock, [&] { return cancelled; });
    return {c.id, c.name, output, false};
  }
  void cancel() override {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled = true;
    cv_.notify_all();
  }
  std::vector<ToolCall> calls;
  std::string output = "ok";
  bool block = false;
  bool cancelled = false;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
};

ModelTurn callTurn(int calls = 1) {
  ModelTurn t;
  for (int i = 0; i < calls; ++i) t.calls.push_back({"c" + std::to_string(i), "run_command", {{"command", "true"}}});
  t.inputTokens = 10;
  t.outputTokens = 5;
  return t;
}

ModelTurn textTurn(const std::string& text) {
  ModelTurn t;
  t.text = text;
  t.inputTokens = 10;
  t.outputTokens = 5;
  return t;
}

struct Harness {
  RecordingToolbox* tools = nullptr;
  std::vector<std::string> events;
  std::unique_ptr<Run> run;
  std::mutex mutex;
  std::condition_variable cv;
  bool ended = false;

  void start(std::vector<ModelTurn> turns, RunSettings settings = {}, std::function<void(RecordingToolbox&)> set = {}) {
    auto box = std::make_unique<RecordingToolbox>();
    tools = box.get();
    if (set) set(*box);
    if (settings.instruction.empty()) settings.instruction = "do it";
    run = std::make_unique<Run>(std::move(settings), std::make_unique<ReplayModel>(std::move(turns), "recorded"),
                                std::move(box), [this](const std::string& kind, const json&) {
                                  std::lock_guard<std::mutex> lock(mutex);
                                  events.push_back(kind);
                                });
    run->start([this](const RunStatus&) {
      std::lock_guard<std::mutex> lock(mutex);
      ended = true;
      cv.notify_all();
    });
  }
  RunStatus waitEnd() {
    std::unique_lock<std::mutex> lock(mutex);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return ended; }));
    return run->status();
  }
};

TEST(AgentRun, ToolCallsThenTextCompleteWithEveryStepRecorded) {
  Harness h;
  h.start({callTurn(), textTurn("all done")});
  RunStatus s = h.waitEnd();
  EXPECT_EQ(s.state, RunState::kCompleted);
  EXPECT_EQ(s.result, "all done");
  EXPECT_EQ(s.iterations, 2u);
  EXPECT_EQ(s.inputTokens, 20u);
  EXPECT_EQ(h.tools->calls.size(), 1u);
  std::vector<std::string> kinds;
  for (const auto& step : h.run->transcript()) kinds.push_back(step.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"instruction", "model", "tool_result", "model", "end"}));
  EXPECT_EQ(h.events,
            (std::vector<std::string>{"agent.started", "agent.turn", "agent.tool", "agent.turn", "agent.ended"}));
}

TEST(AgentRun, MaxIterationsEndsAModelThatNeverStopsWithoutRunningTheLastCalls) {
  Harness h;
  RunSettings settings;
  settings.maxIterations = 3;
  h.start({callTurn(), callTurn(), callTurn(), callTurn()}, settings);
  RunStatus s = h.waitEnd();
  EXPECT_EQ(s.state, RunState::kMaxIterations);
  EXPECT_EQ(s.iterations, 3u);
  EXPECT_EQ(h.tools->calls.size(), 2u) << "the third turn's calls are not run";
}

TEST(AgentRun, ASpentTokenBudgetStopsTheRunBeforeItsTools) {
  Harness h;
  RunSettings settings;
  settings.tokenBudget = 25;
  h.start({callTurn(), callTurn(), textTurn("never")}, settings);
  RunStatus s = h.waitEnd();
  EXPECT_EQ(s.state, RunState::kStopped);
  EXPECT_NE(s.error.find("token budget of 25 is spent (30 used)"), std::string::npos) << s.error;
  EXPECT_EQ(h.tools->calls.size(), 1u);
}

TEST(AgentRun, ABudgetBeyondTheRunsOwnEndsItWhenSpent) {
  Harness h;
  RunSettings settings;
  uint64_t spent = 0;
  settings.spend = [&spent](uint64_t tokens) {
    spent += tokens;
    return spent >= 30 ? std::string("the owner's budget is spent") : std::string();
  };
  h.start({callTurn(), callTurn(), callTurn(), textTurn("never")}, settings);
  RunStatus s = h.waitEnd();
  EXPECT_EQ(s.state, RunState::kStopped);
  EXPECT_EQ(s.error, "the owner's budget is spent");
  EXPECT_EQ(h.tools->calls.size(), 1u);
}

TEST(AgentRun, ARequestToStopDoesNotWaitAndTheRunEndsOnItsOwn) {
  Harness h;
  h.start({callTurn(), textTurn("never")}, {}, [](RecordingToolbox& t) { t.block = true; });
  while (!h.run->status().inTool && h.run->status().state == RunState::kRunning) std::this_thread::yield();
  h.run->requestStop("its environment ended (destroyed)");
  RunStatus s = h.waitEnd();
  EXPECT_EQ(s.state, RunState::kStopped);
  EXPECT_EQ(s.error, "its environment ended (destroyed)");
}

TEST(AgentRun, AStopDuringAToolEndsTheRunAsStopped) {
  Harness h;
  h.start({callTurn(), textTurn("never")}, {}, [](RecordingToolbox& t) { t.block = true; });
  while (h.run->status().inTool == false && h.run->status().state == RunState::kRunning) std::this_thread::yield();
  h.run->stop("stopped by the test");
  RunStatus s = h.run->status();
  EXPECT_EQ(s.state, RunState::kStopped);
  EXPECT_EQ(s.error, "stopped by the test");
  h.run->stop("again");  // a second stop is harmless
}

TEST(AgentRun, ARecordingThatRunsOutFailsTheRunSayingSo) {
  Harness h;
  h.start({callTurn()});
  RunStatus s = h.waitEnd();
  EXPECT_EQ(s.state, RunState::kFailed);
  EXPECT_NE(s.error.find("the recording has 1 turn(s); turn 2 was asked for"), std::string::npos) << s.error;
}

TEST(AgentRun, HostileToolOutputAndTooManyCallsNeitherCrashNorRunUnbounded) {
  Harness h;
  h.start({callTurn(100), textTurn("done")}, {}, [](RecordingToolbox& t) { t.output = "bad \xff\xfe bytes"; });
  RunStatus s = h.waitEnd();
  EXPECT_EQ(s.state, RunState::kCompleted);
  EXPECT_EQ(h.tools->calls.size(), 64u) << "at most 64 tool calls of one turn run";
  size_t notRun = 0;
  for (const auto& step : h.run->transcript()) notRun += step.kind == "tool_result" && step.data["is_error"] == true;
  EXPECT_EQ(notRun, 0u) << "refused calls are answered to the model, not recorded as tool results";
}

TEST(AgentRun, ATimeoutHoldsWithinATool) {
  Harness h;
  RunSettings settings;
  settings.timeout = std::chrono::seconds(1);
  h.start({callTurn(), textTurn("never")}, settings, [](RecordingToolbox& t) { t.block = true; });
  RunStatus s = h.waitEnd();
  EXPECT_EQ(s.state, RunState::kFailed);
  EXPECT_EQ(s.error, "ran out of time: 1 s");
}

TEST(AgentReplay, TurnsComeFromATranscriptsModelSteps) {
  std::vector<Step> transcript = {
      {1, 0, "instruction", {{"text", "x"}}},
      {2,
       0,
       "model",
       {{"text", ""},
        {"tool_calls", {{{"id", "a"}, {"name", "run_command"}, {"arguments", {{"command", "ls"}}}}}},
        {"usage", {{"input_tokens", 3}, {"output_tokens", 4}}}}},
      {3, 0, "tool_result", {{"content", "out"}}},
      {4, 0, "model", {{"text", "fine"}, {"tool_calls", json::array()}}},
  };
  auto turns = ReplayModel::turnsOf(transcript);
  ASSERT_TRUE(turns.ok());
  ASSERT_EQ(turns->size(), 2u);
  EXPECT_EQ((*turns)[0].calls[0].arguments["command"], "ls");
  EXPECT_EQ((*turns)[0].inputTokens, 3u);
  EXPECT_EQ((*turns)[1].text, "fine");
  transcript[1].data = {{"left_out", "the transcript is full"}};
  transcript[3].data = {{"left_out", "the transcript is full"}};
  EXPECT_FALSE(ReplayModel::turnsOf(transcript).ok()) << "a transcript without its turns cannot be replayed";
}

}  // namespace
}  // namespace moat::agent
