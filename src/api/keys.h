#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "gate/permissions.h"
#include "store/store.h"

namespace moat::api {

// Who is calling: the master token, or a scoped API key.
struct Principal {
  bool master = false;
  std::string keyId;             // for keys
  std::set<std::string> scopes;  // for keys
  // A key's ceiling: its environments can never do more than this allows.
  std::shared_ptr<const gate::Permissions> ceiling;
  std::string owner() const { return master ? "master" : keyId; }
  bool may(const std::string& scope) const { return master || scopes.count(scope) > 0; }
};

// The scopes a key can hold, one per kind of operation.
const std::vector<std::string>& knownScopes();

// Whether `text` at `at` starts as a key's token does: "moat_", its 12
// lowercase hex digit id, "_".
bool keyTokenStartsAt(const std::string& text, size_t at);

// Scoped API keys: tokens are "moat_<id>_<secret>"; only their SHA-256 is
// stored, and checking one compares hashes in constant time. A key sees and
// touches only the environments it created.
class Keys {
 public:
  explicit Keys(store::Store& store) : store_(store) {}
  struct Created {
    store::ApiKeyRecord record;
    std::string token;  // shown once
  };
  // permissions: the ceiling's JSON ("" for none).
  Result<Created> create(const std::string& name, const std::vector<std::string>& scopes,
                         const std::string& permissions = "");
  Result<std::vector<store::ApiKeyRecord>> list();
  Status revoke(const std::string& id);
  // Error code "unauthorized" for anything but an active key's exact token.
  Result<Principal> authenticate(const std::string& token);
  // The ceiling of the key `id` (revoked or not; null when it has none):
  // what the environments it created may do on their own (their network).
  // A ceiling never changes, so it is read from the store once.
  Result<std::shared_ptr<const gate::Permissions>> ceilingOf(const std::string& id);
  // For a stream that outlives its request: true while the caller's key
  // is not revoked (the master's always). Cheap: the store is read again
  // only after some key was revoked.
  std::function<bool()> stillActive(const Principal& principal);

 private:
  store::Store& store_;
  std::atomic<uint64_t> revocations_{0};
  std::mutex ceilingsMutex_;
  std::map<std::string, std::shared_ptr<const gate::Permissions>> ceilings_;  // by key id
};

std::string sha256Hex(const std::string& data);

}  // namespace moat::api
