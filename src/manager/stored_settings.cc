#include "manager/stored_settings.h"

#include <nlohmann/json.hpp>

namespace moat::manager {

Result<std::vector<gate::Permissions>> storedLayers(const store::EnvironmentRecord& record,
                                                    const gate::Permissions& defaults) {
  return gate::layersFromJson(record.permissions, defaults);
}

std::string layersText(const std::vector<gate::Permissions>& layers) { return gate::layersToJson(layers).dump(); }

Result<egress::Policy> storedNetwork(const store::EnvironmentRecord& record) {
  if (record.network.empty()) return egress::Policy{};
  auto j = nlohmann::json::parse(record.network, nullptr, false);
  if (j.is_discarded()) return Error::make(Code::kCorrupt, "environment " + record.id + ": stored network is not JSON");
  return egress::Policy::parse(j);
}

std::string networkText(const egress::Policy& policy) { return policy.toJson().dump(); }

Result<std::vector<egress::Secret>> storedSecrets(const store::EnvironmentRecord& record) {
  return egress::secretsFromStored(record.secrets);
}

std::string secretsText(const std::vector<egress::Secret>& secrets) { return egress::secretsToStored(secrets).dump(); }

}  // namespace moat::manager
