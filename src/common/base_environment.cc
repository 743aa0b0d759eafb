#include "common/base_environment.h"

namespace moat {

std::vector<std::string> baseEnvironment(const std::string& hostname, const std::string& cwd) {
  return {
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "HOME=/root",
      "USER=root",
      "LOGNAME=root",
      "SHELL=/bin/sh",
      "LANG=C.UTF-8",
      "TERM=xterm-256color",
      "HOSTNAME=" + hostname,
      "PWD=" + cwd,
  };
}

}  // namespace moat
