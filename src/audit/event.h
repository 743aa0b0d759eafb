#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

// The audit log: every side effect and decision of moatd as an event, kept
// append-only in a hash chain (docs/API.md, "Audit").
namespace moat::audit {

struct Event {
  uint64_t id = 0;          // 1, 2, ... in append order, no gaps
  int64_t timeMs = 0;       // unix time, milliseconds
  std::string type;         // dotted: "exec.ended"
  std::string environment;  // empty when the event concerns none
  std::string actor;        // "master", an API key id, "moatd", "anonymous"
  nlohmann::json data;      // an object of strings, integers, booleans, arrays, objects
  std::string prevHash;
  std::string hash;
};

// Takes events. Implementations must be cheap for the caller and never wait
// for the disk: the calls come from request and reader threads.
// How often an event type that code inside an environment causes at will
// may be recorded for one environment: `rate` a second, `burst` at once.
struct Pace {
  double rate = 20;
  double burst = 100;
};

class Recorder {
 public:
  virtual ~Recorder() = default;
  // Appends an event (id, time and hashes are assigned here). Cheap and
  // non-blocking for the caller: it must not wait for disk.
  virtual void record(const std::string& type, const std::string& environment, const std::string& actor,
                      nlohmann::json data) = 0;
  // An event that code inside `environment` causes (its connections, its
  // questions), actor "environment": the log may hold it at `pace` and within
  // the environment's share, and counts the rest (EnvironmentShare).
  virtual void recordByEnvironment(const std::string& type, const std::string& environment, nlohmann::json data,
                                   Pace pace) {
    (void)pace;
    record(type, environment, "environment", std::move(data));
  }
  // The environment ended: what is still only counted is written.
  virtual void closeEnvironment(const std::string& environment) { (void)environment; }
};

// Drops everything: for code under test that has no log.
class NullRecorder final : public Recorder {
 public:
  void record(const std::string&, const std::string&, const std::string&, nlohmann::json) override {}
};
Recorder& nullRecorder();

// What the chain starts from: the prev_hash of event 1.
inline const std::string kGenesisHash(64, '0');

// `data` as its canonical JSON text: no whitespace, object keys sorted by
// their UTF-8 bytes, strings as UTF-8 with only '"', '\\' and control
// characters escaped; bytes that are not UTF-8 become U+FFFD.
std::string canonicalData(const nlohmann::json& data);

// The bytes an event's hash covers: the JSON array
//   [id, time_ms, type, environment, actor, data, prev_hash]
// in the canonical form above, with `dataText` the canonical data.
std::string canonicalEvent(uint64_t id, int64_t timeMs, const std::string& type, const std::string& environment,
                           const std::string& actor, const std::string& dataText, const std::string& prevHash);

// Lowercase hex SHA-256 of canonicalEvent(...).
std::string chainHash(uint64_t id, int64_t timeMs, const std::string& type, const std::string& environment,
                      const std::string& actor, const std::string& dataText, const std::string& prevHash);
std::string chainHash(const Event& event);

}  // namespace moat::audit
