#include "os/security.h"

#include <linux/capability.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "os/file.h"

namespace moat::os {

int lastCapability() {
  auto text = readFile("/proc/sys/kernel/cap_last_cap");
  if (!text.ok()) return CAP_LAST_CAP;
  return std::stoi(text.value());
}

Status restrictCapabilities(const std::vector<int>& keep) {
  int last = lastCapability();
  for (int cap = 0; cap <= last; ++cap) {
    if (std::find(keep.begin(), keep.end(), cap) != keep.end()) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) {
      return Error::fromErrno("drop capability " + std::to_string(cap) + " from bounding set");
    }
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
    return Error::fromErrno("clear ambient capabilities");
  }
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (::syscall(SYS_capget, &header, data) != 0) return Error::fromErrno("capget");
  uint64_t keepMask = 0;
  for (int cap : keep) keepMask |= 1ULL << cap;
  for (int i = 0; i < 2; ++i) {
    uint32_t part = static_cast<uint32_t>(keepMask >> (32 * i));
    data[i].inheritable = 0;
    data[i].permitted &= part;
    data[i].effective &= part;
  }
  if (::syscall(SYS_capset, &header, data) != 0) return Error::fromErrno("capset");
  return {};
}

Status installSeccomp(const std::vector<sock_filter>& program, bool allThreads) {
  struct sock_fprog prog;
  prog.len = static_cast<unsigned short>(program.size());
  prog.filter = const_cast<sock_filter*>(program.data());
  unsigned int flags = allThreads ? SECCOMP_FILTER_FLAG_TSYNC : 0;
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog) != 0) {
    return Error::fromErrno("seccomp install");
  }
  return {};
}

int installSeccompInChild(const sock_fprog& program) {
  return ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) == 0 ? 0 : errno;
}

bool seccompUserNotifAvailable() {
  uint32_t action = SECCOMP_RET_USER_NOTIF;
  return ::syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action) == 0;
}

int landlockAbi() {
  long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return abi < 0 ? 0 : static_cast<int>(abi);
}

Result<bool> landlockScopeSelf() {
  // Debian 12's kernel headers predate scoping (ABI 6), so the ABI-6 layout
  // of the ruleset attribute is spelled out here.
  struct RulesetAttrV6 {
    uint64_t handledAccessFs;
    uint64_t handledAccessNet;
    uint64_t scoped;
  };
  constexpr uint64_t kScopeAbstractUnixSocket = 1ULL << 0;
  constexpr uint64_t kScopeSignal = 1ULL << 1;
  if (landlockAbi() < 6) return false;
  RulesetAttrV6 attr{0, 0, kScopeSignal | kScopeAbstractUnixSocket};
  long fd = ::syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
  if (fd < 0) return Error::fromErrno("landlock_create_ruleset");
  long rc = ::syscall(SYS_landlock_restrict_self, fd, 0);
  int err = errno;
  ::close(static_cast<int>(fd));
  if (rc != 0) return Error::fromErrno("landlock_restrict_self", err);
  return true;
}

int landlockRestrictInChild(int ruleset) { return ::syscall(SYS_landlock_restrict_self, ruleset, 0) == 0 ? 0 : errno; }

Result<UniqueFd> landlockFileRuleset(const std::vector<LandlockRule>& rules) {
  const int abi = landlockAbi();
  if (abi < 1) return Error::make(Code::kUnsupported, "this kernel has no Landlock");
  // The rights of ABI 1, then REFER (2), TRUNCATE (3), IOCTL_DEV (5).
  uint64_t handled = (1ULL << 13) - 1;
  if (abi >= 2) handled |= 1ULL << 13;
  if (abi >= 3) handled |= 1ULL << 14;
  if (abi >= 5) handled |= 1ULL << 15;
  constexpr uint64_t kFileRights = (1ULL << 0) | (1ULL << 1) | (1ULL << 2) | (1ULL << 14) | (1ULL << 15);
  struct {
    uint64_t handledAccessFs;
  } attr{handled};
  long fd = ::syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
  if (fd < 0) return Error::fromErrno("landlock_create_ruleset");
  UniqueFd ruleset(static_cast<int>(fd));
  for (const auto& rule : rules) {
    struct stat st;
    if (::fstat(rule.fd, &st) != 0) return Error::fromErrno("landlock rule");
    struct landlock_path_beneath_attr beneath {};
    beneath.parent_fd = rule.fd;
    beneath.allowed_access = rule.access & handled & (S_ISDIR(st.st_mode) ? ~0ULL : kFileRights);
    if (::syscall(SYS_landlock_add_rule, ruleset.get(), LANDLOCK_RULE_PATH_BENEATH, &beneath, 0) != 0) {
      return Error::fromErrno("landlock_add_rule");
    }
  }
  return ruleset;
}

}  // namespace moat::os
