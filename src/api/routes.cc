#include "api/routes.h"

#include <algorithm>

namespace moat::api {

namespace {

std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 1;  // after the leading "/"
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    out.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  if (out.size() > 1 && out.back().empty()) out.pop_back();  // "/v1/keys/" is "/v1/keys"
  return out;
}

bool matches(const std::vector<std::string>& pattern, const std::vector<std::string>& path, PathParams& params) {
  if (pattern.size() != path.size()) return false;
  PathParams found;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const std::string& p = pattern[i];
    if (p.size() > 2 && p.front() == '{' && p.back() == '}') {
      if (path[i].empty()) return false;
      found[p.substr(1, p.size() - 2)] = path[i];
    } else if (p != path[i]) {
      return false;
    }
  }
  params = std::move(found);
  return true;
}

}  // namespace

RouteMatch findRoute(const std::vector<Route>& table, const std::string& method, const std::string& path) {
  RouteMatch match;
  if (path.empty() || path[0] != '/') return match;
  const auto parts = segments(path);
  const char* matchedPattern = nullptr;
  for (const Route& route : table) {
    // Rows of one pattern follow each other: the first pattern that matches
    // is the path's.
    if (matchedPattern != nullptr && std::string(route.pattern) != matchedPattern) continue;
    PathParams params;
    if (matchedPattern == nullptr && !matches(segments(route.pattern), parts, params)) continue;
    if (matchedPattern == nullptr) {
      matchedPattern = route.pattern;
      match.params = std::move(params);
    }
    if (route.method == method || std::string(route.method) == "*") {
      match.route = &route;
      match.allowed.clear();
      return match;
    }
    match.allowed.push_back(route.method);
  }
  return match;
}

std::string methodList(const std::vector<std::string>& methods) {
  std::string out;
  for (size_t i = 0; i < methods.size(); ++i) {
    if (i > 0) out += i + 1 == methods.size() ? " or " : ", ";
    out += methods[i];
  }
  return out;
}

}  // namespace moat::api
