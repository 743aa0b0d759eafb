#pragma once

#include <map>
#include <string>
#include <vector>

// Test helpers: run the built binaries as a user would and collect what they
// print. MOAT_BIN_DIR is set by CMake to build/bin.
namespace moat::test {

struct ProcessResult {
  int exitCode = -1;  // 128+N when killed by signal N
  std::string out;
  std::string err;
};

// Runs argv (argv[0] is a path) with `input` on stdin and the given extra
// environment variables on top of a minimal one; waits for it.
ProcessResult runProcess(const std::vector<std::string>& argv, const std::string& input = "",
                         const std::map<std::string, std::string>& env = {});

// Runs build/bin/moat with args, with MOAT_STATE pointing at testStateDir().
ProcessResult runMoat(const std::vector<std::string>& args, const std::string& input = "",
                      const std::map<std::string, std::string>& env = {});

std::string binDir();
// A state directory shared by the tests of one test binary; its storage pool
// is unmounted and removed by StateDirCleanup (registered by linking
// moat_test_support's main).
const std::string& testStateDir();

// True when running as root; tests that need root call GTEST_SKIP with the reason.
bool isRoot();

}  // namespace moat::test

#define MOAT_REQUIRE_ROOT()                                                               \
  do {                                                                                    \
    if (!::moat::test::isRoot()) GTEST_SKIP() << "needs root: creates namespaces, cgroups " \
                                                 "and mounts (CI runs as root)";          \
  } while (0)
