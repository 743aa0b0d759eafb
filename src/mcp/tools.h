#pragma once

#include <string>

#include "mcp/session.h"

// The tools (docs/MCP.md): each one a few calls of moatd's REST API, with
// arguments checked against its input schema and every failure turned into
// a result the model can act on (isError), never a protocol error.
namespace moat::mcp {

class Tools {
 public:
  Tools(Session& session, CallContext& call) : session_(session), call_(call) {}
  static json list();
  static bool exists(const std::string& name);
  // moatd's error as one sentence ("denied by policy: ..." for the gate).
  static std::string describeFailure(const RestResponse& r);
  json call(const std::string& name, const json& args);

 private:
  struct Rest {
    int status;
    json body;          // parsed JSON (discarded when the body is not JSON)
    std::string text;   // the body as it came
    std::string error;  // when the status is not a success: moatd's reason
  };
  Rest rest(const std::string& method, const std::string& target, const std::string& body = "");
  json createEnvironment(const json& args);
  json listEnvironments();
  json destroyEnvironment(const json& args);
  json pauseEnvironment(const std::string& env, bool pause, bool toDisk = false);
  json runCommand(const std::string& env, const json& args);
  json startProcess(const std::string& env, const json& args);
  json readProcessOutput(const std::string& env, const json& args);
  json sendInput(const std::string& env, const json& args);
  json killProcess(const std::string& env, const json& args);
  json readFile(const std::string& env, const json& args);
  json writeFile(const std::string& env, const json& args);
  json editFile(const std::string& env, const json& args);
  json listFiles(const std::string& env, const json& args);
  json searchFiles(const std::string& env, const json& args);
  json setNetworkPolicy(const std::string& env, const json& args);
  json snapshotEnvironment(const std::string& env, const json& args);
  json restoreEnvironment(const std::string& env, const json& args);
  json forkEnvironment(const std::string& env, const json& args);
  // Output of a process from `since`, until it ends or `deadline` (waiting
  // for more while `wait`); fills stdout/stderr and returns the last event.
  struct Collected {
    std::string out, err;
    uint64_t next = 0;
    bool ended = false;
    json terminal;
    std::string failure;
  };
  Collected collect(const std::string& env, uint64_t process, uint64_t since,
                    std::chrono::steady_clock::time_point deadline, bool untilEnd);

  Session& session_;
  CallContext& call_;
};

// Checks `args` against a tool's input schema (types, required, unknown
// fields, bounds, enums); "" when it fits, else what is wrong.
std::string checkArguments(const json& args, const json& schema, const std::string& where = "");

}  // namespace moat::mcp
