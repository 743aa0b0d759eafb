#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

// The seccomp profile as data: parsed from policy/seccomp/*.policy and
// compiled to classic BPF with libseccomp.
namespace moat::isolation::seccomp {

// One condition on a system call's argument.
struct Condition {
  int argIndex = 0;
  uint64_t anyBits = 0;  // `argN has-any MASK`: match when (arg & anyBits) != 0
  // `argN == VALUE` (anyBits 0): match when the argument's low 32 bits are
  // VALUE (the kernel reads these arguments as an int: a caller setting the
  // high bits must not slip past).
  bool equals = false;
  uint32_t value = 0;
};

struct Rule {
  std::string syscall;
  int errnoValue = 0;  // returned errno; 0 with kill = true
  bool kill = false;
  std::vector<Condition> conditions;  // all must hold; none: unconditional
  std::string why;
  int line = 0;
};

struct Policy {
  std::vector<Rule> rules;
};

Result<Policy> parsePolicy(const std::string& text);
const std::string& defaultPolicyText();
// moatd's own profile (policy/seccomp/moatd.policy): what moatd never calls.
const std::string& moatdPolicyText();

struct Program {
  std::vector<sock_filter> filter;
  std::vector<std::string> skipped;  // syscalls this architecture does not have
};
Result<Program> compile(const Policy& policy);

// The default profile as BPF, compiled from the policy file at build time
// (by moat-seccomp-compile) so that creating an environment costs no
// compilation and moat carries no libseccomp at run time.
Result<Program> defaultProgram();

// QEMU's profile (policy/seccomp/qemu.policy) as BPF, compiled at build
// time like the default one: what moat installs on the microVM backend's
// VMM before it runs.
Result<Program> qemuProgram();

// Writes C++ source defining an embedded filter (used by the build):
// kMoat<name>SeccompFilter and its length.
std::string filterSource(const Program& program, const std::string& name);

}  // namespace moat::isolation::seccomp
