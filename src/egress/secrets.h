#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

// Credentials that never enter an environment (docs/EGRESS.md): the
// environment sees a placeholder in an environment variable; the proxy puts
// the real value in requests to the secret's hosts and refuses requests that
// carry the placeholder anywhere else.
namespace moat::egress {

struct Secret {
  std::string name;                // the environment variable holding the placeholder
  std::string value;               // never leaves moatd except towards `hosts`
  std::vector<std::string> hosts;  // globs, lower case
  std::string header;              // optional: a header the proxy sets, e.g. "Authorization"
  std::string headerFormat;        // its value, "{value}" replaced ("Bearer {value}")
  std::string placeholder;         // "moat-secret-<name>-<random>"
  bool boundTo(const std::string& host) const;
};

// [{name, value, hosts, header?}] as sent on create; placeholders are made
// here. `header` is "Name" or "Name: format with {value}". Errors name the
// field ("secrets[1].hosts: ...").
Result<std::vector<Secret>> parseSecrets(const nlohmann::json& j);
// What moatd stores (values included: the state directory is private) and
// reads back after a restart.
nlohmann::json secretsToStored(const std::vector<Secret>& secrets);
Result<std::vector<Secret>> secretsFromStored(const std::string& text);
// What the API shows: names, hosts and headers, never values.
nlohmann::json secretsToPublic(const std::vector<Secret>& secrets);

// Replaces every placeholder of a secret bound to `host` in `text` and
// returns the first secret whose placeholder appears but is not bound to
// `host` (the request must then be refused), if any.
std::optional<std::string> substitute(const std::vector<Secret>& secrets, const std::string& host, std::string& text);

}  // namespace moat::egress
