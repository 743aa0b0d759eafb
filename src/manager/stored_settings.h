#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "egress/policy.h"
#include "egress/secrets.h"
#include "gate/permissions.h"
#include "store/store.h"

// An environment's settings as its store record keeps them (JSON text, so
// that the store needs no gate or egress types) and as everything above the
// store uses them: the one place that reads and writes that text.
namespace moat::manager {

// The permission layers; a record without any has [defaults]. A record
// whose text cannot be read is an error (the manager then gates the
// environment shut).
Result<std::vector<gate::Permissions>> storedLayers(const store::EnvironmentRecord& record,
                                                    const gate::Permissions& defaults);
std::string layersText(const std::vector<gate::Permissions>& layers);

// The network policy; a record without one has mode "none".
Result<egress::Policy> storedNetwork(const store::EnvironmentRecord& record);
std::string networkText(const egress::Policy& policy);

// The secrets the proxy injects; a record without any has none.
Result<std::vector<egress::Secret>> storedSecrets(const store::EnvironmentRecord& record);
std::string secretsText(const std::vector<egress::Secret>& secrets);

}  // namespace moat::manager
