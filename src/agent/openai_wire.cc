// OpenAI Chat Completions (POST {base_url}/chat/completions), the format
// OpenAI, Ollama, vLLM and llama.cpp's server share: tools as functions,
// tool calls with their arguments as a JSON string, results as "tool"
// messages; streamed as `data:` chunks ending with `data: [DONE]`.
#include <map>

#include "agent/wire.h"
#include "mcp/protocol.h"

namespace moat::agent {
namespace {

json toolCallsJson(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const auto& c : calls) {
    std::string arguments = c.arguments.is_string() ? c.arguments.get<std::string>() : c.arguments.dump();
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", arguments}}}});
  }
  return out;
}

class OpenAiStream final : public StreamDecoder {
 public:
  Status feed(const SseEvent& event, const std::function<void(const std::string&)>& onText) override {
    if (event.data == "[DONE]") {
      done_ = true;
      return {};
    }
    json chunk = mcp::parseBounded(event.data);
    if (!chunk.is_object()) return Error::make(Code::kProtocol, "the provider streamed a chunk that is not JSON");
    if (chunk.contains("error")) {
      return Error::make(Code::kProtocol, "the provider reported an error mid-stream: " +
                                              chunk["error"].value("message", chunk["error"].dump()));
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      turn_.inputTokens = usageCount(chunk["usage"], "prompt_tokens");
      turn_.outputTokens = usageCount(chunk["usage"], "completion_tokens");
    }
    if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return {};
    const json& choice = chunk["choices"][0];
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      turn_.stopReason = choice["finish_reason"];
    }
    if (!choice.contains("delta") || !choice["delta"].is_object()) return {};
    const json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      std::string piece = delta["content"];
      turn_.text += piece;
      if (!piece.empty() && onText) onText(piece);
    }
    if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
      for (const auto& part : delta["tool_calls"]) {
        int index = part.contains("index") && part["index"].is_number_integer() ? part["index"].get<int>() : 0;
        Partial& p = calls_[index];
        if (part.contains("id") && part["id"].is_string()) p.id = part["id"];
        if (part.contains("function") && part["function"].is_object()) {
          const json& f = part["function"];
          if (f.contains("name") && f["name"].is_string()) p.name += f["name"].get<std::string>();
          if (f.contains("arguments") && f["arguments"].is_string()) p.arguments += f["arguments"].get<std::string>();
        }
      }
    }
    return {};
  }
  bool done() const override { return done_; }
  Result<ModelTurn> finish() override {
    for (auto& [index, p] : calls_) turn_.calls.push_back({p.id, p.name, parseArguments(p.arguments)});
    return turn_;
  }

 private:
  struct Partial {
    std::string id, name, arguments;
  };
  ModelTurn turn_;
  std::map<int, Partial> calls_;  // by index: a call's pieces arrive in order
  bool done_ = false;
};

class OpenAiWire final : public Wire {
 public:
  std::string path() const override { return "/chat/completions"; }
  std::string defaultBaseUrl() const override { return "https://api.openai.com/v1"; }
  std::vector<std::pair<std::string, std::string>> headers(const std::string& apiKey) const override {
    if (apiKey.empty()) return {};  // a local server (Ollama) may want none
    return {{"Authorization", "Bearer " + apiKey}};
  }

  json request(const ModelRequest& r) const override {
    json messages = json::array();
    if (!r.system.empty()) messages.push_back({{"role", "system"}, {"content", r.system}});
    for (const auto& e : r.conversation) {
      if (e.kind == Entry::Kind::kUser) {
        messages.push_back({{"role", "user"}, {"content", e.text}});
      } else if (e.kind == Entry::Kind::kAssistant) {
        json m = {{"role", "assistant"}, {"content", e.text.empty() ? json(nullptr) : json(e.text)}};
        if (!e.calls.empty()) m["tool_calls"] = toolCallsJson(e.calls);
        messages.push_back(std::move(m));
      } else {
        // No error flag in this format: the content says it.
        for (const auto& t : e.results) {
          messages.push_back({{"role", "tool"},
                              {"tool_call_id", t.callId},
                              {"content", t.isError ? "error: " + t.content : t.content}});
        }
      }
    }
    json body = {{"model", r.model}, {"messages", messages}, {"max_tokens", r.maxTokens}};
    if (!r.tools.empty()) {
      json tools = json::array();
      for (const auto& t : r.tools) {
        tools.push_back(
            {{"type", "function"},
             {"function", {{"name", t.name}, {"description", t.description}, {"parameters", t.inputSchema}}}});
      }
      body["tools"] = tools;
    }
    if (r.stream) {
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
    }
    return body;
  }

  Result<ModelTurn> response(const json& body) const override {
    if (!body.is_object() || !body.contains("choices") || !body["choices"].is_array() || body["choices"].empty() ||
        !body["choices"][0].contains("message")) {
      return Error::make(Code::kProtocol, "the provider's answer has no choices[0].message");
    }
    const json& choice = body["choices"][0];
    const json& message = choice["message"];
    ModelTurn turn;
    if (message.contains("content") && message["content"].is_string()) turn.text = message["content"];
    if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
      for (const auto& c : message["tool_calls"]) {
        if (!c.contains("function") || !c["function"].is_object()) continue;
        const json& f = c["function"];
        turn.calls.push_back(
            {c.value("id", ""), f.value("name", ""),
             parseArguments(f.contains("arguments") && f["arguments"].is_string() ? f["arguments"].get<std::string>()
                                                                                  : std::string())});
      }
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
      turn.stopReason = choice["finish_reason"];
    if (body.contains("usage")) {
      turn.inputTokens = usageCount(body["usage"], "prompt_tokens");
      turn.outputTokens = usageCount(body["usage"], "completion_tokens");
    }
    return turn;
  }

  std::unique_ptr<StreamDecoder> decoder() const override { return std::make_unique<OpenAiStream>(); }

  bool contextTooLong(int status, const std::string& body) const override {
    json j = mcp::parseBounded(body);
    return status == 400 && j.is_object() && j.contains("error") && j["error"].is_object() &&
           j["error"].value("code", json(nullptr)) == "context_length_exceeded";
  }
};

}  // namespace

std::unique_ptr<Wire> openAiWire() { return std::make_unique<OpenAiWire>(); }

}  // namespace moat::agent
