#pragma once

#include <cstddef>
#include <string>
#include <vector>

// The model boundary: what an agent run sends a provider passes through
// here. The values of the run's secrets (moat knows them) and text shaped
// like a credential (private keys, common token formats) are replaced.
namespace moat::agent {

struct Redacted {
  std::string text;
  size_t replaced = 0;
};

Redacted redact(const std::string& text, const std::vector<std::string>& secrets);

}  // namespace moat::agent
