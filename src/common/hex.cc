#include "common/hex.h"

#include <sys/random.h>

#include <vector>

namespace moat {

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string toHex(const unsigned char* data, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 15]);
  }
  return out;
}

Result<std::string> randomBytes(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno("getrandom");
    }
    got += static_cast<size_t>(n);
  }
  return raw;
}

Result<std::string> randomHex(size_t bytes) {
  MOAT_ASSIGN(std::string raw, randomBytes(bytes));
  return toHex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

}  // namespace moat
