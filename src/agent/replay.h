#pragma once

#include <string>
#include <vector>

#include "agent/provider.h"
#include "agent/run.h"

// Replaying a run: its recorded model turns answered again, in order, to a
// new run in a new environment, whose tools run for real. For debugging
// (the same decisions against a changed environment or permissions) and
// for tests (a model that says exactly this).
namespace moat::agent {

class ReplayModel final : public Model {
 public:
  ReplayModel(std::vector<ModelTurn> turns, std::string model) : turns_(std::move(turns)), model_(std::move(model)) {}
  // The model turns of a transcript; an error when a turn's text or tool
  // calls were left out of it (a full transcript).
  static Result<std::vector<ModelTurn>> turnsOf(const std::vector<Step>& transcript);

  Result<ModelTurn> complete(const ModelRequest& request, const std::function<void(const std::string&)>& onText,
                             const std::function<void(const std::string&)>& onRetry, Cancel& cancel) override;
  std::string kind() const override { return "replay"; }
  const std::string& model() const override { return model_; }
  uint64_t maxTokens() const override { return 0; }

 private:
  std::vector<ModelTurn> turns_;
  std::string model_;
  size_t next_ = 0;
};

}  // namespace moat::agent
