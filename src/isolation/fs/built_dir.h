#pragma once

#include <functional>
#include <string>

#include "common/result.h"

namespace moat::isolation::fs {

// A directory in the state directory that moat builds once and then reuses
// (the host template's skeleton, the /dev skeleton). Returns <parent>/<name>,
// building it with `build` under a lock if it is not complete yet; bump the
// name's version when its content changes.
Result<std::string> ensureBuiltDirectory(const std::string& parent, const std::string& name,
                                         const std::function<Status(const std::string&)>& build);

}  // namespace moat::isolation::fs
