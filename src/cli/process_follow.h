#pragma once

#include <cstdint>
#include <string>

#include "cli/client.h"

// A command started through moatd's processes API (docs/API.md, Processes),
// followed to its end as if it ran here: what `moat exec` does.
namespace moat::cli {

struct FollowOptions {
  std::string environment;  // for messages
  uint64_t process = 0;     // moatd's id of the process
  bool forwardStdin = false;
  double timeoutSeconds = 0;  // for the message when the command's timeout killed it
};

// Prints the command's output to our stdout and stderr as it is produced;
// sends it our stdin as it comes (with forwardStdin) and the signals we get
// (INT, TERM, HUP, QUIT; a second INT sends KILL; a third leaves without
// waiting). A reader of ours that goes away gets the command SIGPIPE, as
// `moat run` does. Returns the exit status `moat exec` documents.
int followProcess(Client& client, const FollowOptions& options);

}  // namespace moat::cli
