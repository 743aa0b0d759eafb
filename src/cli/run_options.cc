#include "cli/run_options.h"

#include <cmath>
#include <cstdlib>

#include "cli/client.h"
#include "common/path.h"
#include "os/file.h"
#include "os/tree.h"

namespace moat::cli {
namespace {

Result<uint64_t> parseBounded(const std::string& flag, const std::string& value, uint64_t min, uint64_t max,
                              const std::string& unit) {
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos) {
    return usageError(flag + ": '" + value + "' is not a whole number");
  }
  if (value.size() > 12) return usageError(flag + ": " + value + " is out of range");
  uint64_t v = std::strtoull(value.c_str(), nullptr, 10);
  if (v < min || v > max) {
    return usageError(flag + ": " + value + " is out of range (" + std::to_string(min) + " to " + std::to_string(max) +
                      unit + ")");
  }
  return v;
}

bool validEnvName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

Result<isolation::fs::BindMount> parseVolume(const std::string& value) {
  // SRC:DST[:ro|:rw]
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= value.size(); ++i) {
    if (i == value.size() || value[i] == ':') {
      parts.push_back(value.substr(start, i - start));
      start = i + 1;
    }
  }
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() || parts[1].empty()) {
    return usageError("-v: expected HOST_PATH:ENV_PATH[:ro], got '" + value + "'");
  }
  isolation::fs::BindMount bind;
  if (parts.size() == 3) {
    if (parts[2] != "ro" && parts[2] != "rw") return usageError("-v: mode must be ro or rw, got '" + parts[2] + "'");
    bind.readOnly = parts[2] == "ro";
  }
  // Not canonicalised here: the path is opened as it is named, following
  // only root's symlinks (os::openHostPath), when the environment is made.
  bind.source = parts[0];
  if (bind.source[0] != '/') {
    auto cwd = os::currentDirectory();
    if (!cwd.ok()) return usageError("-v: " + cwd.error().message());
    bind.source = os::joinPath(cwd.value(), bind.source);
  }
  auto source = os::openHostPath(bind.source, "host path");
  if (!source.ok()) return usageError("-v: " + source.error().context);
  bind.target = parts[1];
  auto s = isolation::fs::validateBindTarget(bind.target);
  if (!s.ok()) return usageError("-v: " + s.error().context);
  bind.target = moat::normalizePath(bind.target);
  return bind;
}

}  // namespace

const char* runUsage() {
  return R"(usage: moat run [options] [--] COMMAND [ARG...]

Runs COMMAND in a fresh, isolated environment, streams its output, and
destroys the environment. Exit status: the command's (128+N if signal N killed
it); 124 timeout; 125 the environment failed; 126 cannot run; 127 not found;
2 bad usage.

options:
  --cpus N          CPU time per second (fractional), default 1
  --memory MB       memory limit, no swap, default 1024
  --pids N          process/thread limit, default 1024
  --storage GB      writable storage limit (fractional), default 4
  --timeout S       kill the command after S seconds (default: none)
  -i, --interactive forward stdin to the command (default: /dev/null)
  -e NAME=VALUE     set a variable (-e NAME copies the host's value); repeatable
  -v HOST:PATH[:ro] show a host path inside (explicit only); repeatable
  -w, --workdir DIR working directory inside, default /workspace
  --template T      'host' (default) or a root file system directory
  --isolation I     'namespaces' (default) or 'microvm': a guest kernel of its
                    own under QEMU (needs a --template other than host;
                    docs/MICROVM.md)
  --state DIR       state directory, default $MOAT_STATE or /var/lib/moat
)";
}

Result<RunOptions> parseRunOptions(const std::vector<std::string>& args, uint64_t hostMemoryMb,
                                   const char* (*lookupHostEnv)(const char*)) {
  RunOptions o;
  // One-shot runs skip the exec of moat-init (see InitMode); MOAT_INIT_MODE=exec
  // selects the daemon's way, for tests and comparison.
  const char* initMode = std::getenv("MOAT_INIT_MODE");
  o.spec.initMode = initMode && std::string(initMode) == "exec" ? backend::namespaces::InitMode::kExec
                                                                : backend::namespaces::InitMode::kInProcess;
  const char* state = std::getenv("MOAT_STATE");
  o.spec.stateDir = state && *state ? state : "/var/lib/moat";
  FlagReader flags(args);
  while (!flags.done()) {
    if (flags.current() == "--") {
      flags.skip();
      break;
    }
    if (!flags.currentIsFlag()) break;  // the command starts here
    MOAT_TRY(flags.next());
    const std::string arg = flags.name();
    if (arg == "-h" || arg == "--help" || arg == "-i" || arg == "--interactive") MOAT_TRY(flags.noValue());
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    } else if (arg == "-i" || arg == "--interactive") {
      o.interactive = true;
    } else if (arg == "--cpus") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(o.spec.cpus, parseNumber(arg, v));
      if (!(o.spec.cpus >= 0.01 && o.spec.cpus <= 1024)) {
        return usageError("--cpus: " + v + " is out of range (0.01 to 1024)");
      }
    } else if (arg == "--memory") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(o.spec.memoryMb, parseBounded(arg, v, 16, hostMemoryMb, " MB, the host's memory"));
    } else if (arg == "--pids") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(o.spec.pids, parseBounded(arg, v, 4, 4194304, ""));
    } else if (arg == "--storage") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(o.spec.storageGb, parseNumber(arg, v));
      if (!(o.spec.storageGb >= 0.01 && o.spec.storageGb <= 65536)) {
        return usageError("--storage: " + v + " is out of range (0.01 to 65536 GB)");
      }
    } else if (arg == "--timeout") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(o.timeoutSeconds, parseNumber(arg, v));
      if (!(o.timeoutSeconds >= 0.001 && o.timeoutSeconds <= 31536000)) {
        return usageError("--timeout: " + v + " is out of range (0.001 to 31536000 seconds)");
      }
    } else if (arg == "-e" || arg == "--env") {
      MOAT_ASSIGN(std::string v, flags.value());
      auto eq = v.find('=');
      std::string name = v.substr(0, eq);
      if (!validEnvName(name)) return usageError("-e: '" + name + "' is not a valid variable name");
      if (eq == std::string::npos) {
        const char* host = lookupHostEnv ? lookupHostEnv(name.c_str()) : nullptr;
        if (host == nullptr) return usageError("-e: " + name + " is not set on the host");
        v = name + "=" + host;
      }
      o.env.push_back(v);
    } else if (arg == "-v" || arg == "--volume") {
      MOAT_ASSIGN(std::string v, flags.value());
      MOAT_ASSIGN(auto bind, parseVolume(v));
      o.spec.volumes.push_back(bind);
    } else if (arg == "-w" || arg == "--workdir") {
      MOAT_ASSIGN(std::string v, flags.value());
      if (v.empty() || v[0] != '/') return usageError("-w: working directory must be absolute: " + v);
      o.workdir = moat::normalizePath(v);
    } else if (arg == "--isolation") {
      MOAT_ASSIGN(std::string v, flags.value());
      if (v != "namespaces" && v != "microvm") {
        return usageError("--isolation: '" + v + "' is not one of namespaces, microvm");
      }
      o.microvm = v == "microvm";
    } else if (arg == "--template") {
      MOAT_ASSIGN(o.spec.templateName, flags.value());
    } else if (arg == "--state") {
      MOAT_ASSIGN(std::string v, flags.value());
      if (v.empty() || v[0] != '/') return usageError("--state: must be an absolute path: " + v);
      o.spec.stateDir = moat::normalizePath(v);
    } else {
      return usageError("unknown option " + arg);
    }
  }
  o.command = flags.rest();
  if (o.command.empty()) return usageError("missing command (usage: moat run [options] -- COMMAND...)");
  return o;
}

}  // namespace moat::cli
