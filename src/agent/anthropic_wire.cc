// Anthropic Messages (POST {base_url}/v1/messages): content as blocks, tool
// calls as tool_use blocks with their input as an object, results as
// tool_result blocks in a user message; streamed as named events
// (message_start, content_block_start/delta/stop, message_delta,
// message_stop).
#include <map>

#include "agent/wire.h"
#include "mcp/protocol.h"

namespace moat::agent {
namespace {

class AnthropicStream final : public StreamDecoder {
 public:
  Status feed(const SseEvent& event, const std::function<void(const std::string&)>& onText) override {
    json e = mcp::parseBounded(event.data);
    if (!e.is_object()) return Error::make(Code::kProtocol, "the provider streamed an event that is not JSON");
    const std::string type = e.value("type", event.event);
    if (type == "error") {
      const json& err = e.contains("error") ? e["error"] : json::object();
      return Error::make(Code::kProtocol, "the provider reported an error mid-stream: " +
                                              (err.is_object() ? err.value("message", err.dump()) : err.dump()));
    }
    if (type == "message_start" && e.contains("message") && e["message"].is_object()) {
      turn_.inputTokens = usageCount(e["message"].value("usage", json::object()), "input_tokens");
      turn_.outputTokens = usageCount(e["message"].value("usage", json::object()), "output_tokens");
    } else if (type == "content_block_start" && e.contains("content_block") && e["content_block"].is_object()) {
      const json& b = e["content_block"];
      Block& block = blocks_[e.value("index", 0)];
      block.type = b.value("type", "");
      block.id = b.value("id", "");
      block.name = b.value("name", "");
      if (block.type == "text" && b.contains("text") && b["text"].is_string()) append(b["text"], onText);
    } else if (type == "content_block_delta" && e.contains("delta") && e["delta"].is_object()) {
      const json& d = e["delta"];
      Block& block = blocks_[e.value("index", 0)];
      if (d.value("type", "") == "text_delta" && d.contains("text") && d["text"].is_string()) {
        append(d["text"], onText);
      } else if (d.value("type", "") == "input_json_delta" && d.contains("partial_json") &&
                 d["partial_json"].is_string()) {
        block.input += d["partial_json"].get<std::string>();
      }
    } else if (type == "message_delta") {
      if (e.contains("delta") && e["delta"].is_object() && e["delta"].contains("stop_reason") &&
          e["delta"]["stop_reason"].is_string()) {
        turn_.stopReason = e["delta"]["stop_reason"];
      }
      if (e.contains("usage")) turn_.outputTokens = usageCount(e["usage"], "output_tokens");
    } else if (type == "message_stop") {
      done_ = true;
    }
    return {};
  }
  bool done() const override { return done_; }
  Result<ModelTurn> finish() override {
    for (auto& [index, b] : blocks_) {
      if (b.type == "tool_use") turn_.calls.push_back({b.id, b.name, parseArguments(b.input)});
    }
    return turn_;
  }

 private:
  struct Block {
    std::string type, id, name, input;
  };
  void append(const std::string& piece, const std::function<void(const std::string&)>& onText) {
    turn_.text += piece;
    if (!piece.empty() && onText) onText(piece);
  }
  ModelTurn turn_;
  std::map<int, Block> blocks_;
  bool done_ = false;
};

class AnthropicWire final : public Wire {
 public:
  std::string path() const override { return "/v1/messages"; }
  std::string defaultBaseUrl() const override { return "https://api.anthropic.com"; }
  std::vector<std::pair<std::string, std::string>> headers(const std::string& apiKey) const override {
    return {{"x-api-key", apiKey}, {"anthropic-version", "2023-06-01"}};
  }

  json request(const ModelRequest& r) const override {
    json messages = json::array();
    for (const auto& e : r.conversation) {
      if (e.kind == Entry::Kind::kUser) {
        messages.push_back({{"role", "user"}, {"content", e.text}});
      } else if (e.kind == Entry::Kind::kAssistant) {
        json content = json::array();
        if (!e.text.empty()) content.push_back({{"type", "text"}, {"text", e.text}});
        for (const auto& c : e.calls) {
          // Input must be an object: text that was not JSON goes back as one.
          json input = c.arguments.is_object() ? c.arguments : json{{"value", c.arguments}};
          content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", input}});
        }
        messages.push_back({{"role", "assistant"}, {"content", content}});
      } else {
        json content = json::array();
        for (const auto& t : e.results) {
          content.push_back(
              {{"type", "tool_result"}, {"tool_use_id", t.callId}, {"content", t.content}, {"is_error", t.isError}});
        }
        messages.push_back({{"role", "user"}, {"content", content}});
      }
    }
    json body = {{"model", r.model}, {"max_tokens", r.maxTokens}, {"messages", messages}};
    if (!r.system.empty()) body["system"] = r.system;
    if (!r.tools.empty()) {
      json tools = json::array();
      for (const auto& t : r.tools) {
        tools.push_back({{"name", t.name}, {"description", t.description}, {"input_schema", t.inputSchema}});
      }
      body["tools"] = tools;
    }
    if (r.stream) body["stream"] = true;
    return body;
  }

  Result<ModelTurn> response(const json& body) const override {
    if (!body.is_object() || !body.contains("content") || !body["content"].is_array()) {
      return Error::make(Code::kProtocol, "the provider's answer has no content array");
    }
    ModelTurn turn;
    for (const auto& b : body["content"]) {
      if (!b.is_object()) continue;
      if (b.value("type", "") == "text" && b.contains("text") && b["text"].is_string()) {
        turn.text += b["text"].get<std::string>();
      } else if (b.value("type", "") == "tool_use") {
        turn.calls.push_back({b.value("id", ""), b.value("name", ""), b.value("input", json::object())});
      }
    }
    if (body.contains("stop_reason") && body["stop_reason"].is_string()) turn.stopReason = body["stop_reason"];
    if (body.contains("usage")) {
      turn.inputTokens = usageCount(body["usage"], "input_tokens");
      turn.outputTokens = usageCount(body["usage"], "output_tokens");
    }
    return turn;
  }

  std::unique_ptr<StreamDecoder> decoder() const override { return std::make_unique<AnthropicStream>(); }

  bool contextTooLong(int status, const std::string& body) const override {
    return status == 400 && errorMessageOf(body).find("prompt is too long") != std::string::npos;
  }
};

}  // namespace

std::unique_ptr<Wire> anthropicWire() { return std::make_unique<AnthropicWire>(); }

}  // namespace moat::agent
