#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

// Preview URLs (docs/PORTS.md): http://<secret>.<preview domain>:<port>/
// opens a port inside one environment without moatd's token. The secret
// (128 random bits) is shown once; only its SHA-256 is kept, in memory:
// previews end at moatd's restart, at their expiry, when revoked, and when
// their environment ends.
namespace moat::api {

struct Preview {
  std::string id;  // "pv" + 12 hex digits: names it in the API, grants nothing
  std::string environment;
  uint16_t port = 0;
  std::string owner;  // who made it: "master" or a key id
  int64_t createdAtMs = 0;
  int64_t expiresAtMs = 0;
};

class Previews {
 public:
  static constexpr int64_t kDefaultTtlS = 3600;     // one hour
  static constexpr int64_t kMaxTtlS = 7 * 86400;    // a week
  static constexpr size_t kMaxPerEnvironment = 32;  // live ones; more is 429 capacity
  // `now`: unix milliseconds (tests pass their own clock).
  explicit Previews(std::function<int64_t()> now = nullptr);

  struct Created {
    Preview preview;
    std::string secret;  // 32 lowercase hex digits: the URL's first label
  };
  Result<Created> create(const std::string& environment, uint16_t port, int64_t ttlS, const std::string& owner);
  // The environment's live previews, oldest first.
  std::vector<Preview> list(const std::string& environment);
  // Revoked at once; none when the environment has no live preview `id`.
  std::optional<Preview> revoke(const std::string& environment, const std::string& id);
  // The environment ended: every preview of it goes (those revoked).
  std::vector<Preview> endEnvironment(const std::string& environment);
  // The key that made them was revoked: its previews go (those revoked).
  std::vector<Preview> endOwner(const std::string& owner);
  // The live preview a URL's secret opens, if any.
  std::optional<Preview> resolve(const std::string& secret);

 private:
  void dropExpiredLocked(int64_t now);
  std::vector<Preview> endWhere(const std::function<bool(const Preview&)>& ends);

  std::function<int64_t()> now_;
  std::mutex mutex_;
  std::map<std::string, Preview> bySecretHash_;
};

// The preview's secret in a Host header "<secret>.<domain>[:port]"; empty
// when the host is under `domain` but names no possible secret. nullopt
// when the host is not under `domain` at all (an API request).
std::optional<std::string> previewSecretOf(const std::string& host, const std::string& domain);

}  // namespace moat::api
