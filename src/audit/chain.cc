#include "audit/chain.h"

#include <openssl/evp.h>

#include "common/hex.h"

namespace moat::audit {

Recorder& nullRecorder() {
  static NullRecorder recorder;
  return recorder;
}

namespace {

std::string canonicalString(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string canonicalData(const nlohmann::json& data) {
  // nlohmann's objects are std::maps (keys in byte order) and dump() writes
  // no whitespace and escapes only what JSON requires.
  return data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string canonicalEvent(uint64_t id, int64_t timeMs, const std::string& type, const std::string& environment,
                           const std::string& actor, const std::string& dataText, const std::string& prevHash) {
  std::string out = "[";
  out += std::to_string(id);
  out += ',';
  out += std::to_string(timeMs);
  out += ',';
  out += canonicalString(type);
  out += ',';
  out += canonicalString(environment);
  out += ',';
  out += canonicalString(actor);
  out += ',';
  out += dataText;
  out += ',';
  out += canonicalString(prevHash);
  out += ']';
  return out;
}

std::string chainHash(uint64_t id, int64_t timeMs, const std::string& type, const std::string& environment,
                      const std::string& actor, const std::string& dataText, const std::string& prevHash) {
  std::string text = canonicalEvent(id, timeMs, type, environment, actor, dataText, prevHash);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(text.data(), text.size(), digest, &length, EVP_sha256(), nullptr);
  return toHex(digest, length);
}

std::string chainHash(const Event& event) {
  return chainHash(event.id, event.timeMs, event.type, event.environment, event.actor, canonicalData(event.data),
                   event.prevHash);
}

ChainVerifier::ChainVerifier(uint64_t firstId, std::string anchorHash)
    : expectedId_(firstId), expectedPrev_(std::move(anchorHash)) {}

bool ChainVerifier::fail(uint64_t id, std::string reason) {
  result_.ok = false;
  result_.firstBrokenId = id;
  result_.reason = std::move(reason);
  return false;
}

bool ChainVerifier::add(const Event& event, bool dataIsJson) {
  if (!result_.ok) return false;
  if (event.id != expectedId_) {
    if (event.id > expectedId_) {
      std::string missing = event.id == expectedId_ + 1 ? "event " + std::to_string(expectedId_) + " is missing"
                                                        : "events " + std::to_string(expectedId_) + " to " +
                                                              std::to_string(event.id - 1) + " are missing";
      return fail(expectedId_, "deleted: " + missing);
    }
    return fail(event.id, "out of order: expected event " + std::to_string(expectedId_) + " here");
  }
  if (!dataIsJson) return fail(event.id, "edited: its data is not JSON");
  if (chainHash(event) != event.hash) {
    return fail(event.id, "edited: its hash does not match its contents");
  }
  if (event.prevHash != expectedPrev_) {
    return fail(event.id, event.id == 1 || result_.checked == 0
                              ? "prev_hash mismatch: does not link to the start of the chain"
                              : "prev_hash mismatch: does not match the hash of event " + std::to_string(event.id - 1));
  }
  ++result_.checked;
  result_.lastId = event.id;
  result_.lastHash = event.hash;
  expectedId_ = event.id + 1;
  expectedPrev_ = event.hash;
  return true;
}

}  // namespace moat::audit
