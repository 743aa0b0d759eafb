#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

// What an agent run and a model say to each other, whatever the provider's
// wire format (agent/openai_wire.h, agent/anthropic_wire.h).
namespace moat::agent {

using json = nlohmann::json;

struct ToolCall {
  std::string id;
  std::string name;
  // The arguments as the model gave them: an object, or (when the model
  // sent text that is not JSON) that text as a string.
  json arguments = json::object();
};

struct ToolResult {
  std::string callId;
  std::string name;
  std::string content;
  bool isError = false;
};

// One entry of the conversation, in order: the instruction, then the
// model's turns and the results of the tools each asked for.
struct Entry {
  enum class Kind { kUser, kAssistant, kToolResults };
  Kind kind = Kind::kUser;
  std::string text;                 // user, assistant
  std::vector<ToolCall> calls;      // assistant
  std::vector<ToolResult> results;  // tool results
};

// A tool the model may call: its name, what it does, its input's JSON schema.
struct ToolSpec {
  std::string name;
  std::string description;
  json inputSchema;
};

struct ModelRequest {
  std::string model;
  uint64_t maxTokens = 4096;
  std::string system;
  std::vector<Entry> conversation;
  std::vector<ToolSpec> tools;
  bool stream = true;
};

// What the model answered: text, tool calls, or both.
struct ModelTurn {
  std::string text;
  std::vector<ToolCall> calls;
  uint64_t inputTokens = 0;
  uint64_t outputTokens = 0;
  std::string stopReason;  // the provider's own word ("end_turn", "tool_calls", ...)
};

}  // namespace moat::agent
