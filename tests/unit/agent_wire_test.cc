// The providers' wire formats against their documented shapes: requests
// written, plain answers and streams read (tool calls split across chunks).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include "agent/https_client.h"
#include "agent/redact.h"
#include "agent/wire.h"

namespace moat::agent {
namespace {

ModelRequest twoStepRequest() {
  ModelRequest r;
  r.model = "m";
  r.system = "be brief";
  r.tools = {{"write_file", "writes", {{"type", "object"}}}};
  r.conversation.push_back({Entry::Kind::kUser, "do it", {}, {}});
  r.conversation.push_back({Entry::Kind::kAssistant, "", {{"c1", "write_file", {{"path", "/workspace/a"}}}}, {}});
  r.conversation.push_back({Entry::Kind::kToolResults, "", {}, {{"c1", "write_file", "denied by policy", true}}});
  return r;
}

Status feedAll(StreamDecoder& d, const std::vector<SseEvent>& events, std::string& text) {
  for (const auto& e : events) MOAT_TRY(d.feed(e, [&](const std::string& piece) { text += piece; }));
  return {};
}

TEST(OpenAiWire, WritesToolCallsAsFunctionsAndResultsAsToolMessages) {
  json body = openAiWire()->request(twoStepRequest());
  ASSERT_EQ(body["messages"].size(), 4u);
  EXPECT_EQ(body["messages"][0]["role"], "system");
  EXPECT_EQ(body["messages"][2]["tool_calls"][0]["function"]["arguments"], R"({"path":"/workspace/a"})");
  EXPECT_TRUE(body["messages"][2]["content"].is_null());
  EXPECT_EQ(body["messages"][3]["role"], "tool");
  EXPECT_EQ(body["messages"][3]["tool_call_id"], "c1");
  EXPECT_EQ(body["messages"][3]["content"], "error: denied by policy");
  EXPECT_EQ(body["tools"][0]["function"]["name"], "write_file");
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(openAiWire()->headers("sk-1")[0].second, "Bearer sk-1");
}

TEST(OpenAiWire, AStreamedToolCallIsPutTogetherFromItsPieces) {
  auto d = openAiWire()->decoder();
  std::string text;
  std::vector<SseEvent> events = {
      {"", "", R"({"choices":[{"index":0,"delta":{"role":"assistant","content":"Wri"},"finish_reason":null}]})"},
      {"", "", R"({"choices":[{"index":0,"delta":{"content":"ting"},"finish_reason":null}]})"},
      {"", "",
       R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"write_file","arguments":"{\"pa"}}]}}]})"},
      {"", "",
       R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\": \"/x\"}"}}]}}]})"},
      {"", "", R"({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})"},
      {"", "", R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":4,"total_tokens":16}})"},
      {"", "", "[DONE]"},
  };
  ASSERT_TRUE(feedAll(*d, events, text).ok());
  EXPECT_TRUE(d->done());
  auto turn = d->finish();
  ASSERT_TRUE(turn.ok());
  EXPECT_EQ(text, "Writing");
  EXPECT_EQ(turn->text, "Writing");
  ASSERT_EQ(turn->calls.size(), 1u);
  EXPECT_EQ(turn->calls[0].id, "call_1");
  EXPECT_EQ(turn->calls[0].arguments["path"], "/x");
  EXPECT_EQ(turn->inputTokens, 12u);
  EXPECT_EQ(turn->outputTokens, 4u);
  EXPECT_EQ(turn->stopReason, "tool_calls");
}

TEST(OpenAiWire, ContextLengthAndErrorsAreRecognised) {
  auto w = openAiWire();
  const std::string body =
      R"({"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}})";
  EXPECT_TRUE(w->contextTooLong(400, body));
  EXPECT_FALSE(w->contextTooLong(400, R"({"error":{"message":"bad"}})"));
  EXPECT_EQ(errorMessageOf(body), "too long");
  auto d = w->decoder();
  std::string text;
  EXPECT_FALSE(feedAll(*d, {{"", "", "not json"}}, text).ok());
}

TEST(AnthropicWire, WritesToolUseAndToolResultBlocks) {
  json body = anthropicWire()->request(twoStepRequest());
  EXPECT_EQ(body["system"], "be brief");
  ASSERT_EQ(body["messages"].size(), 3u);
  EXPECT_EQ(body["messages"][1]["content"][0]["type"], "tool_use");
  EXPECT_EQ(body["messages"][1]["content"][0]["input"]["path"], "/workspace/a");
  EXPECT_EQ(body["messages"][2]["role"], "user");
  EXPECT_EQ(body["messages"][2]["content"][0]["type"], "tool_result");
  EXPECT_EQ(body["messages"][2]["content"][0]["tool_use_id"], "c1");
  EXPECT_EQ(body["messages"][2]["content"][0]["is_error"], true);
  EXPECT_EQ(body["tools"][0]["input_schema"]["type"], "object");
  auto headers = anthropicWire()->headers("key");
  EXPECT_EQ(headers[0], (std::pair<std::string, std::string>{"x-api-key", "key"}));
}

TEST(AnthropicWire, AStreamedAnswerWithTextAndAToolUseIsReadWhole) {
  auto d = anthropicWire()->decoder();
  std::string text;
  std::vector<SseEvent> events = {
      {"", "message_start",
       R"({"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"usage":{"input_tokens":25,"output_tokens":1}}})"},
      {"", "content_block_start",
       R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"},
      {"", "ping", R"({"type":"ping"})"},
      {"", "content_block_delta",
       R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Sure"}})"},
      {"", "content_block_stop", R"({"type":"content_block_stop","index":0})"},
      {"", "content_block_start",
       R"({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"run_command","input":{}}})"},
      {"", "content_block_delta",
       R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"comm"}})"},
      {"", "content_block_delta",
       R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"and\": \"ls\"}"}})"},
      {"", "content_block_stop", R"({"type":"content_block_stop","index":1})"},
      {"", "message_delta",
       R"({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":15}})"},
      {"", "message_stop", R"({"type":"message_stop"})"},
  };
  ASSERT_TRUE(feedAll(*d, events, text).ok());
  EXPECT_TRUE(d->done());
  auto turn = d->finish();
  ASSERT_TRUE(turn.ok());
  EXPECT_EQ(turn->text, "Sure");
  ASSERT_EQ(turn->calls.size(), 1u);
  EXPECT_EQ(turn->calls[0].name, "run_command");
  EXPECT_EQ(turn->calls[0].arguments["command"], "ls");
  EXPECT_EQ(turn->inputTokens, 25u);
  EXPECT_EQ(turn->outputTokens, 15u);
  EXPECT_EQ(turn->stopReason, "tool_use");
}

TEST(AnthropicWire, AnErrorEventMidStreamIsAnError) {
  auto d = anthropicWire()->decoder();
  std::string text;
  Status s = feedAll(
      *d, {{"", "error", R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})"}}, text);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("Overloaded"), std::string::npos);
  EXPECT_TRUE(anthropicWire()->contextTooLong(
      400,
      R"({"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens"}})"));
}

TEST(Wire, ArgumentsThatAreNotJsonStayText) {
  EXPECT_EQ(parseArguments(R"({"a":1})")["a"], 1);
  EXPECT_TRUE(parseArguments(std::string(100000, '[') + std::string(100000, ']')).is_string())
      << "JSON nested too deep is not taken as JSON";
  EXPECT_EQ(parseArguments("{broken"), "{broken");
  EXPECT_TRUE(parseArguments("").is_object());
}

TEST(Redact, SecretsAndCredentialShapesAreReplacedAndCounted) {
  Redacted r =
      redact("token=hunter2-value and sk-abcdefghijklmnopqrstuvwxyz012345 and AKIAABCDEFGHIJKLMNOP", {"hunter2-value"});
  EXPECT_EQ(r.replaced, 3u);
  EXPECT_EQ(r.text.find("hunter2"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("sk-abc"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("AKIA"), std::string::npos) << r.text;
  Redacted pem = redact("x\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\ny", {});
  EXPECT_EQ(pem.text, "x\n[redacted: a credential]\ny");
  Redacted plain = redact("nothing secret here", {"abc"});  // a secret shorter than 4 bytes is left
  EXPECT_EQ(plain.replaced, 0u);
}

TEST(Redact, LongTokensAndACutKeyNeitherCrashNorLeak) {
  std::string huge = "x sk-" + std::string(200000, 'a') + " y";
  Redacted r = redact(huge, {});
  EXPECT_EQ(r.text, "x [redacted: a credential] y");
  Redacted cut = redact("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXkt", {});
  EXPECT_EQ(cut.text, "[redacted: a credential]");
  Redacted certificate = redact("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", {});
  EXPECT_EQ(certificate.replaced, 0u) << "a certificate is public";
  EXPECT_EQ(redact("task-123 and sk-short", {}).replaced, 0u) << "words that only start alike stay";
}

TEST(ProviderUrl, LocalAddressesAreMoatdsOwnHostAndNetworks) {
  auto v4 = [](const char* text) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, text, &a.sin_addr);
    return localAddress(reinterpret_cast<sockaddr*>(&a));
  };
  auto v6 = [](const char* text) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    ::inet_pton(AF_INET6, text, &a.sin6_addr);
    return localAddress(reinterpret_cast<sockaddr*>(&a));
  };
  for (const char* local : {"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
                            "0.0.0.0", "198.18.0.1", "224.0.0.1", "255.255.255.255"}) {
    EXPECT_TRUE(v4(local)) << local;
  }
  for (const char* local :
       {"::1", "::", "fd00::1", "fe80::1", "::ffff:127.0.0.1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "ff02::1"}) {
    EXPECT_TRUE(v6(local)) << local;
  }
  EXPECT_FALSE(v4("8.8.8.8"));
  EXPECT_FALSE(v4("203.0.113.7"));
  EXPECT_FALSE(v6("2606:4700::1111"));
  EXPECT_FALSE(parseUrl("http://h/v1\r\nX-Injected: 1").ok());
}

TEST(ProviderUrl, BaseUrlsParseAsTheProvidersSdksTakeThem) {
  auto ollama = parseUrl("http://127.0.0.1:11434/v1/");
  ASSERT_TRUE(ollama.ok());
  EXPECT_FALSE(ollama->tls);
  EXPECT_EQ(ollama->host, "127.0.0.1");
  EXPECT_EQ(ollama->port, 11434);
  EXPECT_EQ(ollama->path, "/v1");
  auto anthropic = parseUrl("https://api.anthropic.com");
  ASSERT_TRUE(anthropic.ok());
  EXPECT_TRUE(anthropic->tls);
  EXPECT_EQ(anthropic->port, 443);
  EXPECT_EQ(anthropic->path, "");
  auto v6 = parseUrl("http://[::1]:8000/v1");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  for (const std::string bad : {"ftp://x", "http://", "http://u:p@host/", "http://h/?q=1", "http://h:0/",
                                "http://h:99999", "http://[::1/", "https://h:12ab"}) {
    EXPECT_FALSE(parseUrl(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace moat::agent
