#include "api/auth.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "common/hex.h"
#include "os/file.h"

namespace moat::api {

Result<std::string> loadOrCreateMasterToken(const std::string& stateDir) {
  std::string path = stateDir + "/master-token";
  if (os::exists(path)) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      return Error::make(Code::kInsecure, path + " is readable by others; chmod 600 it");
    }
    MOAT_ASSIGN(std::string token, os::readFile(path));
    while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
    if (token.size() < 32) return Error::make(Code::kInvalidArgument, path + " holds no usable token");
    return token;
  }
  MOAT_ASSIGN(std::string token, randomHex(32));
  std::string tmp = path + ".new";
  MOAT_TRY(os::writeFile(tmp, token + "\n", 0600));
  ::chmod(tmp.c_str(), 0600);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Error::fromErrno("rename " + tmp);
  return token;
}

bool constantTimeEquals(const std::string& a, const std::string& b) {
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

std::string bearerToken(const std::string& authorization) {
  const std::string prefix = "Bearer ";
  if (authorization.size() <= prefix.size() || authorization.compare(0, prefix.size(), prefix) != 0) {
    return "";
  }
  return authorization.substr(prefix.size());
}

}  // namespace moat::api
