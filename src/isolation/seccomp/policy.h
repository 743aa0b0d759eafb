#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

// The seccomp profile as data: parsed from policy/seccomp/*.policy (the
// default one is compiled into the binaries) and compiled to BPF once per
// process, before any environment is cloned.
namespace moat::isolation::seccomp {

struct Rule {
  std::string syscall;
  int errnoValue = 0;   // returned errno; 0 with kill = true
  bool kill = false;
  int argIndex = -1;    // -1: unconditional
  uint64_t anyBits = 0; // with argIndex: match when (arg & anyBits) != 0
  std::string why;
  int line = 0;
};

struct Policy {
  std::vector<Rule> rules;
};

Result<Policy> parsePolicy(const std::string& text);
const std::string& defaultPolicyText();

struct Program {
  std::vector<sock_filter> filter;
  std::vector<std::string> skipped;  // syscalls this architecture does not have
};
Result<Program> compile(const Policy& policy);

// The compiled default profile (compiled on first use, then cached).
Result<Program> defaultProgram();

}  // namespace moat::isolation::seccomp
