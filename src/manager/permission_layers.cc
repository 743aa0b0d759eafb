// An environment's permission layers: the gate's verdicts on its actions,
// and changes to the layers, stored first (docs/GATE.md).
#include "manager/environment_manager.h"
#include "manager/stored_settings.h"

namespace moat::manager {

Result<gate::Evaluation> EnvironmentManager::evaluate(const std::string& id, const gate::Action& action,
                                                      const gate::Permissions* ceiling) {
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  return gate::evaluate(*live.permissions, ceiling, action);
}

Result<std::vector<gate::Permissions>> EnvironmentManager::permissions(const std::string& id) {
  if (auto live = live_.find(id)) return *live->permissions;
  MOAT_ASSIGN(auto record, get(id));
  return storedLayers(record, config_.defaultPermissions);
}

Status EnvironmentManager::storeLayers(const std::string& id, std::vector<gate::Permissions> layers) {
  MOAT_TRY(store_.setPermissions(id, layersText(layers)));
  std::shared_ptr<InitConnection> connection;
  auto shared = std::make_shared<const std::vector<gate::Permissions>>(std::move(layers));
  live_.update(id, [&](LiveEnvironment& live) {
    live.permissions = shared;
    connection = live.connection;
  });
  if (connection) sendExecPolicy(id, connection);  // the new layers may judge programs
  return {};
}

Status EnvironmentManager::setPermissions(const std::string& id, const gate::Permissions& p, bool replace) {
  constexpr size_t kMaxLayers = 16;
  std::lock_guard<std::mutex> serial(permissionsMutex_);
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  std::vector<gate::Permissions> layers = *live.permissions;
  if (replace) {
    layers = {p};
  } else {
    if (layers.size() >= kMaxLayers) {
      return Error::make(Code::kInvalidArgument, "permissions: at most " + std::to_string(kMaxLayers) +
                                                     " layers; the master can replace them with one");
    }
    layers.push_back(p);
  }
  return storeLayers(id, std::move(layers));
}

Status EnvironmentManager::rememberRule(const std::string& id, gate::Scope scope, const gate::Rule& rule,
                                        bool everyLayer) {
  std::lock_guard<std::mutex> serial(permissionsMutex_);
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  std::vector<gate::Permissions> layers = *live.permissions;
  for (size_t i = 0; i < (everyLayer ? layers.size() : 1); ++i) layers[i].prepend(scope, rule);
  return storeLayers(id, std::move(layers));
}

}  // namespace moat::manager
