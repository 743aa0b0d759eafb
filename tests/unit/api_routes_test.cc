// The route table: how a method and path find their handler, and that the
// table and api/openapi.yaml list the same endpoints.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "api/api.h"
#include "api/routes.h"

#ifndef MOAT_SOURCE_DIR
#error "MOAT_SOURCE_DIR must be defined by tests/unit/CMakeLists.txt"
#endif

namespace moat::api {
namespace {

HttpResponse answer(Api&, const HttpRequest&, const Principal&, const PathParams&) { return {}; }

const std::vector<Route> kTable = {
    {"GET", "/v1/things", "read", false, true, answer},
    {"POST", "/v1/things", "create", false, true, answer},
    {"GET", "/v1/things/{id}", "read", true, false, answer},
    {"PUT", "/v1/things/{id}", "read", true, false, answer},
    {"DELETE", "/v1/things/{id}", "destroy", true, false, answer},
    {"*", "/v1/any", "", false, true, answer},
    {"GET", "/v1/things/{id}/parts/{part}", "read", true, true, answer},
};

TEST(ApiRoutes, AMethodAndPathFindTheirRowAndWhatItsPatternMatched) {
  auto m = findRoute(kTable, "DELETE", "/v1/things/abc");
  ASSERT_NE(m.route, nullptr);
  EXPECT_STREQ(m.route->scope, "destroy");
  EXPECT_EQ(m.params, (PathParams{{"id", "abc"}}));
  m = findRoute(kTable, "GET", "/v1/things/abc/parts/7");
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.params, (PathParams{{"id", "abc"}, {"part", "7"}}));
  m = findRoute(kTable, "POST", "/v1/things/");  // a trailing slash is the same path
  ASSERT_NE(m.route, nullptr);
  EXPECT_STREQ(m.route->scope, "create");
  m = findRoute(kTable, "PATCH", "/v1/any");  // "*": the handler takes every method
  ASSERT_NE(m.route, nullptr);
}

TEST(ApiRoutes, ALastRestPatternTakesNoneOneOrMoreSegments) {
  const std::vector<Route> table = {{"*", "/v1/boxes/{id}/ports/{port}/{path...}", "ports", true, true, answer}};
  auto m = findRoute(table, "PATCH", "/v1/boxes/abc/ports/80/a/b/c.html");
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.params, (PathParams{{"id", "abc"}, {"port", "80"}, {"path", "a/b/c.html"}}));
  m = findRoute(table, "GET", "/v1/boxes/abc/ports/80");
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.params.at("path"), "");
  m = findRoute(table, "GET", "/v1/boxes/abc/ports/80/");
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(findRoute(table, "GET", "/v1/boxes/abc/ports").route, nullptr) << "the port is not optional";
  EXPECT_EQ(findRoute(table, "GET", "/v1/boxes/abc/other/80/x").route, nullptr);
}

TEST(ApiRoutes, AKnownPathWithAnotherMethodListsTheMethodsItHas) {
  auto m = findRoute(kTable, "PATCH", "/v1/things/abc");
  EXPECT_EQ(m.route, nullptr);
  EXPECT_EQ(m.allowed, (std::vector<std::string>{"GET", "PUT", "DELETE"}));
  EXPECT_EQ(methodList(m.allowed), "GET, PUT or DELETE");
  EXPECT_EQ(methodList({"GET", "POST"}), "GET or POST");
  EXPECT_EQ(methodList({"GET"}), "GET");
}

TEST(ApiRoutes, NoPatternMatchesAnUnknownPathOrAnEmptySegment) {
  for (const char* path : {"/v1/thing", "/v1/things/abc/parts", "/v1/things//parts/7", "/v1/things/a/b", "",
                           "v1/things", "/", "/v1/things/abc/parts/7/x", "/v1/anything"}) {
    auto m = findRoute(kTable, "GET", path);
    EXPECT_EQ(m.route, nullptr) << path;
    EXPECT_TRUE(m.allowed.empty()) << path;
  }
}

// Each "METHOD path" api/openapi.yaml declares ({name} as the spec names it).
std::set<std::string> declaredEndpoints() {
  std::ifstream in(std::string(MOAT_SOURCE_DIR) + "/api/openapi.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::set<std::string> out;
  std::string line, path;
  bool inPaths = false;
  const std::regex pathLine(R"(^  (/[^:]*):\s*$)"), methodLine(R"(^    (get|put|post|delete|patch):\s*$)");
  while (std::getline(text, line)) {
    if (!line.empty() && line[0] != ' ' && line[0] != '#') {  // a top-level key
      inPaths = line.rfind("paths:", 0) == 0;
      continue;
    }
    std::smatch m;
    if (!inPaths) continue;
    if (std::regex_match(line, m, pathLine)) {
      path = m[1];
    } else if (std::regex_match(line, m, methodLine) && !path.empty()) {
      std::string method = m[1];
      for (auto& c : method) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      out.insert(method + " " + path);
    }
  }
  return out;
}

TEST(ApiRoutes, TheTableServesWhatOpenapiDeclaresAndNothingElse) {
  const auto declared = declaredEndpoints();
  ASSERT_GT(declared.size(), 30u) << "api/openapi.yaml read wrong";
  std::set<std::string> served;
  for (const Route& r : Api::routes()) {
    // /mcp speaks MCP's Streamable HTTP (docs/MCP.md), not this API.
    if (std::string(r.pattern) == "/mcp") continue;
    // The spec names a last {name...} (the rest of the path) as {name}.
    std::string pattern = std::regex_replace(std::string(r.pattern), std::regex(R"(\{(\w+)\.\.\.\}$)"), "{$1}");
    if (std::string(r.method) == "*") {
      // Any method (the port proxy): the spec lists those it documents.
      size_t listed = 0;
      for (const auto& e : declared) {
        if (e.substr(e.find(' ') + 1) == pattern) served.insert(e), ++listed;
      }
      EXPECT_GT(listed, 0u) << "routed but not declared: " << pattern;
      continue;
    }
    served.insert(std::string(r.method) + " " + pattern);
  }
  for (const auto& e : declared) EXPECT_TRUE(served.count(e)) << "declared but not routed: " << e;
  for (const auto& e : served) EXPECT_TRUE(declared.count(e)) << "routed but not declared: " << e;
}

TEST(ApiRoutes, RowsOfOnePatternStayTogetherAndEveryEnvironmentIdIsOwned) {
  std::set<std::string> seen;
  std::string previous;
  for (const Route& r : Api::routes()) {
    const std::string pattern = r.pattern;
    if (pattern != previous) {
      EXPECT_TRUE(seen.insert(pattern).second) << pattern << " is split: findRoute would miss its later rows";
    }
    previous = pattern;
    // A key reaches only its own environments: every row under one checks it.
    if (pattern.rfind("/v1/environments/{id}", 0) == 0) {
      EXPECT_TRUE(r.ownedEnvironment) << r.method << " " << pattern;
    }
    EXPECT_NE(r.handler, nullptr);
  }
}

}  // namespace
}  // namespace moat::api
