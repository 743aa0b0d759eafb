#include <cstddef>

#include "isolation/seccomp/policy.h"

// Generated at build time from policy/seccomp/default.policy.
extern const sock_filter kMoatDefaultSeccompFilter[];
extern const size_t kMoatDefaultSeccompFilterLength;

namespace moat::isolation::seccomp {

Result<Program> defaultProgram() {
  Program program;
  program.filter.assign(kMoatDefaultSeccompFilter, kMoatDefaultSeccompFilter + kMoatDefaultSeccompFilterLength);
  return program;
}

}  // namespace moat::isolation::seccomp
