#include "backend/backend.h"

#include "common/hex.h"

namespace moat::backend {

std::string newEnvironmentId() {
  auto id = randomHex(6);
  // getrandom does not fail for 6 bytes once the kernel's pool is ready.
  return id.ok() ? id.value() : std::string(12, '0');
}

}  // namespace moat::backend
