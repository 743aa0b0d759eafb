#include "backend/backend.h"

#include <algorithm>

#include "common/hex.h"
#include "isolation/fs/storage_pool.h"
#include "os/netlink.h"

namespace moat::backend {

const char* isolationName(Isolation isolation) { return isolation == Isolation::kMicroVm ? "microvm" : "namespaces"; }

std::optional<Isolation> isolationNamed(std::string_view name) {
  if (name == "namespaces") return Isolation::kNamespaces;
  if (name == "microvm") return Isolation::kMicroVm;
  return std::nullopt;
}

Result<UniqueFd> Backend::connectPort(const std::string& id, uint16_t port, std::chrono::milliseconds timeout) {
  MOAT_ASSIGN(UniqueFd netns, networkNamespace(id));
  return os::connectLoopbackIn(netns.get(), port, timeout);
}

void countStorage(const std::string& stateDir, const std::string& id, Usage& usage) {
  auto bytes = isolation::fs::StoragePool::volumeBytesIn(stateDir, id);
  usage.storageKnown = bytes.ok();
  usage.storageBytes = bytes.ok() ? bytes.value() : 0;
}

bool Backend::runs(const std::string& id) {
  auto ids = list();
  return ids.ok() && std::find(ids->begin(), ids->end(), id) != ids->end();
}

Status Backend::pause(const std::string& id) {
  return Error::make(Code::kUnsupported, "this backend cannot pause environment " + id);
}

Result<uint64_t> Backend::checkpoint(const std::string& id) {
  return Error::make(Code::kUnsupported,
                     "environment " + id +
                         " cannot be checkpointed to disk: checkpoints of namespace environments need CRIU, which moat "
                         "does not use yet (microvm environments can be; docs/PAUSE.md)");
}

Result<uint32_t> Backend::snapshotWithMemory(const std::string& id, const std::string&) {
  return Error::make(Code::kUnsupported,
                     "environment " + id +
                         " cannot be forked with its memory: a namespace environment's processes would need CRIU, "
                         "which moat does not use yet (microvm environments can be; docs/PAUSE.md)");
}

Result<UniqueFd> Backend::restoreCheckpoint(const Spec& spec) {
  return Error::make(Code::kUnsupported, "environment " + spec.id + " has no checkpoint this backend can restore");
}

Status Backend::resume(const std::string& id) {
  return Error::make(Code::kUnsupported, "this backend cannot resume environment " + id);
}

std::string newEnvironmentId() {
  auto id = randomHex(6);
  // getrandom does not fail for 6 bytes once the kernel's pool is ready.
  return id.ok() ? id.value() : std::string(12, '0');
}

}  // namespace moat::backend
