#pragma once

#include <map>
#include <string>
#include <vector>

#include "api/http.h"
#include "api/keys.h"

// moatd's endpoints as one table (api/openapi.yaml describes each row):
// which method and path a handler serves, the key scope it needs, and
// whether its {id} is an environment that a key must own. The table, not
// each handler, answers unknown paths (404) and methods (405).
namespace moat::api {

class Api;

// What a pattern's {name} segments matched: "id" -> "4f2a...".
using PathParams = std::map<std::string, std::string>;

struct Route {
  const char* method;  // GET, POST, PUT or DELETE; "*": any (the handler answers 405 itself)
  // "/v1/environments/{id}/exec": a {name} matches one segment; a last
  // {name...} the rest of the path (none, one or more segments).
  const char* pattern;
  const char* scope;  // the scope a key needs; "": the handler decides who may
  // {id} names an environment: a key acts only on its own, and another's
  // looks like none (404), before the handler runs.
  bool ownedEnvironment;
  // The handler reads the query; otherwise any query parameter is an error.
  bool takesQuery;
  HttpResponse (*handler)(Api& api, const HttpRequest& request, const Principal& principal, const PathParams& params);
};

// The route for `method` and `path` (a trailing "/" ignored), and what its
// pattern matched. None: `allowed` lists the methods the path has (405), or
// is empty when no pattern matches the path (404).
struct RouteMatch {
  const Route* route = nullptr;
  PathParams params;
  std::vector<std::string> allowed;
};
RouteMatch findRoute(const std::vector<Route>& table, const std::string& method, const std::string& path);

// "GET", "GET or POST", "GET, PUT or DELETE".
std::string methodList(const std::vector<std::string>& methods);

}  // namespace moat::api
