#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/conversation.h"
#include "agent/provider.h"

// One agent run (docs/AGENTS.md): the model loop on moatd's side, the
// environment's tools through the gate, every step recorded. A state
// machine on a thread of its own:
//
//   running --model turn with tool calls--> (tools run) --> running
//   running --model turn without tool calls--> completed
//   running --max_iterations turns, the last still asking--> max_iterations
//   running --provider error, timeout--> failed
//   running --token budget spent--> stopped
//   any --stop()--> stopped
//
// (waiting_approval is running while a tool waits for a person: the
// owner of the run, which knows the approvals, says so.)
namespace moat::agent {

enum class RunState { kRunning, kCompleted, kFailed, kMaxIterations, kStopped };
const char* runStateName(RunState state);

struct RunSettings {
  std::string instruction;
  uint32_t maxIterations = 30;  // model turns
  uint64_t tokenBudget = 0;     // input and output tokens in all; 0: no bound
  std::chrono::seconds timeout{3600};
  size_t toolOutputLimit = 16u << 10;  // what of one tool's output the model sees
  std::vector<std::string> secrets;    // values redacted from what goes to the provider
  // Told each turn's tokens; says why the run must end when a budget
  // beyond the run's own is spent (its owner's across runs), else "".
  std::function<std::string(uint64_t tokens)> spend;
};

// The tools a run offers its model, run by whoever drives it (moatd: the
// MCP tools through its own API, with the run owner's rights).
class Toolbox {
 public:
  virtual ~Toolbox() = default;
  virtual std::vector<ToolSpec> tools() = 0;
  virtual ToolResult call(const ToolCall& call) = 0;
  // Ends a call in progress (from another thread).
  virtual void cancel() = 0;
};

struct Step {
  uint64_t seq = 0;
  int64_t atMs = 0;
  std::string kind;  // instruction, model, tool_result, retry, end
  json data;
};

struct RunStatus {
  RunState state = RunState::kRunning;
  uint32_t iterations = 0;
  uint64_t inputTokens = 0;
  uint64_t outputTokens = 0;
  std::string result;  // the model's last text, once completed
  std::string error;   // why it failed or stopped
  int64_t endedAtMs = 0;
  bool inTool = false;  // a tool call is in progress
};

// What a run tells the world as it goes: audit events (kind "agent.*").
using RunRecorder = std::function<void(const std::string& kind, const json& data)>;

class Run {
 public:
  Run(RunSettings settings, std::unique_ptr<Model> model, std::unique_ptr<Toolbox> toolbox, RunRecorder record);
  ~Run();  // stops it
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Starts the loop; `ended` runs on the loop's thread once it has ended.
  void start(std::function<void(const RunStatus&)> ended);
  // Ends the run (state stopped unless it already ended) and waits for it.
  void stop(const std::string& why);
  // The same without waiting (from a thread the run may itself be waiting
  // on, such as one destroying its environment).
  void requestStop(const std::string& why);
  RunStatus status() const;
  std::vector<Step> transcript() const;
  // Waits until there are steps after `after` or the run has ended, at most
  // `wait`; returns those steps (none: it timed out, or nothing is left).
  std::vector<Step> stepsAfter(uint64_t after, std::chrono::milliseconds wait) const;
  // The model text of the turn in progress, as it streams.
  std::string streaming() const;

 private:
  void loop();
  void step(const std::string& kind, json data);
  void end(RunState state, const std::string& why, const std::string& result = "");
  bool stopping() const;

  RunSettings settings_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Toolbox> toolbox_;
  RunRecorder record_;
  std::function<void(const RunStatus&)> ended_;
  Cancel cancel_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;  // a step, or the end
  RunStatus status_;
  std::vector<Step> steps_;
  size_t transcriptBytes_ = 0;
  static constexpr size_t kMaxTranscriptBytes = 2u << 20;
  std::string streaming_;
  std::string stopReason_;
  std::chrono::steady_clock::time_point deadline_;
  std::atomic<bool> timedOut_{false};
  size_t stepsLeftOut_ = 0;
  std::mutex joinMutex_;
  std::thread thread_;
  std::thread watchdog_;  // cancels what runs at timeout_s
  static constexpr size_t kMaxSteps = 10000;
  static constexpr size_t kMaxStreaming = 64u << 10;
  static constexpr size_t kMaxCallsPerTurn = 64;
};

}  // namespace moat::agent
