// The MCP layer (src/mcp): messages from an MCP client (the agent's host,
// the model's choices), tool arguments checked against each tool's schema,
// and what commands inside an environment print, capped for the model.
//
// Input: a JSON-RPC message on the first line; the rest is what the
// environment "produced": file contents and command output, handed back by
// a stand-in for moatd's REST API. The message goes to a real Session
// (mcp/session.h) over that stand-in, as both transports hand it over; its
// answer must serialize as the transports do. Separately: kindOf, and
// checkArguments against every tool's input schema with the message's
// arguments; capOutput with sizes from the input keeps valid UTF-8 valid and
// accounts for every byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/encoding.h"
#include "mcp/output.h"
#include "mcp/protocol.h"
#include "mcp/session.h"
#include "mcp/tools.h"

using namespace moat::mcp;
using moat::base64Encode;
using moat::isValidUtf8;

namespace {

[[noreturn]] void fail(const std::string& what) {
  __builtin_printf("mcp: %s\n", what.c_str());
  std::abort();
}

// moatd as the tools see it: every call succeeds with the shape moatd
// answers with; contents and output are the input's bytes. Bounded in
// calls, so that no tool waits for output that never comes.
class StandIn : public RestBackend {
 public:
  explicit StandIn(std::string produced) : produced_(std::move(produced)) {}
  RestResponse call(const std::string& method, const std::string& target, const std::string& body) override {
    (void)body;
    if (++calls_ > 32) return {0, "the stand-in answers at most 32 calls", ""};
    auto has = [&](const char* s) { return target.find(s) != std::string::npos; };
    std::string path = target.substr(0, target.find('?'));
    if (path == "/v1/environments") {
      if (method == "POST") return {201, R"({"id":"0123456789ab","state":"running","spec":{}})", "application/json"};
      return {200, R"({"environments":[{"id":"0123456789ab","state":"running","spec":{"cpus":1}}]})",
              "application/json"};
    }
    if (has("/output")) {
      json out = {{"type", "output"}, {"stream", "stdout"}, {"offset", 0}};
      if (isValidUtf8(produced_)) {
        out["data"] = produced_;
      } else {
        out["data"] = base64Encode(produced_);
        out["encoding"] = "base64";
      }
      return {200, out.dump() + "\n" + R"({"type":"exit","exit_code":3,"signal":0,"timed_out":false})" + "\n",
              "application/x-ndjson"};
    }
    if (has("/processes/") && (has("/stdin") || has("/signal"))) return {204, "", ""};
    if (has("/processes")) return {201, R"({"id":7})", "application/json"};
    if (has("/files/list")) {
      return {200,
              json{{"entries", {{{"name", produced_.substr(0, 64)}, {"type", "file"}, {"size", 3}}}}}.dump(
                  -1, ' ', false, json::error_handler_t::replace),
              "application/json"};
    }
    if (has("/files")) {
      if (method == "GET") return {200, produced_, "application/octet-stream"};
      return {200, R"({"ok":true})", "application/json"};
    }
    if (has("/exec")) {
      json r = {{"exit_code", produced_.empty() ? 1 : 0}, {"stderr", ""}};
      r["stdout"] = isValidUtf8(produced_) ? produced_ : base64Encode(produced_);
      return {200, r.dump(), "application/json"};
    }
    if (has("/network")) return {200, R"({"network":"open"})", "application/json"};
    if (has("/v1/events")) return {200, "data: {\"type\":\"x\"}\n\ndata: " + produced_ + "\n", "text/event-stream"};
    if (method == "DELETE") return {204, "", ""};
    if (method == "GET") return {200, R"({"id":"0123456789ab","state":"running"})", "application/json"};
    return {404, R"({"error":{"code":"not_found","message":"no such endpoint"}})", "application/json"};
  }

 private:
  std::string produced_;
  int calls_ = 0;
};

std::string serialized(const json& message) {
  // As the transports write it (src/cli/mcp.cc, src/api/mcp.cc).
  return message.dump(-1, ' ', false, json::error_handler_t::replace);
}

void capped(const std::string& text, size_t head, size_t tail) {
  Capped c = capOutput(text, head, tail);
  if (text.size() <= head + tail) {
    if (c.text != text || c.omitted != 0) fail("capOutput changed a short text");
    return;
  }
  if (c.omitted == 0 && c.text == text) return;
  if (c.omitted > text.size()) fail("capOutput omitted more than there is");
  if (isValidUtf8(text) && !isValidUtf8(c.text)) fail("capOutput cut a UTF-8 sequence");
  std::string marker = "\n[... " + std::to_string(c.omitted) + " bytes omitted ...]\n";
  if (c.text.size() != text.size() - c.omitted + marker.size()) fail("capOutput lost bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  auto newline = input.find('\n');
  std::string line = input.substr(0, newline);
  std::string produced = newline == std::string::npos ? "" : input.substr(newline + 1);

  size_t head = size > 0 ? data[0] % 64 : 0;
  size_t tail = size > 1 ? data[1] % 64 : 0;
  capped(produced, head, tail);
  capped(input, tail, head);

  json message = json::parse(line, nullptr, false);
  if (message.is_discarded()) {
    (void)serialized(Session::parseError("not JSON"));
    return 0;
  }
  (void)kindOf(message);
  if (message.is_object() && message.contains("params") && message["params"].is_object()) {
    const json& params = message["params"];
    json args = params.contains("arguments") ? params["arguments"] : json::object();
    for (const auto& tool : Tools::list()) (void)checkArguments(args, tool["inputSchema"]);
    if (params.contains("protocolVersion") && params["protocolVersion"].is_string()) {
      (void)negotiateVersion(params["protocolVersion"]);
    }
  }

  StandIn moatd(produced);
  Session session(moatd, "fuzz");
  auto answer = session.handle(message, nullptr);
  if (answer) {
    (void)serialized(*answer);
    const json& a = *answer;
    bool response = a.is_object() && a.value("jsonrpc", json()) == "2.0" && a.contains("id") &&
                    (a.contains("result") != a.contains("error"));
    if (!response) fail("the answer is not a JSON-RPC response: " + serialized(a));
  }
  session.close();
  return 0;
}
