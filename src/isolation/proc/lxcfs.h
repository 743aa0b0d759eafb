#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

// /proc files that show an environment's own limits, served by LXCFS
// (https://linuxcontainers.org/lxcfs/): a FUSE file system that answers a
// read of its meminfo, cpuinfo, stat, ... from the cgroup of the reader's
// pid 1. One lxcfs serves the whole host, at /run/moat/lxcfs, started by
// the first moat process that needs it and shared by every moatd and
// `moat run`; nothing of moat stops it (it holds no state worth ending:
// `umount /run/moat/lxcfs` does). Each environment gets read-only binds of
// its proc/ files over its own /proc/<name>, in a mount namespace that
// root inside cannot change.
namespace moat::isolation::proc {

struct LxcfsConfig {
  bool enabled = true;
  std::string binary;  // "": looked up in /usr/bin, /bin, /usr/sbin, /sbin
  std::string dir;     // the mount point; its lock, pid and log files beside it
};

// MOAT_LXCFS (off: no LXCFS; else the lxcfs binary to run) and
// MOAT_LXCFS_DIR (the mount point; default /run/moat/lxcfs).
LxcfsConfig lxcfsConfigFromEnvironment();
// The lxcfs program `config` runs (its binary, else the first of /usr/bin,
// /bin, /usr/sbin, /sbin with one), or an error saying what to install.
Result<std::string> lxcfsBinary(const LxcfsConfig& config);

// The files of LXCFS's proc/ that moat binds over /proc/<name>.
const std::vector<std::string>& lxcfsProcFiles();

// Makes sure a live lxcfs of use serves config.dir, starting one
// (detached, in its own session) when none does, or in place of one that
// died, that its pid file does not name (another pid namespace's), or that
// serves the host's values (its mount is detached first; a live one is
// left to end once nothing is bound to it). Host-wide: serialised by a lock file beside the
// mount point. Returns the lxcfs process's pid.
Result<pid_t> ensureLxcfs(const LxcfsConfig& config);

// Whether the lxcfs that wrote `log` (its stderr) answers with the readers'
// limits. It serves the host's own files instead when the set-up of its
// cgroup views failed ("Failed to run constructor", at start or at a reload
// by SIGUSR1), and after a SIGUSR2, which switches between the two modes
// (lxcfs(8)). ensureLxcfs replaces such an lxcfs.
bool lxcfsLogSaysVirtualizing(const std::string& log);

// A read-only copy of one LXCFS file to attach over `target` (/proc/<name>).
struct ProcFileTree {
  UniqueFd tree;
  std::string target;
};

// For one environment: detached copies of LXCFS's proc files (open_tree),
// from descriptors this process keeps while the lxcfs that serves them
// lives (one poll of its pidfd per call). Empty when LXCFS is off; an
// error when it cannot be had, tried again at most every 10 s meanwhile.
// Thread-safe.
Result<std::vector<ProcFileTree>> lxcfsProcTrees(const LxcfsConfig& config);

}  // namespace moat::isolation::proc
