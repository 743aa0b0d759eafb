#include "api/routes.h"

#include <cstring>
#include <string_view>

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

// `pattern` against the path's segments, without copying the pattern: a
// "{name}" segment matches any non-empty one and names it.
bool matches(std::string_view pattern, const std::vector<std::string>& path, PathParams& params) {
  PathParams found;
  size_t i = 0;
  pattern.remove_prefix(1);  // the leading "/"
  for (;;) {
    const size_t slash = pattern.find('/');
    const std::string_view p = pattern.substr(0, slash);
    // A last "{name...}" takes the rest of the path: none, one or more segments.
    if (slash == std::string_view::npos && p.size() > 5 && p.front() == '{' && p.substr(p.size() - 4) == "...}") {
      std::string rest;
      for (size_t j = i; j < path.size(); ++j) rest += (j > i ? "/" : "") + path[j];
      found.emplace(std::string(p.substr(1, p.size() - 5)), rest);
      i = path.size();
      break;
    }
    if (i >= path.size()) return false;
    if (p.size() > 2 && p.front() == '{' && p.back() == '}') {
      if (path[i].empty()) return false;
      found.emplace(std::string(p.substr(1, p.size() - 2)), path[i]);
    } else if (p != path[i]) {
      return false;
    }
    ++i;
    if (slash == std::string_view::npos) break;
    pattern.remove_prefix(slash + 1);
  }
  if (i != path.size()) return false;
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
    if (matchedPattern != nullptr && std::strcmp(route.pattern, matchedPattern) != 0) continue;
    PathParams params;
    if (matchedPattern == nullptr && !matches(route.pattern, parts, params)) continue;
    if (matchedPattern == nullptr) {
      matchedPattern = route.pattern;
      match.params = std::move(params);
    }
    if (route.method == method || std::strcmp(route.method, "*") == 0) {
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
