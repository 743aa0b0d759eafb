#include "gate/permissions.h"

#include <algorithm>
#include <cctype>

#include "common/glob.h"
#include "common/text.h"

namespace moat::gate {
namespace {

using json = nlohmann::json;

Result<Decision> parseDecision(const json& j, const std::string& field) {
  if (j.is_string()) {
    std::string s = j;
    if (s == "allow") return Decision::kAllow;
    if (s == "ask") return Decision::kAsk;
    if (s == "deny") return Decision::kDeny;
  }
  return Error::invalidField(field, "must be \"allow\", \"ask\" or \"deny\"");
}

}  // namespace

const char* decisionName(Decision d) {
  switch (d) {
    case Decision::kAllow:
      return "allow";
    case Decision::kAsk:
      return "ask";
    case Decision::kDeny:
      return "deny";
  }
  return "deny";
}

const char* scopeName(Scope s) {
  switch (s) {
    case Scope::kReadFile:
      return "read_file";
    case Scope::kWriteFile:
      return "write_file";
    case Scope::kRunCommand:
      return "run_command";
    case Scope::kNetwork:
      return "network";
  }
  return "";
}

bool loadsCode(const std::string& v) {
  static const char* const kNamed[] = {"GCONV_PATH", "BASH_ENV", "ENV",        "NODE_OPTIONS",     "PERL5OPT",
                                       "PERL5LIB",   "PERLLIB",  "PYTHONPATH", "PYTHONHOME",       "PYTHONSTARTUP",
                                       "RUBYOPT",    "RUBYLIB",  "LUA_INIT",   "JAVA_TOOL_OPTIONS"};
  if (v.rfind("LD_", 0) == 0) return true;
  for (const char* n : kNamed) {
    if (v == n) return true;
  }
  return false;
}

json Action::toJson() const {
  json j = {{"scope", scopeName(scope)}};
  if (!op.empty()) j["op"] = op;
  switch (scope) {
    case Scope::kRunCommand:
      j["argv"] = argv;
      if (!env.empty()) j["env"] = env;
      if (!program.empty()) j["program"] = program;
      if (!parents.empty()) j["parents"] = parents;
      break;
    case Scope::kReadFile:
    case Scope::kWriteFile:
      j["path"] = path;
      if (tree) j["tree"] = true;
      if (scope == Scope::kWriteFile) j["size"] = size;
      if (!sha256.empty()) j["sha256"] = sha256;
      break;
    case Scope::kNetwork:
      j["host"] = host;
      if (port) j["port"] = port;
      break;
  }
  return j;
}

bool Action::same(const Action& other) const {
  return scope == other.scope && op == other.op && argv == other.argv && env == other.env && program == other.program &&
         path == other.path && tree == other.tree && size == other.size && sha256 == other.sha256 &&
         asciiLower(host) == asciiLower(other.host) && port == other.port;
}

bool Rule::matches(const Action& a) const {
  for (const auto& [name, value] : a.env) {
    if (!loadsCode(name)) continue;
    bool named = false;
    for (const auto& pattern : env ? *env : std::vector<std::string>{})
      named = named || globMatch(pattern, name, false);
    if (!named) return false;
  }
  if (op && *op != a.op) return false;
  if (match && !argvMatch(*match, a.op == "program" ? judgedArgv(a.program, a.argv) : a.argv)) return false;
  if (path && !globMatch(*path, normalizePath(a.path), true)) return false;
  if (host && !globMatch(asciiLower(*host), asciiLower(a.host), false)) return false;
  if (port && *port != a.port) return false;
  return true;
}

json Rule::toJson(Scope) const {
  json j = json::object();
  if (match) j["match"] = *match;
  if (env) j["env"] = *env;
  if (path) j["path"] = *path;
  if (op) j["op"] = *op;
  if (host) j["host"] = *host;
  if (port) j["port"] = *port;
  j["action"] = decisionName(decision);
  return j;
}

Permissions Permissions::defaults() {
  Permissions p;
  for (Scope s : kScopes) {
    Rule r;
    r.decision = s == Scope::kNetwork ? Decision::kDeny : Decision::kAllow;
    p.scope(s).rules = {r};
    p.scope(s).word = true;
  }
  return p;
}

Permissions Permissions::allowAll() {
  Permissions p;
  for (Scope s : kScopes) {
    Rule r;
    r.decision = Decision::kAllow;
    p.scope(s).rules = {r};
  }
  return p;
}

Result<Permissions> Permissions::parse(const json& j, const Permissions& base, const std::string& prefix) {
  if (!j.is_object()) return Error::invalidField(prefix, "must be an object of scopes");
  Permissions p = base;
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string field = prefix + "." + it.key();
    Scope scope;
    if (it.key() == "read_file")
      scope = Scope::kReadFile;
    else if (it.key() == "write_file")
      scope = Scope::kWriteFile;
    else if (it.key() == "run_command")
      scope = Scope::kRunCommand;
    else if (it.key() == "network")
      scope = Scope::kNetwork;
    else
      return Error::make(Code::kUnknownField,
                         "unknown field " + field + " (read_file, write_file, run_command, network)");
    ScopePolicy policy;
    if (it.value().is_string()) {
      MOAT_ASSIGN(Decision d, parseDecision(it.value(), field));
      Rule r;
      r.decision = d;
      policy.rules = {r};
      policy.word = true;
      p.scope(scope) = policy;
      continue;
    }
    if (!it.value().is_array() || it.value().empty()) {
      return Error::invalidField(field, "must be \"allow\", \"ask\", \"deny\" or a non-empty array of rules");
    }
    if (it.value().size() > 256) return Error::invalidField(field, "at most 256 rules");
    policy.word = false;
    for (size_t i = 0; i < it.value().size(); ++i) {
      const json& rj = it.value()[i];
      std::string rf = field + "[" + std::to_string(i) + "]";
      if (!rj.is_object()) return Error::invalidField(rf, "a rule is an object with \"action\"");
      Rule r;
      for (auto f = rj.begin(); f != rj.end(); ++f) {
        std::string ff = rf + "." + f.key();
        const std::string& k = f.key();
        bool known = k == "action" || (scope == Scope::kRunCommand && (k == "match" || k == "env")) ||
                     ((scope == Scope::kReadFile || scope == Scope::kWriteFile) && (k == "path" || k == "op")) ||
                     (scope == Scope::kNetwork && (k == "host" || k == "port"));
        if (!known) return Error::make(Code::kUnknownField, "unknown field " + ff);
      }
      if (!rj.contains("action")) return Error::invalidField(rf + ".action", "required");
      MOAT_ASSIGN(r.decision, parseDecision(rj["action"], rf + ".action"));
      if (rj.contains("match")) {
        const json& m = rj["match"];
        if (!m.is_array() || m.empty() || m.size() > 256)
          return Error::invalidField(rf + ".match", "must be a non-empty array of argument patterns");
        std::vector<std::string> pats;
        for (size_t k = 0; k < m.size(); ++k) {
          if (!m[k].is_string() || m[k].get<std::string>().size() > 4096) {
            return Error::invalidField(rf + ".match[" + std::to_string(k) + "]", "must be a string");
          }
          pats.push_back(m[k]);
        }
        r.match = pats;
      }
      if (rj.contains("env")) {
        const json& e = rj["env"];
        if (!e.is_array() || e.empty() || e.size() > 64) {
          return Error::invalidField(rf + ".env", "must be a non-empty array of variable name patterns");
        }
        std::vector<std::string> names;
        for (size_t k = 0; k < e.size(); ++k) {
          if (!e[k].is_string() || e[k].get<std::string>().empty() || e[k].get<std::string>().size() > 256) {
            return Error::invalidField(rf + ".env[" + std::to_string(k) + "]", "must be a variable name pattern");
          }
          names.push_back(e[k]);
        }
        r.env = names;
      }
      if (rj.contains("op")) {
        static const std::vector<std::string> kReads = {"read", "stat", "list", "move", "snapshot"};
        static const std::vector<std::string> kWrites = {"write", "mkdir", "remove", "move", "restore"};
        const auto& ops = scope == Scope::kReadFile ? kReads : kWrites;
        if (!rj["op"].is_string() || std::find(ops.begin(), ops.end(), rj["op"].get<std::string>()) == ops.end()) {
          std::string list;
          for (const auto& o : ops) list += (list.empty() ? "" : ", ") + o;
          return Error::invalidField(rf + ".op", "must be one of " + list);
        }
        r.op = rj["op"].get<std::string>();
      }
      if (rj.contains("path")) {
        if (!rj["path"].is_string()) return Error::invalidField(rf + ".path", "must be a string");
        std::string path = rj["path"];
        if (path.empty() || path[0] != '/' || path.size() > 4096)
          return Error::invalidField(rf + ".path", "must be an absolute path pattern");
        r.path = path;
      }
      if (rj.contains("host")) {
        if (!rj["host"].is_string() || rj["host"].get<std::string>().empty() ||
            rj["host"].get<std::string>().size() > 253) {
          return Error::invalidField(rf + ".host", "must be a host name pattern");
        }
        r.host = rj["host"].get<std::string>();
      }
      if (rj.contains("port")) {
        if (!rj["port"].is_number_integer() || rj["port"].get<int64_t>() < 1 || rj["port"].get<int64_t>() > 65535) {
          return Error::invalidField(rf + ".port", "must be a port number (1-65535)");
        }
        r.port = static_cast<uint16_t>(rj["port"].get<int64_t>());
      }
      policy.rules.push_back(r);
    }
    p.scope(scope) = policy;
  }
  return p;
}

json Permissions::toJson() const {
  json j = json::object();
  for (Scope s : kScopes) {
    const ScopePolicy& policy = scope(s);
    if (policy.word && policy.rules.size() == 1) {
      j[scopeName(s)] = decisionName(policy.rules[0].decision);
      continue;
    }
    json arr = json::array();
    for (const auto& r : policy.rules) arr.push_back(r.toJson(s));
    j[scopeName(s)] = arr;
  }
  return j;
}

namespace {

bool hasGlob(const std::string& pattern) { return pattern.find_first_of("*?[\\") != std::string::npos; }

// Whether a path pattern surely matches every path below `dir`: "X/**"
// where X matches `dir` or a directory above it.
bool coversTree(const std::string& pattern, const std::string& dir) {
  if (pattern == "/**" || pattern == "**") return true;
  // Only those cover the whole file system: "/*/**" misses /secret, "//**"
  // matches nothing normalized.
  if (dir == "/") return false;
  if (pattern.size() < 3 || pattern.compare(pattern.size() - 3, 3, "/**") != 0) return false;
  std::string x = pattern.substr(0, pattern.size() - 3);
  if (!hasGlob(x)) return dir == x || dir.rfind(x + "/", 0) == 0;
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    if (globMatch(x, dir.substr(0, end), true)) return true;
    if (end == std::string::npos) return false;
  }
}

// Whether a path pattern may match some path below `dir`: judged by its
// literal start (what comes before its first glob character), so it may
// say yes to a pattern that could not match (the safe side), never no to
// one that could.
bool mayMatchBelow(const std::string& pattern, const std::string& dir) {
  const std::string below = dir == "/" ? "/" : dir + "/";
  size_t glob = pattern.find_first_of("*?[\\");
  if (glob == std::string::npos) return pattern.size() > below.size() && pattern.rfind(below, 0) == 0;
  std::string literal = pattern.substr(0, glob);
  return literal.size() >= below.size() ? literal.rfind(below, 0) == 0 : below.rfind(literal, 0) == 0;
}

}  // namespace

Permissions::Verdict Permissions::evaluate(const Action& action) const {
  const ScopePolicy& policy = scope(action.scope);
  Verdict out{Decision::kDeny, -1, nullptr};  // deny by default: no rule matched
  bool decided = false;
  for (size_t i = 0; i < policy.rules.size(); ++i) {
    if (policy.rules[i].matches(action)) {
      out = Verdict{policy.rules[i].decision, static_cast<int>(i), policy.rules[i].toJson(action.scope)};
      decided = true;
      break;
    }
  }
  const bool files = action.scope == Scope::kReadFile || action.scope == Scope::kWriteFile;
  if (!action.tree || !files || out.decision == Decision::kDeny) return out;
  // Below the path, each path gets the first rule that matches it: every
  // rule up to one that surely covers the whole tree may be that rule.
  const std::string dir = normalizePath(action.path);
  bool covered = false;
  for (size_t i = 0; i < policy.rules.size() && !covered; ++i) {
    const Rule& r = policy.rules[i];
    covered = !r.path || coversTree(*r.path, dir);
    if (!covered && !mayMatchBelow(*r.path, dir)) continue;
    if (static_cast<int>(r.decision) > static_cast<int>(out.decision)) {
      out = Verdict{r.decision, static_cast<int>(i), r.toJson(action.scope)};
    }
  }
  if (!covered && decided) out = Verdict{Decision::kDeny, -1, nullptr};  // some path below matches no rule
  return out;
}

void Permissions::prepend(Scope s, Rule rule) {
  ScopePolicy& policy = scope(s);
  policy.word = false;
  policy.rules.insert(policy.rules.begin(), std::move(rule));
}

Evaluation evaluate(const std::vector<Permissions>& layers, const Permissions* ceiling, const Action& action) {
  Evaluation out;
  out.decision = Decision::kAllow;
  out.layer = 0;
  bool first = true;
  auto consider = [&](const Permissions& p, int layer) {
    auto v = p.evaluate(action);
    if (first || static_cast<int>(v.decision) > static_cast<int>(out.decision)) {
      out = Evaluation{v.decision, layer, v.rule, v.ruleJson};
      first = false;
    }
  };
  for (size_t i = 0; i < layers.size(); ++i) consider(layers[i], static_cast<int>(i));
  if (ceiling) consider(*ceiling, -1);
  if (first) out.decision = Decision::kDeny;  // no layers at all: nothing was allowed
  return out;
}

json layersToJson(const std::vector<Permissions>& layers) {
  json arr = json::array();
  for (const auto& p : layers) arr.push_back(p.toJson());
  return arr;
}

Result<std::vector<Permissions>> layersFromJson(const std::string& text, const Permissions& defaults) {
  if (text.empty()) return std::vector<Permissions>{defaults};
  json j = json::parse(text, nullptr, false);
  if (!j.is_array() || j.empty()) return Error::make(Code::kStore, "stored permissions are not a JSON array of layers");
  std::vector<Permissions> layers;
  for (const auto& layer : j) {
    MOAT_ASSIGN(Permissions p, Permissions::parse(layer, Permissions::defaults()));
    layers.push_back(std::move(p));
  }
  return layers;
}

}  // namespace moat::gate
