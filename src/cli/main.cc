#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "common/process_args.h"
#include "common/sanitizer.h"
#include "moat_version.h"

MOAT_PID1_SANITIZER_OPTIONS()

namespace {

constexpr const char* kUsage = R"(usage: moat COMMAND [ARGS...]

commands:
  run       run one command in a fresh isolated environment (moat run --help)
  env       create, list, inspect and remove moatd's environments
            (moat env create|ls|get|rm, see moat env --help)
  exec      run a command in one of moatd's environments (moat exec --help)
  cp        copy a file between the host and an environment (moat cp --help)
  shell     a terminal in one of moatd's environments, or in a throwaway one
            (moat shell --help)
  snapshot  snapshots of environments' files, restores and forks
            (moat snapshot create|ls|restore|fork|rm)
  template  templates from OCI images (moat template import|ls|rm)
  port      a preview URL of a server inside an environment
            (moat port ENV PORT, moat port ls|revoke; docs/PORTS.md)
  keys      scoped API keys for agents (moat keys create|ls|rm)
  approvals what the gate asks a person (moat approvals ls|approve|deny|watch)
  events    moatd's audit log, listed or followed live (moat events --help)
  audit     check the audit log's hash chain, export it
            (moat audit verify|export)
  agent     agent runs moatd drives, every tool call through the gate
            (moat agent run|ls|get|stop|transcript, see docs/AGENTS.md)
  mcp       serve the Model Context Protocol on stdio, for agents
            (moat mcp [--standalone], see docs/MCP.md)
  version   print the version

Environment: MOAT_STATE (state directory, default /var/lib/moat); for the
moatd clients (env, exec, cp, shell, keys, events, audit) also MOAT_URL
(moatd's address, default unix:<state>/moatd.sock) and MOAT_TOKEN (default:
the file <state>/master-token).
)";

}  // namespace

int main(int argc, char** argv) {
  moat::rememberProcessArgs(argc, argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? moat::cli::kExitUsage : 0;
  }
  std::string command = args[0];
  args.erase(args.begin());
  if (command == "run") return moat::cli::runCommand(args);
  if (command == "env") return moat::cli::envCommand(args);
  if (command == "exec") return moat::cli::execCommand(args);
  if (command == "cp") return moat::cli::cpCommand(args);
  if (command == "keys") return moat::cli::keysCommand(args);
  if (command == "shell") return moat::cli::shellCommand(args);
  if (command == "approvals") return moat::cli::approvalsCommand(args);
  if (command == "events") return moat::cli::eventsCommand(args);
  if (command == "audit") return moat::cli::auditCommand(args);
  if (command == "mcp") return moat::cli::mcpCommand(args);
  if (command == "snapshot") return moat::cli::snapshotCommand(args);
  if (command == "template") return moat::cli::templateCommand(args);
  if (command == "port") return moat::cli::portCommand(args);
  if (command == "agent") return moat::cli::agentCommand(args);
  if (command == "version" || command == "--version") {
    std::puts("moat " MOAT_VERSION);
    return 0;
  }
  std::fprintf(stderr, "moat: unknown command '%s' (see moat --help)\n", command.c_str());
  return moat::cli::kExitUsage;
}
