#pragma once

#include <string>

#include "common/result.h"
#include "isolation/fs/layer_changes.h"

// What a microVM guest's files changed, asked of its moat-init (FileOp
// kChanges, docs/PROTOCOL.md): the host's limits in the request's data, the
// guest's list in the answer's. The guest walks its own overlay (its disk's
// upper layer against its root image), where moatd never looks: the list
// is the guest's word, decoded here as untrusted input.
namespace moat::init {

std::string encodeChangeLimits(const isolation::fs::LayerChangeLimits& limits);
Result<isolation::fs::LayerChangeLimits> decodeChangeLimits(const std::string& data);

std::string encodeChanges(const isolation::fs::LayerChanges& changes);
// Every field bounds-checked; more than `maxChanges` entries, an unknown
// kind or type, or a path that is not absolute is a protocol error.
Result<isolation::fs::LayerChanges> decodeChanges(const std::string& data, size_t maxChanges);

}  // namespace moat::init
