// moat-seccomp-compile POLICY OUT.cc NAME: compiles a seccomp policy file
// to BPF and writes it as C++ source defining kMoat<NAME>SeccompFilter (run
// by the build for the default and QEMU profiles).
#include <cstdio>

#include "isolation/seccomp/policy.h"
#include "os/file.h"

int main(int argc, char** argv) {
  using namespace moat;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s POLICY OUT.cc NAME\n", argv[0]);
    return 2;
  }
  auto text = os::readFile(argv[1]);
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", text.error().message().c_str());
    return 1;
  }
  auto policy = isolation::seccomp::parsePolicy(text.value());
  auto program =
      policy.ok() ? isolation::seccomp::compile(policy.value()) : Result<isolation::seccomp::Program>(policy.error());
  if (!program.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[1], program.error().message().c_str());
    return 1;
  }
  for (const auto& name : program->skipped) {
    std::fprintf(stderr, "note: %s does not exist on this architecture; skipped\n", name.c_str());
  }
  auto written = os::writeFile(argv[2], isolation::seccomp::filterSource(program.value(), argv[3]));
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", written.error().message().c_str());
    return 1;
  }
  return 0;
}
