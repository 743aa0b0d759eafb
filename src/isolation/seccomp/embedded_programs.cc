#include <cstddef>

#include "isolation/seccomp/policy.h"

// Generated at build time from policy/seccomp/default.policy and qemu.policy.
extern const sock_filter kMoatDefaultSeccompFilter[];
extern const size_t kMoatDefaultSeccompFilterLength;
extern const sock_filter kMoatQemuSeccompFilter[];
extern const size_t kMoatQemuSeccompFilterLength;

namespace moat::isolation::seccomp {
namespace {

Program embedded(const sock_filter* filter, size_t length) {
  Program program;
  program.filter.assign(filter, filter + length);
  return program;
}

}  // namespace

Result<Program> defaultProgram() { return embedded(kMoatDefaultSeccompFilter, kMoatDefaultSeccompFilterLength); }

Result<Program> qemuProgram() { return embedded(kMoatQemuSeccompFilter, kMoatQemuSeccompFilterLength); }

}  // namespace moat::isolation::seccomp
