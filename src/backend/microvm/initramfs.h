#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

// The initramfs a microVM guest boots: a cpio archive in the kernel's
// "newc" format (Documentation/driver-api/early-userspace/buffer-format.rst),
// uncompressed (the kernel reads it without a decompressor).
namespace moat::backend::microvm {

struct CpioEntry {
  std::string path;                       // without a leading "/": "init", "dev/console"
  mode_t mode = 0;                        // type and permission bits: S_IFDIR | 0755, S_IFREG | 0755, S_IFCHR | 0600
  std::string data;                       // a regular file's contents
  uint32_t rdevMajor = 0, rdevMinor = 0;  // a device's
};

// The archive of `entries`, in order (a directory before what is in it),
// owned by root, with the trailer.
std::string newcArchive(const std::vector<CpioEntry>& entries);

}  // namespace moat::backend::microvm
