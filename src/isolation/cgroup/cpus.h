#pragma once

#include <string>
#include <vector>

#include "common/result.h"

// Which CPUs an environment's processes are given, so that what sizes
// itself by them (nproc, sched_getaffinity, a build's -j, a JVM's thread
// pools) sees about as many as its CPU limit allows.
namespace moat::isolation::cgroup {

// "0-3,8,10-11" (cpuset.cpus, /sys/devices/system/cpu/online) to CPU
// numbers, ascending; an empty text is no CPU.
Result<std::vector<int>> parseCpuList(const std::string& text);
// The inverse, with ranges joined: {0,1,2,5} -> "0-2,5".
std::string formatCpuList(const std::vector<int>& cpus);

// ceil(cpus) of `allowed` (the creator's CPUs, ascending), starting at
// `allowed[start % allowed.size()]` and wrapping around, so that
// consecutive environments land on different CPUs; returned ascending.
// Empty (no restriction) when cpus is 0 (unlimited) or asks for every
// allowed CPU.
std::vector<int> chooseCpus(const std::vector<int>& allowed, double cpus, unsigned start);

}  // namespace moat::isolation::cgroup
