#include "os/machine.h"

#include <fcntl.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <sys/reboot.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "common/unique_fd.h"

namespace moat::os {

Status loadKernelModule(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::fromErrno("open " + path);
  if (::syscall(SYS_finit_module, fd.get(), "", 0) != 0 && errno != EEXIST) {
    return Error::fromErrno("load module " + path);
  }
  return {};
}

void powerOff() {
  ::sync();
  ::reboot(RB_POWER_OFF);
}

Status addEntropy(const std::string& seed) {
  UniqueFd random(::open("/dev/urandom", O_WRONLY | O_CLOEXEC));
  if (!random) return Error::fromErrno("open /dev/urandom");
  std::vector<char> buffer(sizeof(rand_pool_info) + seed.size());
  auto* info = reinterpret_cast<rand_pool_info*>(buffer.data());
  info->entropy_count = static_cast<int>(seed.size() * 8);
  info->buf_size = static_cast<int>(seed.size());
  std::memcpy(info->buf, seed.data(), seed.size());
  if (::ioctl(random.get(), RNDADDENTROPY, info) != 0) return Error::fromErrno("RNDADDENTROPY");
  if (::ioctl(random.get(), RNDRESEEDCRNG) != 0) return Error::fromErrno("RNDRESEEDCRNG");
  return {};
}

Status setRealtime(uint64_t ns) {
  const timespec at = {static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
  if (::clock_settime(CLOCK_REALTIME, &at) != 0) return Error::fromErrno("clock_settime");
  return {};
}

}  // namespace moat::os
