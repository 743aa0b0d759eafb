#pragma once

#include <cstdint>
#include <string>

#include "audit/event.h"

// Checking a hash chain, event by event, in id order.
namespace moat::audit {

struct VerifyResult {
  bool ok = true;
  uint64_t checked = 0;        // events whose links were checked
  uint64_t firstBrokenId = 0;  // when !ok: the first event that does not hold
  std::string reason;          // when !ok: edited, deleted, prev_hash mismatch, ...
  uint64_t lastId = 0;         // the last event that held, and its hash:
  std::string lastHash;        // what to keep elsewhere to anchor the log
};

class ChainVerifier {
 public:
  // The first event must have `firstId` and link to `anchorHash` (the genesis
  // hash for id 1, else the hash a checkpoint recorded for what was pruned).
  ChainVerifier(uint64_t firstId, std::string anchorHash);
  // False once the chain is broken (later events are not looked at).
  // `dataIsJson`: the stored data parsed (an unparsable row was edited).
  bool add(const Event& event, bool dataIsJson = true);
  const VerifyResult& result() const { return result_; }

 private:
  bool fail(uint64_t id, std::string reason);

  uint64_t expectedId_;
  std::string expectedPrev_;
  VerifyResult result_;
};

}  // namespace moat::audit
