#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "agent/https_client.h"
#include "agent/wire.h"

// A model provider as an agent run talks to it: one streamed model turn per
// call over the provider's own wire format, retried with backoff where the
// provider says "later" (429, 5xx, 529), with errors that say what to do.
namespace moat::agent {

struct ProviderConfig {
  ProviderKind kind = ProviderKind::kAnthropic;
  std::string model;
  std::string baseUrl;  // "": the provider's own
  std::string apiKey;   // held in memory only: never stored, logged or shown
  uint64_t maxTokens = 4096;
};

struct RetryPolicy {
  int attempts = 5;  // in all, the first included
  std::chrono::milliseconds firstDelay{1000};
  std::chrono::milliseconds maxDelay{30000};
};

// What a run asks for its model's turns: a provider over the network, or a
// recording of another run's turns (agent/replay.h).
class Model {
 public:
  virtual ~Model() = default;
  // One model turn. `onText` hears model text as it streams; `onRetry`
  // why a request is tried again. Cancelling `cancel` ends it at once.
  virtual Result<ModelTurn> complete(const ModelRequest& request, const std::function<void(const std::string&)>& onText,
                                     const std::function<void(const std::string&)>& onRetry, Cancel& cancel) = 0;
  // The provider's kind ("anthropic", "openai", "replay") and model.
  virtual std::string kind() const = 0;
  virtual const std::string& model() const = 0;
  virtual uint64_t maxTokens() const = 0;
};

class Provider final : public Model {
 public:
  Provider(ProviderConfig config, RetryPolicy retry, PostOptions post);
  // The base URL's parse, done once (an error names the field).
  Status check() const;
  Result<ModelTurn> complete(const ModelRequest& request, const std::function<void(const std::string&)>& onText,
                             const std::function<void(const std::string&)>& onRetry, Cancel& cancel) override;
  std::string kind() const override { return providerName(config_.kind); }
  const std::string& model() const override { return config_.model; }
  uint64_t maxTokens() const override { return config_.maxTokens; }
  const ProviderConfig& config() const { return config_; }
  std::string baseUrl() const;

 private:
  ProviderConfig config_;
  RetryPolicy retry_;
  PostOptions post_;
  std::unique_ptr<Wire> wire_;
};

}  // namespace moat::agent
