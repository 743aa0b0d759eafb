#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include "cli/run_options.h"

namespace moat::cli {

// The id moat run's one command has in the guest protocol.
inline constexpr uint32_t kRunCommandId = 1;
// How long after --timeout a guest's command may still run before moat run
// stops the guest itself (its moat-init, which should have, is the guest's).
inline constexpr std::chrono::seconds kGuestTimeoutGrace{5};

// Talks to moat-init over `control` until the command ends (its Spawn
// request is already queued): forwards stdin and signals, writes its
// output, and returns moat run's exit code. `oomKills`: the environment's
// count, to say why a SIGKILL came. `hostDeadline`: past it, the command
// has timed out whatever moat-init says (kExitTimeout): for a guest, whose
// moat-init is the guest's to stop.
int superviseCommand(int control, const RunOptions& options, const std::function<uint64_t()>& oomKills,
                     std::optional<std::chrono::steady_clock::time_point> hostDeadline = std::nullopt);

}  // namespace moat::cli
