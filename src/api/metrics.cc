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

}  // namespace moat::api
