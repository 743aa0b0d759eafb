#include "api/keys.h"

#include <openssl/evp.h>

#include "api/auth.h"
#include "common/clock.h"
#include "common/hex.h"

namespace moat::api {
namespace {

// A key's ceiling as stored ("" for none): one that cannot be read allows nothing.
std::shared_ptr<const gate::Permissions> ceilingFrom(const std::string& stored) {
  if (stored.empty()) return nullptr;
  auto layers = gate::layersFromJson("[" + stored + "]", gate::Permissions::allowAll());
  gate::Permissions ceiling = gate::Permissions::allowAll();
  if (layers.ok()) {
    ceiling = layers->front();
  } else {
    for (gate::Scope s : gate::kScopes) ceiling.scope(s).rules = {gate::Rule{}};
  }
  return std::make_shared<const gate::Permissions>(ceiling);
}

}  // namespace

const std::vector<std::string>& knownScopes() {
  static const std::vector<std::string> scopes = {"create",    "read",    "exec",        "files", "destroy",
                                                  "timeout",   "approve", "permissions", "audit", "snapshots",
                                                  "templates", "ports",   "pause"};
  return scopes;
}

std::string sha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  return toHex(digest, length);
}

Result<Keys::Created> Keys::create(const std::string& name, const std::vector<std::string>& scopes,
                                   const std::string& permissions) {
  Created created;
  MOAT_ASSIGN(created.record.id, randomHex(6));
  MOAT_ASSIGN(std::string secret, randomHex(32));
  created.token = "moat_" + created.record.id + "_" + secret;
  created.record.name = name;
  created.record.tokenHash = sha256Hex(created.token);
  created.record.scopes = scopes;
  created.record.permissions = permissions;
  created.record.createdAtMs = nowMs();
  MOAT_TRY(store_.insertKey(created.record));
  return created;
}

Result<std::vector<store::ApiKeyRecord>> Keys::list() { return store_.listKeys(); }

Status Keys::revoke(const std::string& id) {
  Status s = store_.revokeKey(id, nowMs());
  ++revocations_;
  return s;
}

std::function<bool()> Keys::stillActive(const Principal& principal) {
  if (principal.master) return [] { return true; };
  struct Seen {
    uint64_t revocations;
    bool active = true;
  };
  // The first call reads the store: a revocation between this request's
  // authentication and its stream's start counts too.
  auto seen = std::make_shared<Seen>(Seen{UINT64_MAX});
  return [this, seen, id = principal.keyId] {
    uint64_t now = revocations_.load();
    if (seen->active && now != seen->revocations) {
      seen->revocations = now;
      auto key = store_.getKey(id);
      // A store that cannot answer does not end the stream; a revoked or gone key does.
      if (key.ok()) seen->active = key.value() && key.value()->revokedAtMs == 0;
    }
    return seen->active;
  };
}

bool keyTokenStartsAt(const std::string& text, size_t at) {
  return at + 18 <= text.size() && text.compare(at, 5, "moat_") == 0 && text[at + 17] == '_' &&
         text.find_first_not_of("0123456789abcdef", at + 5) == at + 17;
}

Result<Principal> Keys::authenticate(const std::string& token) {
  // moat_<12 hex id>_<64 hex secret>
  if (token.size() != 5 + 12 + 1 + 64 || token.compare(0, 5, "moat_") != 0 || token[17] != '_') {
    return Error::make(Code::kUnauthorized, "invalid token");
  }
  std::string id = token.substr(5, 12);
  auto key = store_.getKey(id);
  if (!key.ok()) return key.error();
  // Hash either way, so an unknown id costs what a wrong secret does.
  std::string hash = sha256Hex(token);
  if (!key.value() || !constantTimeEquals(hash, key.value()->tokenHash)) {
    return Error::make(Code::kUnauthorized, "invalid token");
  }
  if (key.value()->revokedAtMs != 0) return Error::make(Code::kUnauthorized, "this key was revoked");
  Principal p;
  p.keyId = id;
  p.scopes.insert(key.value()->scopes.begin(), key.value()->scopes.end());
  p.ceiling = ceilingFrom(key.value()->permissions);
  return p;
}

Result<std::shared_ptr<const gate::Permissions>> Keys::ceilingOf(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(ceilingsMutex_);
    if (auto it = ceilings_.find(id); it != ceilings_.end()) return it->second;
  }
  MOAT_ASSIGN(auto key, store_.getKey(id));
  if (!key) return Error::make(Code::kNotFound, "no key " + id);
  auto ceiling = ceilingFrom(key->permissions);
  std::lock_guard<std::mutex> lock(ceilingsMutex_);
  ceilings_[id] = ceiling;
  return ceiling;
}

}  // namespace moat::api
