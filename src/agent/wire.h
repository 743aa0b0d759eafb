#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent/conversation.h"
#include "common/result.h"
#include "common/sse.h"

// One provider's wire format: how a request is written and its answer read,
// plain or streamed (server-sent events). Pure: unit-tested against the
// providers' documented examples without a network.
namespace moat::agent {

enum class ProviderKind { kAnthropic, kOpenAi };

// Reads a streamed answer event by event; model text goes to `onText` as
// it arrives.
class StreamDecoder {
 public:
  virtual ~StreamDecoder() = default;
  virtual Status feed(const SseEvent& event, const std::function<void(const std::string&)>& onText) = 0;
  // The stream said it is complete.
  virtual bool done() const = 0;
  virtual Result<ModelTurn> finish() = 0;
};

class Wire {
 public:
  virtual ~Wire() = default;
  // Appended to the provider's base URL ("/chat/completions", "/v1/messages").
  virtual std::string path() const = 0;
  virtual std::string defaultBaseUrl() const = 0;
  virtual std::vector<std::pair<std::string, std::string>> headers(const std::string& apiKey) const = 0;
  virtual json request(const ModelRequest& request) const = 0;
  virtual Result<ModelTurn> response(const json& body) const = 0;
  virtual std::unique_ptr<StreamDecoder> decoder() const = 0;
  // The answer says the conversation no longer fits the model's context.
  virtual bool contextTooLong(int status, const std::string& body) const = 0;
};

std::unique_ptr<Wire> wireFor(ProviderKind kind);
// The formats: OpenAI Chat Completions (also what Ollama, vLLM and
// llama.cpp serve) and Anthropic Messages.
std::unique_ptr<Wire> openAiWire();
std::unique_ptr<Wire> anthropicWire();
const char* providerName(ProviderKind kind);

// A tool call's arguments as the model sent them: parsed when they are JSON.
json parseArguments(const std::string& text);
// The provider's own explanation in an error answer's body (both formats
// say {"error": {"message": ...}}); "" if none.
std::string errorMessageOf(const std::string& body);
// A token count of a usage object; 0 when it is not there.
uint64_t usageCount(const json& usage, const char* key);

}  // namespace moat::agent
