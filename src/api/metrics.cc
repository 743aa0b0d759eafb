#include "api/metrics.h"

#include <cstdio>
#include <sstream>

namespace moat::api {

namespace {

// A Prometheus label value: backslash, quote and newline escaped.
std::string labelValue(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\\' ? "\\\\" : c == '"' ? "\\\"" : c == '\n' ? "\\n" : std::string(1, c);
  return out;
}

std::string poolLabels(const manager::WarmPool& p) {
  char numbers[160];
  std::snprintf(numbers, sizeof numbers, "\",cpus=\"%g\",ram_mb=\"%llu\",storage_gb=\"%g\",pids=\"%llu\"", p.cpus,
                static_cast<unsigned long long>(p.ramMb), p.storageGb, static_cast<unsigned long long>(p.pids));
  return "{template=\"" + labelValue(p.templateName) + numbers + ",isolation=\"" +
         backend::isolationName(p.isolation.value_or(backend::Isolation::kNamespaces)) + "\"}";
}

}  // namespace

void ApiMetrics::countError(const std::string& code) {
  std::lock_guard<std::mutex> lock(errorsMutex_);
  ++errors_[code];
}

void ApiMetrics::observeExec(double seconds) {
  size_t bucket = 0;
  while (bucket < kBuckets.size() && seconds > kBuckets[bucket]) ++bucket;
  ++execBuckets_[bucket];
  execMicros_ += static_cast<uint64_t>(seconds * 1e6);
  ++execCount_;
}

std::string ApiMetrics::render(const manager::Counters& counters) {
  std::ostringstream out;
  out << "# HELP moat_environments Environments by state.\n# TYPE moat_environments gauge\n";
  for (const char* state : {"creating", "running", "paused", "destroying", "failed"}) {
    auto it = counters.byState.find(state);
    out << "moat_environments{state=\"" << state << "\"} " << (it == counters.byState.end() ? 0 : it->second) << "\n";
  }
  out << "# HELP moat_warm_pool_ready Warm environments ready to be claimed.\n# TYPE moat_warm_pool_ready gauge\n";
  out << "moat_warm_pool_ready " << counters.warmReady << "\n";
  out << "# HELP moat_warm_pool_claims_total Creates served from the warm pool.\n# TYPE moat_warm_pool_claims_total "
         "counter\n";
  out << "moat_warm_pool_claims_total " << counters.warmClaims << "\n";
  if (!counters.warmPools.empty()) {
    out << "# HELP moat_warm_pool_ready_by_spec Warm environments ready to be claimed, per pool.\n"
           "# TYPE moat_warm_pool_ready_by_spec gauge\n";
    for (const auto& p : counters.warmPools) {
      out << "moat_warm_pool_ready_by_spec" << poolLabels(p.spec) << " " << p.ready << "\n";
    }
    out << "# HELP moat_warm_pool_claims_by_spec_total Creates served from each warm pool.\n"
           "# TYPE moat_warm_pool_claims_by_spec_total counter\n";
    for (const auto& p : counters.warmPools) {
      out << "moat_warm_pool_claims_by_spec_total" << poolLabels(p.spec) << " " << p.claims << "\n";
    }
  }
  out << "# HELP moat_exec_total Commands run through the exec API.\n# TYPE moat_exec_total counter\n";
  out << "moat_exec_total " << execCount_.load() << "\n";
  out << "# HELP moat_exec_duration_seconds Exec latency.\n# TYPE moat_exec_duration_seconds histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += execBuckets_[i];
    out << "moat_exec_duration_seconds_bucket{le=\"" << kBuckets[i] << "\"} " << cumulative << "\n";
  }
  cumulative += execBuckets_[kBuckets.size()];
  out << "moat_exec_duration_seconds_bucket{le=\"+Inf\"} " << cumulative << "\n";
  out << "moat_exec_duration_seconds_sum " << execMicros_.load() / 1e6 << "\n";
  out << "moat_exec_duration_seconds_count " << execCount_.load() << "\n";
  out << "# HELP moat_api_requests_waiting Requests waiting for their turn under their key's rate limit.\n"
         "# TYPE moat_api_requests_waiting gauge\n";
  out << "moat_api_requests_waiting " << waiting_.load() << "\n";
  out << "# HELP moat_api_errors_total API error responses by code.\n# TYPE moat_api_errors_total counter\n";
  std::lock_guard<std::mutex> lock(errorsMutex_);
  for (const auto& [code, n] : errors_) out << "moat_api_errors_total{code=\"" << code << "\"} " << n << "\n";
  return out.str();
}

std::string ApiMetrics::renderEnvironments(const std::vector<EnvironmentUsage>& usages, size_t omitted) {
  std::ostringstream out;
  out.precision(15);  // bytes as whole numbers, not 5.25886e+07
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    for (const auto& e : usages) {
      auto v = value(e);
      if (v < 0) continue;  // not known on this host
      out << name << "{id=\"" << labelValue(e.id) << "\"} " << v << "\n";
    }
  };
  family("moat_environment_cpu_seconds_total", "counter", "CPU time a running environment has used.",
         [](const EnvironmentUsage& e) { return e.usage.cpuKnown ? e.usage.cpuUsec / 1e6 : -1.0; });
  family("moat_environment_memory_bytes", "gauge", "Memory a running environment's cgroup holds.",
         [](const EnvironmentUsage& e) { return static_cast<double>(e.usage.memoryBytes); });
  family("moat_environment_memory_limit_bytes", "gauge", "A running environment's memory limit.",
         [](const EnvironmentUsage& e) { return static_cast<double>(e.memoryLimitBytes); });
  family("moat_environment_pids", "gauge", "Processes and threads in a running environment.",
         [](const EnvironmentUsage& e) { return static_cast<double>(e.usage.pids); });
  family("moat_environment_oom_kills_total", "counter", "Processes the kernel killed in an environment out of memory.",
         [](const EnvironmentUsage& e) { return static_cast<double>(e.usage.oomKills); });
  family("moat_environment_storage_bytes", "gauge", "Bytes a running environment's writable layer holds on the host.",
         [](const EnvironmentUsage& e) {
           return e.usage.storageKnown ? static_cast<double>(e.usage.storageBytes) : -1.0;
         });
  family("moat_environment_storage_limit_bytes", "gauge", "A running environment's storage limit.",
         [](const EnvironmentUsage& e) { return static_cast<double>(e.storageLimitBytes); });
  family("moat_environment_network_sent_bytes_total", "counter",
         "Bytes a running environment has sent over its network link.", [](const EnvironmentUsage& e) {
           return e.usage.networkKnown ? static_cast<double>(e.usage.networkSentBytes) : -1.0;
         });
  family("moat_environment_network_received_bytes_total", "counter",
         "Bytes a running environment has received over its network link.", [](const EnvironmentUsage& e) {
           return e.usage.networkKnown ? static_cast<double>(e.usage.networkReceivedBytes) : -1.0;
         });
  out << "# HELP moat_environment_series_omitted Running environments without series here (beyond "
      << kMaxEnvironmentSeries << ").\n# TYPE moat_environment_series_omitted gauge\nmoat_environment_series_omitted "
      << omitted << "\n";
  return out.str();
}

}  // namespace moat::api
