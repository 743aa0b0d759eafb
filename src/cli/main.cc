#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/client.h"
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
  doctor    check what this host gives moat, and what to do about the rest
            (moat doctor --help)
  version   print the version

Environment: MOAT_STATE (state directory, default /var/lib/moat); for the
moatd clients (env, exec, cp, shell, keys, events, audit) also MOAT_URL
(moatd's address, default unix:<state>/moatd.sock) and MOAT_TOKEN (default:
the file <state>/master-token). `--url`, `--token` and `--state` may come
before the command too (moat --url tcp://host:7070 env ls), for every
command after it; the same flag after the command wins.
)";

// The connection flags given before the command (`moat --url X env ls`):
// they stand for the variables, which every command reads, so they apply
// wherever the command's own flags may be. Returns false (said on stderr)
// for one without its value or with a bad one.
bool takeLeadingConnectionFlags(std::vector<std::string>& args) {
  static const struct {
    const char* flag;
    const char* variable;
  } kFlags[] = {{"--url", "MOAT_URL"}, {"--token", "MOAT_TOKEN"}, {"--state", "MOAT_STATE"}};
  while (!args.empty()) {
    const std::string& first = args[0];
    const char* variable = nullptr;
    std::string value;
    size_t used = 0;
    for (const auto& f : kFlags) {
      const std::string flag = f.flag;
      if (first == flag) {
        if (args.size() < 2) {
          std::fprintf(stderr, "moat: %s needs a value (see moat --help)\n", f.flag);
          return false;
        }
        variable = f.variable;
        value = args[1];
        used = 2;
      } else if (first.rfind(flag + "=", 0) == 0) {
        variable = f.variable;
        value = first.substr(flag.size() + 1);
        used = 1;
      }
    }
    if (!variable) return true;
    if (std::strcmp(variable, "MOAT_URL") == 0) {
      if (auto parsed = moat::cli::parseEndpoint(value); !parsed.ok()) {
        std::fprintf(stderr, "moat: %s\n", parsed.error().message().c_str());
        return false;
      }
    }
    if (std::strcmp(variable, "MOAT_STATE") == 0 && (value.empty() || value[0] != '/')) {
      std::fprintf(stderr, "moat: --state: must be an absolute path: %s\n", value.c_str());
      return false;
    }
    ::setenv(variable, value.c_str(), 1);
    args.erase(args.begin(), args.begin() + static_cast<long>(used));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  moat::rememberProcessArgs(argc, argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!takeLeadingConnectionFlags(args)) return moat::cli::kExitUsage;
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
  if (command == "doctor") return moat::cli::doctorCommand(args);
  if (command == "version" || command == "--version") {
    std::puts("moat " MOAT_VERSION);
    return 0;
  }
  std::fprintf(stderr, "moat: unknown command '%s' (see moat --help)\n", command.c_str());
  return moat::cli::kExitUsage;
}
