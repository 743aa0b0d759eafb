#include "backend/router.h"

namespace moat::backend {

Result<Backend::Created> Router::create(const Spec& spec) {
  if (spec.isolation == Isolation::kNamespaces) return namespaces_.create(spec);
  if (!microvm_) {
    return Error::make(Code::kUnsupported, "isolation microvm is not available on this host: " + microvmMissing_);
  }
  return microvm_->create(spec);
}

Result<std::vector<std::string>> Router::list() {
  MOAT_ASSIGN(auto ids, namespaces_.list());
  if (microvm_) {
    MOAT_ASSIGN(auto vms, microvm_->list());
    ids.insert(ids.end(), vms.begin(), vms.end());
  }
  return ids;
}

Backend& Router::of(const std::string& id) {
  if (microvm_ && microvm_->runs(id)) return *microvm_;
  return namespaces_;
}

}  // namespace moat::backend
