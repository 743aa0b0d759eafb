#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/http.h"
#include "audit/log.h"
#include "backend/microvm/saved_guests.h"
#include "common/log.h"
#include "common/result.h"
#include "egress/controller.h"
#include "manager/environment_manager.h"
#include "templates/importer.h"

namespace moat::daemon {

// Why not CLI11 (Debian's libcli11-dev): moatd has 16 flags, parsed once,
// each with its own range and a message saying what the number means
// (tests/unit/daemon_flags_test.cc pins them). CLI11 would need a validator
// and a custom message per flag to say the same, for no fewer lines.

// What moatd's command line asks for, on top of the defaults.
struct DaemonFlags {
  std::string stateDir;  // the default: $MOAT_STATE or /var/lib/moat (given to the parser)
  std::string listen = "127.0.0.1:7070";
  int64_t approvalTimeoutS = 120;
  unsigned long keyRate = 200;  // api::ApiOptions::keyRequestsPerSecond
  manager::ManagerConfig manager;
  audit::LogOptions audit;
  egress::EgressConfig egress;
  api::ServerLimits server;
  bool egressOn = true;
  bool agentLocalProviders = false;                 // api::ApiOptions::agentLocalProviders
  uint64_t agentKeyTokens = 0;                      // api::ApiOptions::agentKeyTokensPerDay
  std::string boardDir;                             // empty: share/moat/board beside moatd's bin/
  bool board = true;                                // --no-board: none
  std::optional<gid_t> socketGroup;                 // --socket-group: may connect to <state>/moatd.sock
  log::Level logLevel = log::Level::kInfo;          // --log-level
  log::Format logFormat = log::Format::kText;       // --log-format
  bool accessLog = false;                           // --access-log: a line per request
  templates::ImportLimits templateLimits;           // --template-max-bytes, --template-max-files, --template-timeout
  std::string previewDomain = "preview.localhost";  // api::ApiOptions::previewDomain
  int64_t portTimeoutS = 60;                        // api::PortProxyLimits::idle
  int64_t microvmBootWaitS = backend::microvm::kGuestBootWait.count();
  uint64_t microvmSavedGuests = backend::microvm::kMaxSavedGuests;  // 0: creates boot
  bool help = false;                                                // -h, --help: print daemonUsage() and stop
  bool version = false;                                             // --version: print moatd's version and stop
};

// Parses moatd's arguments (without argv[0]). `hostMemoryMb` bounds a warm
// pool's ram_mb. Errors: code "usage" for an unknown argument or one
// missing its value, "invalid_argument" for a value out of range or a file
// that cannot be read; the message names the flag.
Result<DaemonFlags> parseDaemonFlags(const std::vector<std::string>& args, const std::string& defaultStateDir,
                                     double hostMemoryMb);

const char* daemonUsage();

}  // namespace moat::daemon
