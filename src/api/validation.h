#pragma once

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "api/http.h"
#include "backend/backend.h"
#include "common/result.h"

// What every API resource uses to answer and to validate what it was sent:
// errors name the offending field, unknown fields and parameters are errors.
namespace moat::api {

using json = nlohmann::json;

struct ApiError {
  int status;
  std::string code;
  std::string message;
  std::string field;
};

HttpResponse respond(int status, const json& body);
HttpResponse noContent();
HttpResponse errorResponse(const ApiError& e);
HttpResponse wrongMethod(const HttpRequest& req, const char* allowed);
ApiError invalid(const std::string& field, const std::string& message);
// The HTTP status an error answers with: one table for every code (what is
// not the client's doing is 500, its code naming it).
int httpStatus(Code code);
// An error as the API answers it: its status, code name and message.
ApiError fromError(const Error& e);
std::string timestamp(int64_t ms);

// The body as a JSON object (an empty body is {}); `err` says what is wrong.
Result<json> parseObject(const std::string& body, ApiError& err);
std::optional<ApiError> onlyFields(const json& j, std::initializer_list<const char*> allowed,
                                   const std::string& prefix);
std::optional<ApiError> stringMap(const json& j, const std::string& field, bool envNames,
                                  std::map<std::string, std::string>& out);
std::optional<ApiError> absolutePath(const json& j, const std::string& field, std::string& out);
// argv: a non-empty array of strings without NUL, bounded in count and size.
std::optional<ApiError> commandLine(const json& j, const std::string& field, std::vector<std::string>& out);
std::optional<ApiError> onlyQuery(const HttpRequest& req, std::initializer_list<const char*> allowed);
std::optional<ApiError> queryNumber(const HttpRequest& req, const char* name, uint64_t max, int base, uint64_t& out);
std::optional<ApiError> queryFlag(const HttpRequest& req, const char* name, bool& out);
// A snapshot id ("snap-" and 12 hex digits) in body[field], required.
std::optional<ApiError> snapshotField(const json& body, const char* field, std::string& out);
// An environment's resources: a create's `spec` object, or a warm pool's
// (moatd --warm-pool). 0: the default.
struct SpecFields {
  double cpus = 0;
  uint64_t ramMb = 0;
  double storageGb = 0;
  uint64_t pids = 0;
  std::optional<backend::Isolation> isolation;  // a create's only
};
// Reads cpus, ram_mb (at most maxRamMb), storage_gb and pids from `spec`
// (fields named "<prefix>cpus" etc. in errors), and `isolation` where
// `withIsolation`; absent ones keep their value.
std::optional<ApiError> specFields(const json& spec, const std::string& prefix, double maxRamMb, SpecFields& out,
                                   bool withIsolation = false);

// The index-th segment of a path ("/v1/environments/x" -> 0 "v1", 1 "environments", 2 "x").
std::string pathSegment(const std::string& path, size_t index);

template <class T>
std::optional<ApiError> number(const json& j, const std::string& field, double min, double max, bool whole, T& out) {
  if (!j.is_number() || (whole && !j.is_number_integer())) {
    return invalid(field, whole ? "must be a whole number" : "must be a number");
  }
  double v = j.get<double>();
  if (!std::isfinite(v) || v < min || v > max) {
    std::ostringstream range;
    range << "out of range (" << min << " to " << max << ")";
    return invalid(field, range.str());
  }
  out = static_cast<T>(v);
  return std::nullopt;
}

}  // namespace moat::api
