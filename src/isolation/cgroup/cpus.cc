#include "isolation/cgroup/cpus.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace moat::isolation::cgroup {
namespace {

constexpr int kMaxCpu = 1 << 16;

Result<int> cpuNumber(const std::string& text, const std::string& list) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 5) {
    return Error::make(Code::kInvalidArgument, "bad CPU list: " + list);
  }
  int n = std::atoi(text.c_str());
  if (n >= kMaxCpu) return Error::make(Code::kInvalidArgument, "bad CPU list: " + list);
  return n;
}

}  // namespace

Result<std::vector<int>> parseCpuList(const std::string& text) {
  std::string list = text;
  while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.pop_back();
  std::vector<int> cpus;
  for (size_t i = 0; i < list.size();) {
    size_t comma = std::min(list.find(',', i), list.size());
    std::string item = list.substr(i, comma - i);
    i = comma + 1;
    size_t dash = item.find('-');
    MOAT_ASSIGN(int first, cpuNumber(item.substr(0, dash), text));
    int last = first;
    if (dash != std::string::npos) {
      MOAT_ASSIGN(last, cpuNumber(item.substr(dash + 1), text));
    }
    if (last < first) return Error::make(Code::kInvalidArgument, "bad CPU list: " + text);
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string formatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> chooseCpus(const std::vector<int>& allowed, double cpus, unsigned start) {
  if (cpus <= 0 || allowed.empty()) return {};
  double wanted = std::ceil(cpus - 1e-9);
  if (wanted >= static_cast<double>(allowed.size())) return {};
  auto count = static_cast<size_t>(wanted);
  std::vector<int> chosen;
  for (size_t i = 0; i < count; ++i) chosen.push_back(allowed[(start + i) % allowed.size()]);
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace moat::isolation::cgroup
