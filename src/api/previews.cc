#include "api/previews.h"

#include <algorithm>

#include "api/keys.h"
#include "common/clock.h"
#include "common/hex.h"

namespace moat::api {

Previews::Previews(std::function<int64_t()> now) : now_(now ? std::move(now) : std::function<int64_t()>(nowMs)) {}

void Previews::dropExpiredLocked(int64_t now) {
  std::erase_if(bySecretHash_, [now](const auto& entry) { return entry.second.expiresAtMs <= now; });
}

Result<Previews::Created> Previews::create(const std::string& environment, uint16_t port, int64_t ttlS,
                                           const std::string& owner) {
  MOAT_ASSIGN(std::string secret, randomHex(16));
  MOAT_ASSIGN(std::string id, randomHex(6));
  const int64_t now = now_();
  std::lock_guard<std::mutex> lock(mutex_);
  dropExpiredLocked(now);
  const auto live = std::count_if(bySecretHash_.begin(), bySecretHash_.end(),
                                  [&](const auto& entry) { return entry.second.environment == environment; });
  if (static_cast<size_t>(live) >= kMaxPerEnvironment) {
    return Error::make(Code::kCapacity, "environment " + environment + " has " + std::to_string(kMaxPerEnvironment) +
                                            " previews already: revoke one first");
  }
  Created created;
  created.secret = secret;
  created.preview = Preview{"pv" + id, environment, port, owner, now, now + ttlS * 1000};
  bySecretHash_[sha256Hex(secret)] = created.preview;
  return created;
}

std::vector<Preview> Previews::list(const std::string& environment) {
  std::lock_guard<std::mutex> lock(mutex_);
  dropExpiredLocked(now_());
  std::vector<Preview> out;
  for (const auto& [hash, preview] : bySecretHash_) {
    if (preview.environment == environment) out.push_back(preview);
  }
  std::sort(out.begin(), out.end(), [](const Preview& a, const Preview& b) {
    return a.createdAtMs != b.createdAtMs ? a.createdAtMs < b.createdAtMs : a.id < b.id;
  });
  return out;
}

std::optional<Preview> Previews::revoke(const std::string& environment, const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  dropExpiredLocked(now_());
  for (auto it = bySecretHash_.begin(); it != bySecretHash_.end(); ++it) {
    if (it->second.environment == environment && it->second.id == id) {
      Preview gone = it->second;
      bySecretHash_.erase(it);
      return gone;
    }
  }
  return std::nullopt;
}

std::vector<Preview> Previews::endEnvironment(const std::string& environment) {
  return endWhere([&](const Preview& p) { return p.environment == environment; });
}

std::vector<Preview> Previews::endOwner(const std::string& owner) {
  return endWhere([&](const Preview& p) { return p.owner == owner; });
}

std::vector<Preview> Previews::endWhere(const std::function<bool(const Preview&)>& ends) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Preview> gone;
  for (auto it = bySecretHash_.begin(); it != bySecretHash_.end();) {
    if (ends(it->second)) {
      gone.push_back(it->second);
      it = bySecretHash_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

std::optional<Preview> Previews::resolve(const std::string& secret) {
  if (secret.size() != 32) return std::nullopt;
  const std::string hash = sha256Hex(secret);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = bySecretHash_.find(hash);
  if (it == bySecretHash_.end()) return std::nullopt;
  if (it->second.expiresAtMs <= now_()) {
    bySecretHash_.erase(it);
    return std::nullopt;
  }
  return it->second;
}

std::optional<std::string> previewSecretOf(const std::string& hostHeader, const std::string& domain) {
  if (domain.empty()) return std::nullopt;
  std::string host = hostHeader;
  for (auto& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!host.empty() && host[0] != '[') host = host.substr(0, host.find(':'));
  if (!host.empty() && host.back() == '.') host.pop_back();  // "x.preview.localhost." is the same name
  if (host == domain) return std::string();
  const std::string suffix = "." + domain;
  if (host.size() <= suffix.size() || host.compare(host.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  std::string label = host.substr(0, host.size() - suffix.size());
  if (label.size() != 32 || label.find_first_not_of("0123456789abcdef") != std::string::npos) return std::string();
  return label;
}

}  // namespace moat::api
