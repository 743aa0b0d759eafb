#pragma once

#include <string>
#include <vector>

namespace moat::cli {

// Each subcommand takes the arguments after its name and returns the exit
// code; each parses its own flags, by hand. CLI11 (Debian's libcli11-dev)
// would serve these ~80 flags (one declaration each, help generated); not
// switched yet, because each command's usage text, error messages and exit
// codes (cli/exit_codes.h) are what scripts and the tests rely on, and the
// switch must keep them: an open item of issue 25.
int runCommand(const std::vector<std::string>& args);
// The moatd client commands (src/cli/client.h finds moatd and its token).
int envCommand(const std::vector<std::string>& args);
int execCommand(const std::vector<std::string>& args);
int cpCommand(const std::vector<std::string>& args);
int keysCommand(const std::vector<std::string>& args);
int shellCommand(const std::vector<std::string>& args);
int approvalsCommand(const std::vector<std::string>& args);
int eventsCommand(const std::vector<std::string>& args);
int auditCommand(const std::vector<std::string>& args);
int snapshotCommand(const std::vector<std::string>& args);
// moat mcp: the MCP server over stdio (docs/MCP.md).
int mcpCommand(const std::vector<std::string>& args);

}  // namespace moat::cli
