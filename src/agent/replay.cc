#include "agent/replay.h"

namespace moat::agent {

Result<std::vector<ModelTurn>> ReplayModel::turnsOf(const std::vector<Step>& transcript) {
  std::vector<ModelTurn> turns;
  for (const auto& step : transcript) {
    if (step.kind != "model") continue;
    const json& d = step.data;
    if (d.contains("left_out")) return Error::make(Code::kConflict, "its transcript is incomplete (it outgrew 2 MiB)");
    ModelTurn turn;
    if (d.contains("text") && d["text"].is_string()) turn.text = d["text"];
    if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
      for (const auto& call : d["tool_calls"]) {
        if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) continue;
        turn.calls.push_back({call.contains("id") && call["id"].is_string() ? call["id"].get<std::string>() : "",
                              call["name"], call.contains("arguments") ? call["arguments"] : json::object()});
      }
    }
    if (d.contains("usage")) {
      turn.inputTokens = usageCount(d["usage"], "input_tokens");
      turn.outputTokens = usageCount(d["usage"], "output_tokens");
    }
    turns.push_back(std::move(turn));
  }
  if (turns.empty()) return Error::make(Code::kConflict, "its transcript has no model turn to replay");
  return turns;
}

Result<ModelTurn> ReplayModel::complete(const ModelRequest&, const std::function<void(const std::string&)>& onText,
                                        const std::function<void(const std::string&)>&, Cancel& cancel) {
  if (cancel.cancelled()) return Error::make(Code::kGone, "the replay was stopped");
  if (next_ >= turns_.size()) {
    return Error::make(Code::kNotFound, "the recording has " + std::to_string(turns_.size()) + " turn(s); turn " +
                                            std::to_string(next_ + 1) + " was asked for");
  }
  ModelTurn turn = turns_[next_++];
  if (onText && !turn.text.empty()) onText(turn.text);
  return turn;
}

}  // namespace moat::agent
