// The API over the environment manager and a recording fake backend (real
// moat-init processes, no namespaces) with a real SQLite store: requests
// go through Api::handle as moatd's HTTP server hands them over, without
// root and without a socket.
#include "api/api.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "fake_backend.h"
#include "os/file.h"

namespace moat::api {
namespace {

using nlohmann::json;

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/moat-api-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    auto store = store::openSqliteStore(dir_ + "/moat.db");
    ASSERT_TRUE(store.ok()) << store.error().message();
    store_ = std::move(store.value());
    manager::ManagerConfig config;
    config.stateDir = dir_;
    config.maxTotalMemoryMb = 64 * 1024;
    manager_ = std::make_unique<manager::EnvironmentManager>(config, *store_, backend_);
    keys_ = std::make_unique<Keys>(*store_);
    approvals_ = std::make_unique<gate::ApprovalCenter>(*store_);
    ApiOptions options;
    options.stateDir = dir_;
    api_ = std::make_unique<Api>(*manager_, *keys_, *approvals_, kMaster, options);
    Api& api = *api_;
    manager_->setExecGate(
        [&api](const std::string& id, const init::ExecCheck& check, manager::InitConnection::ExecAnswer answer) {
          api.execCheck(id, check, std::move(answer));
        },
        [&api](const std::string& id) { return api.execPolicyFor(id); },
        [&api](const std::string& id, const init::ExecReport& report) { api.execReport(id, report); });
  }
  void TearDown() override {
    // In moatd's order: the API goes before the manager, which destroys
    // what still runs.
    if (manager_) manager_->setExecGate({}, {}, {});
    api_.reset();
    manager_.reset();
    (void)os::removeTree(dir_);
  }

  struct Answer {
    int status = 0;
    json body;
  };
  Answer call(const std::string& method, const std::string& target, const json& body = nullptr,
              const std::string& token = kMaster) {
    HttpRequest request;
    request.method = method;
    parseTarget(target, request);
    if (!body.is_null()) request.body = body.dump();
    request.authorization = "Bearer " + token;
    HttpResponse response = api_->handle(request);
    return {response.status, json::parse(response.body.empty() ? "null" : response.body, nullptr, false)};
  }
  static std::string message(const Answer& a) {
    return a.body.is_object() && a.body.contains("error") ? a.body["error"].value("message", "") : a.body.dump();
  }
  std::string keyWith(const std::vector<std::string>& scopes) {
    auto created = keys_->create("test", scopes, "");
    EXPECT_TRUE(created.ok());
    return created.ok() ? created->token : "";
  }

  static constexpr const char* kMaster = "the-master-token";
  std::string dir_;
  std::unique_ptr<store::Store> store_;
  test::FakeBackend backend_;  // after the store: the manager goes first
  std::unique_ptr<manager::EnvironmentManager> manager_;
  std::unique_ptr<Keys> keys_;
  std::unique_ptr<gate::ApprovalCenter> approvals_;
  std::unique_ptr<Api> api_;
};

TEST_F(ApiTest, AnEnvironmentCreatedThroughTheApiRunsCommandsAndIsGoneOnceDeleted) {
  auto created = call("POST", "/v1/environments", {{"spec", {{"ram_mb", 256}}}, {"labels", {{"team", "a"}}}});
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string id = created.body["id"];
  EXPECT_EQ(created.body["state"], "running");
  EXPECT_TRUE(backend_.runs(id));
  ASSERT_EQ(backend_.calls("create").size(), 1u);
  EXPECT_EQ(backend_.calls("create")[0].spec.memoryMb, 256u);

  auto ran = call("POST", "/v1/environments/" + id + "/exec", {{"cmd", {"/bin/sh", "-c", "echo hi"}}, {"cwd", "/"}});
  ASSERT_EQ(ran.status, 200) << ran.body;
  EXPECT_EQ(ran.body["stdout"], "hi\n");
  EXPECT_EQ(ran.body["exit_code"], 0);

  auto listed = call("GET", "/v1/environments?label=team=a");
  ASSERT_EQ(listed.status, 200);
  ASSERT_EQ(listed.body["environments"].size(), 1u);
  EXPECT_EQ(listed.body["environments"][0]["id"], id);

  EXPECT_EQ(call("DELETE", "/v1/environments/" + id).status, 204);
  EXPECT_FALSE(backend_.runs(id));
  auto gone = call("GET", "/v1/environments/" + id);
  ASSERT_EQ(gone.status, 200);
  EXPECT_EQ(gone.body["state"], "gone");
}

TEST_F(ApiTest, TheRouteTableAnswersUnknownPathsAndMethodsBeforeAnyHandler) {
  auto unknown = call("GET", "/v1/nothing-here");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(message(unknown), "no such endpoint: /v1/nothing-here");
  auto wrong = call("PATCH", "/v1/environments");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.body["error"]["code"], "method_not_allowed");
  EXPECT_EQ(message(wrong), "PATCH /v1/environments: use GET or POST");
  EXPECT_EQ(message(call("POST", "/v1/environments/abc/files")),
            "POST /v1/environments/abc/files: use GET, PUT or DELETE");
  EXPECT_TRUE(backend_.calls().empty());
}

TEST_F(ApiTest, AKeyWithoutTheScopeIsRefusedAndNothingHappens) {
  const std::string reader = keyWith({"read"});
  auto refused = call("POST", "/v1/environments", json::object(), reader);
  EXPECT_EQ(refused.status, 403);
  EXPECT_EQ(message(refused), "this key lacks the 'create' scope");
  EXPECT_TRUE(backend_.calls("create").empty());
  EXPECT_EQ(call("GET", "/v1/environments", nullptr, reader).status, 200);
  EXPECT_EQ(call("GET", "/v1/environments", nullptr, "moat_000000000000_not-a-key").status, 401);
}

TEST_F(ApiTest, AKeyReachesOnlyTheEnvironmentsItCreated) {
  auto mine = call("POST", "/v1/environments", json::object());
  ASSERT_EQ(mine.status, 201);
  const std::string masters = mine.body["id"];
  const std::string key = keyWith({"create", "read", "exec", "destroy", "files"});
  auto own = call("POST", "/v1/environments", json::object(), key);
  ASSERT_EQ(own.status, 201) << own.body;
  const std::string keys = own.body["id"];

  // Another's environment looks like none, on every route under it.
  for (const auto& [method, suffix] :
       std::vector<std::pair<std::string, std::string>>{{"GET", ""},
                                                        {"DELETE", ""},
                                                        {"POST", "/exec"},
                                                        {"GET", "/files?path=/etc/hostname"},
                                                        {"GET", "/processes"},
                                                        {"GET", "/stats"}}) {
    json body = method == "POST" ? json{{"cmd", {"/bin/true"}}} : json(nullptr);
    auto r = call(method, "/v1/environments/" + masters + suffix, body, key);
    EXPECT_EQ(r.status, 404) << method << " " << suffix << ": " << r.body;
    EXPECT_EQ(message(r), "no environment " + masters);
  }
  EXPECT_TRUE(backend_.runs(masters));
  auto listed = call("GET", "/v1/environments", nullptr, key);
  ASSERT_EQ(listed.body["environments"].size(), 1u);
  EXPECT_EQ(listed.body["environments"][0]["id"], keys);
  EXPECT_EQ(call("GET", "/v1/environments/" + keys, nullptr, key).status, 200);
  EXPECT_EQ(call("DELETE", "/v1/environments/" + keys, nullptr, key).status, 204);
}

TEST_F(ApiTest, AQueryParameterARouteDoesNotTakeIsAnErrorNamingIt) {
  auto created = call("POST", "/v1/environments", json::object());
  ASSERT_EQ(created.status, 201);
  const std::string id = created.body["id"];
  auto r = call("GET", "/v1/environments/" + id + "?verbose=1");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["code"], "unknown_field");
  EXPECT_NE(message(r).find("verbose"), std::string::npos) << r.body;
  auto bad = call("GET", "/v1/environments?state=sleeping");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["error"]["field"], "state");
}

TEST_F(ApiTest, StatsAreTheBackendsCountsBesideTheSpecAndNoneOnceGone) {
  auto created = call("POST", "/v1/environments", {{"spec", {{"ram_mb", 256}, {"pids", 32}, {"cpus", 0.5}}}});
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string id = created.body["id"];
  backend::Usage usage;
  usage.cpuKnown = true;
  usage.cpuUsec = 1234;
  usage.memoryBytes = 5 << 20;
  usage.pids = 3;
  usage.oomKills = 1;
  backend_.setUsage(usage);
  auto stats = call("GET", "/v1/environments/" + id + "/stats");
  ASSERT_EQ(stats.status, 200) << stats.body;
  EXPECT_EQ(stats.body["cpu_usec"], 1234);
  EXPECT_EQ(stats.body["memory_bytes"], 5 << 20);
  EXPECT_EQ(stats.body["memory_limit_bytes"], 256 << 20);
  EXPECT_EQ(stats.body["pids"], 3);
  EXPECT_EQ(stats.body["pids_limit"], 32);
  EXPECT_EQ(stats.body["cpus"], 0.5);
  EXPECT_EQ(stats.body["oom_kills"], 1);

  usage.cpuKnown = false;  // a host that cannot count CPU time says so
  backend_.setUsage(usage);
  EXPECT_TRUE(call("GET", "/v1/environments/" + id + "/stats").body["cpu_usec"].is_null());

  ASSERT_EQ(call("DELETE", "/v1/environments/" + id).status, 204);
  size_t asked = backend_.calls("usage").size();
  auto gone = call("GET", "/v1/environments/" + id + "/stats");
  EXPECT_EQ(gone.status, 409);
  EXPECT_EQ(message(gone), "environment " + id + " is gone (destroyed)");
  EXPECT_EQ(backend_.calls("usage").size(), asked) << "a gone environment's backend is not asked";
  EXPECT_EQ(call("GET", "/v1/environments/000000000000/stats").status, 404);
}

TEST_F(ApiTest, AKeysAgentRunMayNotCallAProviderOnMoatdsOwnHostOrUseItsVariables) {
  const std::string key = keyWith({"create", "read", "exec", "files", "destroy"});
  for (const std::string url : {"http://127.0.0.1:11434/v1", "http://localhost:8080/v1", "http://10.1.2.3/v1",
                                "http://169.254.169.254/latest", "http://[::1]:9000/v1"}) {
    auto r = call("POST", "/v1/agents",
                  {{"instruction", "hi"}, {"provider", {{"kind", "openai"}, {"model", "m"}, {"base_url", url}}}}, key);
    EXPECT_EQ(r.status, 403) << url << ": " << r.body;
    EXPECT_EQ(r.body["error"]["field"], "provider.base_url") << url;
  }
  ::setenv("MOAT_API_TEST_SECRET", "moatd's own", 1);
  auto env = call("POST", "/v1/agents",
                  {{"instruction", "hi"},
                   {"provider", {{"kind", "anthropic"}, {"model", "m"}, {"api_key_env", "MOAT_API_TEST_SECRET"}}}},
                  key);
  EXPECT_EQ(env.status, 403) << env.body;
  EXPECT_EQ(env.body["error"]["field"], "provider.api_key_env");
  EXPECT_TRUE(backend_.calls("create").empty()) << "nothing was made for a refused run";
  auto unknown =
      call("POST", "/v1/agents", {{"instruction", "hi"}, {"provider", {{"kind", "gemini"}, {"model", "m"}}}});
  EXPECT_EQ(unknown.status, 400);
  EXPECT_EQ(unknown.body["error"]["field"], "provider.kind");
}

}  // namespace
}  // namespace moat::api
