// What GET /metrics shows: counters, the exec histogram, error codes, and
// pool labels escaped as Prometheus wants them.
#include <gtest/gtest.h>

#include "api/metrics.h"

namespace moat::api {
namespace {

bool has(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

TEST(ApiMetrics, ExecLatencyIsACumulativeHistogramWithSumAndCount) {
  ApiMetrics m;
  m.observeExec(0.0005);  // le 0.001
  m.observeExec(0.02);    // le 0.025
  m.observeExec(30);      // +Inf only
  const std::string text = m.render({});
  EXPECT_TRUE(has(text, "moat_exec_total 3")) << text;
  EXPECT_TRUE(has(text, "moat_exec_duration_seconds_bucket{le=\"0.001\"} 1")) << text;
  EXPECT_TRUE(has(text, "moat_exec_duration_seconds_bucket{le=\"0.01\"} 1")) << text;
  EXPECT_TRUE(has(text, "moat_exec_duration_seconds_bucket{le=\"0.025\"} 2")) << text;
  EXPECT_TRUE(has(text, "moat_exec_duration_seconds_bucket{le=\"10\"} 2")) << text;
  EXPECT_TRUE(has(text, "moat_exec_duration_seconds_bucket{le=\"+Inf\"} 3")) << text;
  EXPECT_TRUE(has(text, "moat_exec_duration_seconds_count 3")) << text;
  EXPECT_TRUE(has(text, "moat_exec_duration_seconds_sum 30.0205")) << text;
}

TEST(ApiMetrics, ErrorsAreCountedByCodeAndWaitersWhileTheyWait) {
  ApiMetrics m;
  m.countError("capacity");
  m.countError("capacity");
  m.countError("unauthorized");
  {
    auto one = m.waiting();
    auto two = m.waiting();
    EXPECT_TRUE(has(m.render({}), "moat_api_requests_waiting 2"));
  }
  const std::string text = m.render({});
  EXPECT_TRUE(has(text, "moat_api_requests_waiting 0")) << text;
  EXPECT_TRUE(has(text, "moat_api_errors_total{code=\"capacity\"} 2")) << text;
  EXPECT_TRUE(has(text, "moat_api_errors_total{code=\"unauthorized\"} 1")) << text;
}

TEST(ApiMetrics, EnvironmentStatesAndPoolsComeFromTheManagersCountersWithLabelsEscaped) {
  manager::Counters c;
  c.byState["running"] = 4;
  c.warmReady = 1;
  c.warmClaims = 7;
  manager::WarmPool pool;
  pool.templateName = "/srv/a \"b\"\\c\nd";
  pool.cpus = 0.5;
  pool.ramMb = 256;
  pool.storageGb = 2;
  pool.pids = 64;
  c.warmPools.push_back({pool, 1, 7});
  const std::string text = ApiMetrics().render(c);
  EXPECT_TRUE(has(text, "moat_environments{state=\"running\"} 4")) << text;
  EXPECT_TRUE(has(text, "moat_environments{state=\"failed\"} 0")) << text;
  EXPECT_TRUE(has(text, "moat_warm_pool_claims_total 7")) << text;
  EXPECT_TRUE(has(text,
                  "moat_warm_pool_ready_by_spec{template=\"/srv/a \\\"b\\\"\\\\c\\nd\",cpus=\"0.5\",ram_mb=\"256\","
                  "storage_gb=\"2\",pids=\"64\",isolation=\"namespaces\"} 1"))
      << text;
}

}  // namespace
}  // namespace moat::api
