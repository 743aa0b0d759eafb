#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/glob.h"
#include "common/path.h"
#include "common/result.h"

// The gate's permissions: for each of the four scopes of an environment
// (read_file, write_file, run_command, network) a decision, allow, ask or
// deny, either as one word or as ordered rules where the first match wins
// (docs/GATE.md). Pure data and matching: no I/O.
namespace moat::gate {

enum class Decision { kAllow = 0, kAsk = 1, kDeny = 2 };  // ordered by strictness
const char* decisionName(Decision d);

enum class Scope { kReadFile, kWriteFile, kRunCommand, kNetwork };
const char* scopeName(Scope s);
constexpr Scope kScopes[] = {Scope::kReadFile, Scope::kWriteFile, Scope::kRunCommand, Scope::kNetwork};

// What an agent is about to do, as the gate sees it.
struct Action {
  Scope scope = Scope::kRunCommand;
  std::vector<std::string> argv;           // run_command
  std::map<std::string, std::string> env;  // run_command: variables the request sets
  std::string program;                     // run_command, op "program": the file the exec names
  std::vector<std::string> parents;        // ... and who runs it ("pid comm", up to pid 1): shown, not compared
  std::string path;                        // read_file, write_file (absolute)
  std::string host;                        // network
  uint16_t port = 0;                       // network; 0: any
  uint64_t size = 0;                       // write_file: bytes
  std::string sha256;                      // write_file: of the bytes, when there are any
  std::string op;  // files: "read", "write", "list", "remove", ...; exec: "exec", "process", "shell"
  // files: the action reaches everything under `path` too (a recursive
  // remove, a move, a restore, a snapshot): a rule that may match any path
  // below counts, not only the first that matches `path` itself.
  bool tree = false;
  nlohmann::json toJson() const;
  // Exactly the same action, every field of it (op, size, content hash,
  // argv, env, host, port): what an approval shows is what it grants.
  bool same(const Action& other) const;
};

// Environment variables that make a program (its loader, its shell, its
// interpreter) load code of the caller's choosing: LD_* and the like
// (docs/GATE.md lists them). An action setting one is allowed only by a
// rule that names it in "env".
bool loadsCode(const std::string& variable);

struct Rule {
  std::optional<std::vector<std::string>> match;  // run_command: argv globs; a last "*" takes any rest
  // run_command: globs of code-loading variables (loadsCode) the action may
  // set; without it the rule matches no action that sets one.
  std::optional<std::vector<std::string>> env;
  std::optional<std::string> op;    // files: only this operation
  std::optional<std::string> path;  // files: glob ("*" within a segment, "**" across)
  std::optional<std::string> host;  // network: glob, case-insensitive
  std::optional<uint16_t> port;     // network
  Decision decision = Decision::kDeny;
  bool matches(const Action& action) const;
  nlohmann::json toJson(Scope scope) const;
};

struct ScopePolicy {
  // A bare word is a single rule without conditions.
  std::vector<Rule> rules;
  bool word = true;  // written as one word (kept for display)
};

class Permissions {
 public:
  // The documented defaults: read_file, write_file and run_command allow;
  // network deny.
  static Permissions defaults();
  // Every scope "allow": the base of a layer that only adds restrictions.
  static Permissions allowAll();
  // Parses {"read_file": "allow" | [rules], ...}; scopes left out take
  // `base`'s. Errors name the offending field under `prefix` (code
  // "invalid_request", context "<field>: <problem>").
  static Result<Permissions> parse(const nlohmann::json& j, const Permissions& base,
                                   const std::string& prefix = "permissions");
  nlohmann::json toJson() const;

  struct Verdict {
    Decision decision = Decision::kDeny;
    int rule = -1;            // index of the matching rule; -1: none matched
    nlohmann::json ruleJson;  // the rule, as written
  };
  Verdict evaluate(const Action& action) const;
  ScopePolicy& scope(Scope s) { return scopes_[static_cast<int>(s)]; }
  const ScopePolicy& scope(Scope s) const { return scopes_[static_cast<int>(s)]; }
  // Puts a rule first in its scope: what "remember" does with a decision.
  void prepend(Scope s, Rule rule);

 private:
  ScopePolicy scopes_[4];
};

// An environment's permissions are layers: the first is what it was created
// with (or what the master set); a key can only add layers, and every layer
// and the key's ceiling must allow an action: the strictest verdict wins.
struct Evaluation {
  Decision decision = Decision::kDeny;
  int layer = 0;            // which layer decided; -1: the key's ceiling
  int rule = -1;            // the rule in it; -1: no rule matched
  nlohmann::json ruleJson;  // that rule as written (null when none matched)
};
Evaluation evaluate(const std::vector<Permissions>& layers, const Permissions* ceiling, const Action& action);
// The layers as stored: a JSON array of permission objects.
nlohmann::json layersToJson(const std::vector<Permissions>& layers);
Result<std::vector<Permissions>> layersFromJson(const std::string& text, const Permissions& defaults);

// Glob matching (common/glob.h), where the gate's rules use it.
using moat::globEscape;
using moat::globMatch;
// Lexical path normalisation (common/path.h), where the gate's paths use it.
using moat::normalizePath;

}  // namespace moat::gate
