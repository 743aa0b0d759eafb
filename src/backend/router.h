#pragma once

#include <string>

#include "backend/backend.h"

namespace moat::backend {

// The manager's one backend over the two kinds of isolation: a create goes
// to the one its Spec names; every other call to the one that runs the
// environment. Snapshots are kept in one storage pool: either backend lists
// them; the microVM one deletes them where it runs (with the memory of
// those taken with it). Without a microVM backend, a create that asks for one is
// refused, saying why (`microvmMissing`).
class Router final : public Backend {
 public:
  Router(Backend& namespaces, Backend* microvm, std::string microvmMissing)
      : namespaces_(namespaces), microvm_(microvm), microvmMissing_(std::move(microvmMissing)) {}

  Result<Created> create(const Spec& spec) override;
  Status destroy(const std::string& id) override { return of(id).destroy(id); }
  Result<UniqueFd> attach(const std::string& id) override { return of(id).attach(id); }
  Result<std::vector<std::string>> list() override;
  Result<Usage> usage(const std::string& id) override { return of(id).usage(id); }
  Result<UniqueFd> networkNamespace(const std::string& id) override { return of(id).networkNamespace(id); }
  Result<UniqueFd> connectPort(const std::string& id, uint16_t port, std::chrono::milliseconds timeout) override {
    return of(id).connectPort(id, port, timeout);
  }
  Result<uint32_t> snapshot(const std::string& id, const std::string& name) override {
    return of(id).snapshot(id, name);
  }
  Result<uint32_t> snapshotWithMemory(const std::string& id, const std::string& name) override {
    return of(id).snapshotWithMemory(id, name);
  }
  Status deleteSnapshot(const std::string& name) override {
    return microvm_ ? microvm_->deleteSnapshot(name) : namespaces_.deleteSnapshot(name);
  }
  Result<std::vector<std::string>> snapshots() override { return namespaces_.snapshots(); }
  Result<Changes> changes(const ChangesRequest& request) override { return of(request.id).changes(request); }
  std::string whyEnded(const std::string& id) override { return of(id).whyEnded(id); }
  Status pause(const std::string& id) override { return of(id).pause(id); }
  Status resume(const std::string& id) override { return of(id).resume(id); }
  Result<uint64_t> checkpoint(const std::string& id) override { return of(id).checkpoint(id); }
  Result<UniqueFd> restoreCheckpoint(const Spec& spec) override { return of(spec.id).restoreCheckpoint(spec); }
  bool checkpointed(const std::string& id) override { return of(id).checkpointed(id); }

 private:
  Backend& of(const std::string& id);

  Backend& namespaces_;
  Backend* microvm_;
  std::string microvmMissing_;
};

}  // namespace moat::backend
