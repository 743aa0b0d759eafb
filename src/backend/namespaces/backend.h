#pragma once

#include <string>

#include "backend/backend.h"
#include "backend/namespaces/spawner.h"

namespace moat::backend::namespaces {

// The namespace backend behind moatd's seam: environments made and
// destroyed by the spawner (which outlives moatd), snapshots kept in the
// state directory's storage pool (btrfs subvolumes).
class NamespacesBackend final : public Backend {
 public:
  NamespacesBackend(Spawner& spawner, std::string stateDir) : spawner_(spawner), stateDir_(std::move(stateDir)) {}

  Result<Created> create(const Spec& spec) override;
  Status destroy(const std::string& id) override { return spawner_.destroy(id); }
  Result<UniqueFd> attach(const std::string& id) override { return spawner_.attach(id); }
  Result<std::vector<std::string>> list() override { return spawner_.list(); }
  Result<Usage> usage(const std::string& id) override;
  Status pause(const std::string& id) override { return spawner_.pause(id); }
  Status resume(const std::string& id) override { return spawner_.resume(id); }
  Result<UniqueFd> networkNamespace(const std::string& id) override { return spawner_.networkNamespace(id); }
  Result<uint32_t> snapshot(const std::string& id, const std::string& name) override {
    return spawner_.snapshot(id, name);
  }
  Status deleteSnapshot(const std::string& name) override;
  Result<std::vector<std::string>> snapshots() override;
  Result<Changes> changes(const ChangesRequest& request) override;

 private:
  Spawner& spawner_;
  std::string stateDir_;
};

}  // namespace moat::backend::namespaces
