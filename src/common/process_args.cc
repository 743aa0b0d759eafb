#include "common/process_args.h"

#include <cstring>

extern char** environ;

namespace moat {
namespace {

int savedArgc = 0;
char** savedArgv = nullptr;

}  // namespace

void rememberProcessArgs(int argc, char** argv) {
  savedArgc = argc;
  savedArgv = argv;
}

void scrubProcessArgs() {
  for (int i = 0; i < savedArgc && savedArgv != nullptr; ++i) {
    if (savedArgv[i] != nullptr) std::memset(savedArgv[i], 0, std::strlen(savedArgv[i]));
  }
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) std::memset(*e, 0, std::strlen(*e));
}

}  // namespace moat
