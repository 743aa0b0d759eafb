// The gate's permissions (src/gate/permissions.h): parsed from what an API
// caller sends, evaluated on every action an agent takes.
//
// Input: a JSON permissions object on the first line; each further line is
// an action: "r <path>" read_file, "w <path>" write_file, "x <arg>\t<arg>..."
// run_command, "n <host>[:<port>]" network, or "g <pattern>\t<text>" (a bare
// glob match). Checked, besides not crashing:
// - what is stored is what was decided: toJson -> parse, and layersToJson ->
//   layersFromJson (moatd's store, read back after a restart), decide every
//   action as before;
// - layers only tighten: the combined verdict is never looser than a layer's;
// - a remembered decision (approvals with "remember": the action's argv,
//   path or host escaped into a rule) matches its own action, wins when put
//   first, and survives the store;
// - normalizePath is idempotent and absolute; globEscape(t) matches exactly t.
#include "gate/permissions.h"

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "gate/approvals.h"

using namespace moat::gate;
using json = nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& what) {
  __builtin_printf("permissions: %s\n", what.c_str());
  std::abort();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

// Only actions the API and the proxy can ask about: absolute paths of at
// most 4096 bytes (api/validation.cc absolutePath), argv without NUL, host
// names as the proxy reads them (1..253 bytes of [a-z0-9._-]).
bool actionFrom(const std::string& line, Action& a) {
  if (line.size() < 2 || line[1] != ' ') return false;
  std::string rest = line.substr(2);
  if (rest.find('\0') != std::string::npos) return false;
  switch (line[0]) {
    case 'r':
    case 'w':
      if (rest.empty() || rest[0] != '/') return false;
      a.scope = line[0] == 'r' ? Scope::kReadFile : Scope::kWriteFile;
      a.path = rest;
      a.op = line[0] == 'r' ? "read" : "write";
      return true;
    case 'x':
      a.scope = Scope::kRunCommand;
      a.argv = split(rest, '\t');
      a.op = "exec";
      return true;
    case 'n': {
      a.scope = Scope::kNetwork;
      auto colon = rest.rfind(':');
      a.host = rest.substr(0, colon);
      if (colon != std::string::npos) a.port = static_cast<uint16_t>(std::atoi(rest.c_str() + colon + 1));
      if (a.host.empty() || a.host.size() > 253) return false;
      for (char c : a.host) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) return false;
      }
      return true;
    }
  }
  return false;
}

// What POST /v1/approvals/{id} with "remember" makes of an action (api/gate.cc).
Rule remembered(const Action& a, Decision d) {
  Rule rule;
  rule.decision = d;
  switch (a.scope) {
    case Scope::kRunCommand: {
      std::vector<std::string> exact;
      for (const auto& arg : a.argv) exact.push_back(globEscape(arg));
      rule.match = exact;
      break;
    }
    case Scope::kReadFile:
    case Scope::kWriteFile:
      rule.path = globEscape(normalizePath(a.path));
      break;
    case Scope::kNetwork:
      rule.host = globEscape(a.host);
      if (a.port) rule.port = a.port;
      break;
  }
  return rule;
}

void checkPath(const std::string& path) {
  std::string n = normalizePath(path);
  if (n.empty() || n[0] != '/') fail("normalizePath is not absolute");
  if (normalizePath(n) != n) fail("normalizePath is not idempotent: " + path);
  if (n.find("//") != std::string::npos) fail("normalizePath left '//'");
  for (const auto& seg : split(n.substr(1), '/')) {
    if (seg == "." || seg == "..") fail("normalizePath left a dot segment: " + path);
  }
  if (!globMatch(globEscape(n), n, true)) fail("globEscape(path) does not match the path");
}

void sameDecisions(const Permissions& a, const Permissions& b, const std::vector<Action>& actions, const char* what) {
  for (const auto& action : actions) {
    auto va = a.evaluate(action), vb = b.evaluate(action);
    if (va.decision != vb.decision || va.rule != vb.rule) fail(std::string(what) + " changed a decision");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  auto lines = split(input, '\n');
  std::vector<Action> actions;
  for (size_t i = 1; i < lines.size() && actions.size() < 32; ++i) {
    const std::string& line = lines[i];
    Action a;
    if (actionFrom(line, a)) {
      actions.push_back(a);
      if (!a.path.empty()) checkPath(a.path);
      for (const auto& arg : a.argv) {
        if (!globMatch(globEscape(arg), arg, false)) fail("globEscape(arg) does not match the arg");
      }
    } else if (line.size() >= 2 && line[0] == 'g') {
      auto tab = line.find('\t');
      std::string pattern = line.substr(1, tab == std::string::npos ? std::string::npos : tab - 1);
      std::string text = tab == std::string::npos ? "" : line.substr(tab + 1);
      (void)globMatch(pattern, text, true);
      (void)globMatch(pattern, text, false);
    }
  }

  json j = json::parse(lines[0], nullptr, false);
  if (j.is_discarded()) return 0;
  const Permissions bases[] = {Permissions::defaults(), Permissions::allowAll()};
  for (size_t b = 0; b < 2; ++b) {
    const Permissions& base = bases[b];
    auto parsed = Permissions::parse(j, base);
    if (!parsed.ok()) continue;
    const Permissions& p = parsed.value();
    for (const auto& action : actions) (void)p.evaluate(action);

    // As stored: the object, and the layers moatd writes to its store.
    auto again = Permissions::parse(p.toJson(), Permissions::defaults());
    if (!again.ok()) fail("toJson does not parse back: " + again.error().message());
    sameDecisions(p, again.value(), actions, "toJson -> parse");
    std::vector<Permissions> layers = {p, Permissions::defaults()};
    auto stored = layersFromJson(layersToJson(layers).dump(), Permissions::defaults());
    if (!stored.ok() || stored->size() != 2) fail("layersToJson does not read back");
    sameDecisions(p, stored->front(), actions, "layersToJson -> layersFromJson");

    // Layers and a ceiling: the strictest verdict wins.
    Permissions ceiling = base;
    for (const auto& action : actions) {
      Evaluation e = evaluate(layers, &ceiling, action);
      for (const auto* layer : {&layers[0], &layers[1], &ceiling}) {
        if (static_cast<int>(e.decision) < static_cast<int>(layer->evaluate(action).decision)) {
          fail("a layer's stricter verdict was loosened");
        }
      }
    }
    if (evaluate({}, nullptr, Action{}).decision != Decision::kDeny) fail("no layers must deny");

    // Remembered decisions: made from the action as the approval stored it
    // (api/gate.cc: actionFromJson of the approval's action).
    if (b > 0) continue;  // once is enough: on the defaults
    for (size_t k = 0; k < actions.size() && k < 8; ++k) {
      const Action& asked = actions[k];
      auto storedAction = actionFromJson(asked.toJson().dump(-1, ' ', false, json::error_handler_t::replace));
      if (!storedAction.ok()) fail("an approval's action does not read back: " + storedAction.error().message());
      const Action& action = storedAction.value();
      for (Decision d : {Decision::kAllow, Decision::kDeny}) {
        Rule rule = remembered(action, d);
        if (!rule.matches(action)) fail("a remembered rule does not match its own action");
        Permissions withRule = p;
        withRule.prepend(action.scope, rule);
        if (withRule.evaluate(action).decision != d) fail("a remembered rule put first does not decide");
        auto back = layersFromJson(layersToJson({withRule}).dump(), Permissions::defaults());
        if (!back.ok()) fail("a remembered rule does not survive the store: " + back.error().message());
        if (back->front().evaluate(action).decision != d) fail("a remembered rule decides otherwise after the store");
      }
    }
  }
  return 0;
}
