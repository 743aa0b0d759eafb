#include <gtest/gtest.h>

#include "mcp/output.h"
#include "mcp/protocol.h"
#include "mcp/session.h"
#include "mcp/tools.h"

namespace moat::mcp {
namespace {

TEST(McpProtocol, TellsMessagesApart) {
  EXPECT_EQ(kindOf(json::parse(R"({"jsonrpc":"2.0","id":1,"method":"ping"})")), Kind::kRequest);
  EXPECT_EQ(kindOf(json::parse(R"({"jsonrpc":"2.0","id":"a","method":"ping","params":{}})")), Kind::kRequest);
  EXPECT_EQ(kindOf(json::parse(R"({"jsonrpc":"2.0","method":"notifications/initialized"})")), Kind::kNotification);
  EXPECT_EQ(kindOf(json::parse(R"({"jsonrpc":"2.0","id":1,"result":{}})")), Kind::kResponse);
  for (const char* bad : {R"({"id":1,"method":"ping"})", R"({"jsonrpc":"1.0","id":1,"method":"ping"})",
                          R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})",
                          R"({"jsonrpc":"2.0","id":null,"method":"x"})", R"({"jsonrpc":"2.0","id":1,"method":7})",
                          R"({"jsonrpc":"2.0","id":1,"method":"x","params":3})", R"([1,2])", R"("text")"}) {
    EXPECT_EQ(kindOf(json::parse(bad)), Kind::kInvalid) << bad;
  }
}

TEST(McpProtocol, NegotiatesTheClientsVersionWhenKnown) {
  EXPECT_EQ(negotiateVersion("2025-06-18"), "2025-06-18");
  EXPECT_EQ(negotiateVersion("2024-11-05"), "2024-11-05");
  EXPECT_EQ(negotiateVersion("1999-01-01"), kProtocolVersions.front());
  EXPECT_EQ(negotiateVersion(""), kProtocolVersions.front());
}

// Members a client sends with the wrong type are answered, not thrown on
// (the fuzzer found `protocolVersion` as an object ending the process).
TEST(McpSession, WrongTypesInAClientsParamsGetAnAnswer) {
  struct NoBackend : RestBackend {
    RestResponse call(const std::string&, const std::string&, const std::string&) override { return {}; }
  } backend;
  Session session(backend, "test");
  auto notify = [](const json&) {};
  auto init = session.handle(
      json::parse(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":{"v":"1"}}})"), notify);
  ASSERT_TRUE(init.has_value());
  EXPECT_EQ((*init)["result"]["protocolVersion"], kProtocolVersions.front());
  auto read = session.handle(
      json::parse(R"({"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":["moat://x"]}})"), notify);
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(read->contains("error")) << read->dump();
}

TEST(McpOutput, KeepsHeadAndTailOnUtf8Boundaries) {
  EXPECT_EQ(capOutput("short").text, "short");
  std::string big(100, 'a');
  big += std::string(1000, 'b');
  big += std::string(100, 'c');
  Capped c = capOutput(big, 100, 100);
  EXPECT_EQ(c.omitted, 1000u);
  EXPECT_EQ(c.text.substr(0, 100), std::string(100, 'a'));
  EXPECT_EQ(c.text.substr(c.text.size() - 100), std::string(100, 'c'));
  EXPECT_NE(c.text.find("[... 1000 bytes omitted ...]"), std::string::npos);
  std::string utf8;
  for (int i = 0; i < 400; ++i) utf8 += "\xc3\xa9";  // é: a cut must not split it
  Capped u = capOutput(utf8, 101, 101);
  for (size_t i = 0; i + 1 < u.text.size(); ++i) {
    if (static_cast<unsigned char>(u.text[i]) == 0xc3) {
      EXPECT_EQ(static_cast<unsigned char>(u.text[i + 1]), 0xa9);
    }
  }
  EXPECT_NE(static_cast<unsigned char>(u.text[0]), 0xa9);
}

TEST(McpTools, EverySchemaIsAClosedObjectWithDescriptions) {
  json tools = Tools::list();
  ASSERT_GE(tools.size(), 14u);
  for (const auto& t : tools) {
    SCOPED_TRACE(t["name"].get<std::string>());
    EXPECT_GT(t["description"].get<std::string>().size(), 40u);
    EXPECT_EQ(t["inputSchema"]["type"], "object");
    EXPECT_EQ(t["inputSchema"]["additionalProperties"], false);
    for (const auto& r : t["inputSchema"].value("required", json::array())) {
      EXPECT_TRUE(t["inputSchema"]["properties"].contains(r.get<std::string>()));
    }
    EXPECT_TRUE(Tools::exists(t["name"]));
  }
  EXPECT_FALSE(Tools::exists("rm_rf_host"));
}

TEST(McpTools, ArgumentsAreCheckedAgainstTheSchema) {
  json schema;
  for (const auto& t : Tools::list()) {
    if (t["name"] == "run_command") schema = t["inputSchema"];
  }
  EXPECT_EQ(checkArguments(json::parse(R"({"command": "ls"})"), schema), "");
  EXPECT_EQ(checkArguments(json::parse(R"({"argv": ["ls", "-l"], "timeout_s": 5})"), schema), "");
  EXPECT_NE(checkArguments(json::parse(R"({"command": 3})"), schema).find("command: must be string"),
            std::string::npos);
  EXPECT_NE(checkArguments(json::parse(R"({"argv": []})"), schema).find("argv"), std::string::npos);
  EXPECT_NE(checkArguments(json::parse(R"({"argv": ["ls", 1]})"), schema).find("argv[1]"), std::string::npos);
  EXPECT_NE(checkArguments(json::parse(R"({"command": "x", "timeout_s": 0})"), schema).find("timeout_s"),
            std::string::npos);
  EXPECT_NE(checkArguments(json::parse(R"({"command": "x", "sudo": true})"), schema).find("sudo: unknown argument"),
            std::string::npos);
  for (const auto& t : Tools::list()) {
    if (t["name"] == "set_network_policy") schema = t["inputSchema"];
  }
  EXPECT_EQ(checkArguments(json::parse(R"({"network": "open"})"), schema), "");
  EXPECT_EQ(checkArguments(json::parse(R"({"network": {"allow": ["pypi.org"]}})"), schema), "");
  EXPECT_NE(checkArguments(json::parse(R"({"network": "sometimes"})"), schema), "");
  EXPECT_NE(checkArguments(json::parse(R"({})"), schema).find("network: required"), std::string::npos);
}

}  // namespace
}  // namespace moat::mcp
