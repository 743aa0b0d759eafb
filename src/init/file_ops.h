#pragma once

#include "init/protocol.h"

namespace moat::init {

// Carries out one file request with the caller's own view of the file
// system. moat-init runs it inside the environment (after pivot_root), so
// every path, `..` and symlink resolves within the environment's root.
FileResult runFileRequest(const FileRequest& request);

}  // namespace moat::init
