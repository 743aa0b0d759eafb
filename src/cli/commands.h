#pragma once

#include <string>
#include <vector>

namespace moat::cli {

// Each subcommand takes the arguments after its name and returns the exit
// code; each parses its own flags with the shared FlagReader (cli/client.h,
// which says why not CLI11).
int runCommand(const std::vector<std::string>& args);
// The moatd client commands (src/cli/client.h finds moatd and its token).
int envCommand(const std::vector<std::string>& args);
int agentCommand(const std::vector<std::string>& args);
int execCommand(const std::vector<std::string>& args);
int cpCommand(const std::vector<std::string>& args);
int keysCommand(const std::vector<std::string>& args);
int shellCommand(const std::vector<std::string>& args);
int approvalsCommand(const std::vector<std::string>& args);
int eventsCommand(const std::vector<std::string>& args);
int auditCommand(const std::vector<std::string>& args);
int snapshotCommand(const std::vector<std::string>& args);
int templateCommand(const std::vector<std::string>& args);
int portCommand(const std::vector<std::string>& args);
// moat doctor: what this host gives moat (docs/INSTALL.md).
int doctorCommand(const std::vector<std::string>& args);
// moat mcp: the MCP server over stdio (docs/MCP.md).
int mcpCommand(const std::vector<std::string>& args);

}  // namespace moat::cli
