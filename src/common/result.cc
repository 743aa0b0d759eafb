#include "common/result.h"

#include <cstring>

namespace moat {

std::string Error::message() const {
  if (sysErrno == 0) return context;
  return context + ": " + std::strerror(sysErrno);
}

}  // namespace moat
