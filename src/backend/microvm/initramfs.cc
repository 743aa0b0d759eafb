#include "backend/microvm/initramfs.h"

#include <sys/stat.h>

#include <cstdio>

namespace moat::backend::microvm {
namespace {

void pad4(std::string& out) {
  while (out.size() % 4 != 0) out.push_back('\0');
}

void append(std::string& out, uint32_t ino, const std::string& name, mode_t mode, const std::string& data,
            uint32_t rdevMajor, uint32_t rdevMinor) {
  char header[111];
  std::snprintf(header, sizeof header, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", ino,
                static_cast<unsigned>(mode), 0u, 0u, S_ISDIR(mode) ? 2u : 1u, 0u, static_cast<unsigned>(data.size()),
                0u, 0u, rdevMajor, rdevMinor, static_cast<unsigned>(name.size() + 1), 0u);
  out.append(header, 110);
  out.append(name);
  out.push_back('\0');
  pad4(out);
  out.append(data);
  pad4(out);
}

}  // namespace

std::string newcArchive(const std::vector<CpioEntry>& entries) {
  std::string out;
  uint32_t ino = 1;
  for (const auto& e : entries) {
    append(out, ino++, e.path, e.mode, S_ISREG(e.mode) ? e.data : std::string(), e.rdevMajor, e.rdevMinor);
  }
  append(out, 0, "TRAILER!!!", 0, "", 0, 0);
  return out;
}

}  // namespace moat::backend::microvm
