#include <cstring>
#include <nlohmann/json.hpp>

#include "api/api.h"
#include "api/validation.h"
#include "common/scope_exit.h"
#include "templates/catalog.h"

// POST /v1/templates {"name", "build": {"base", "run", "env"}}: a template
// from a recipe (docs/TEMPLATES.md, "Recipes"). moatd makes an environment
// of the base for the caller (its ceiling and the default permissions
// apply, every step is judged and audited as an exec of the caller's),
// runs each line with /bin/sh -c, snapshots the environment and destroys
// it. The snapshot belongs to the template.
namespace moat::api {

json templateJson(const templates::TemplateView& v, const Principal& viewer);  // templates.cc

namespace {

constexpr size_t kMaxSteps = 100;
constexpr size_t kMaxLine = 8192;
constexpr size_t kTail = 2000;  // bytes of a failed step's output in its error
constexpr uint64_t kStepTimeoutMs = 3600 * 1000;

std::string tail(const std::string& text) {
  if (text.size() <= kTail) return text;
  return "..." + text.substr(text.size() - kTail);
}

std::string shortLine(const std::string& line) {
  std::string s = line.substr(0, 120);
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return s + (line.size() > 120 ? "..." : "");
}

gate::Action stepAction(const std::string& line, const std::map<std::string, std::string>& env) {
  gate::Action action;
  action.scope = gate::Scope::kRunCommand;
  action.argv = {"/bin/sh", "-c", line};
  action.env = env;
  action.op = "exec";
  return action;
}

}  // namespace

HttpResponse Api::startTemplateBuild(const HttpRequest& req, const Principal& principal, const json& j) {
  // A build makes an environment and runs commands in it: what the create
  // and exec scopes grant, beside templates.
  for (const char* scope : {"create", "exec"}) {
    if (!principal.may(scope)) {
      return errorResponse({403, "forbidden",
                            std::string("a template build makes an environment and runs commands in it: it needs the "
                                        "'create' and 'exec' scopes beside 'templates' (this key lacks '") +
                                scope + "')",
                            ""});
    }
  }
  const json& b = j["build"];
  if (!b.is_object()) return errorResponse(invalid("build", "must be an object: {\"base\", \"run\", \"env\"?}"));
  if (auto e = onlyFields(b, {"base", "run", "env"}, "build.")) return errorResponse(*e);
  if (!b.contains("base") || !b["base"].is_string()) {
    return errorResponse(invalid("build.base", "required: 'host', a template's name or (master) a directory"));
  }
  BuildRecipe recipe;
  recipe.base = b["base"];
  const bool directory = recipe.base.rfind("/", 0) == 0;
  if (recipe.base != "host" && !directory && !templates::validName(recipe.base)) {
    return errorResponse(invalid("build.base",
                                 "'host', a template's name (GET /v1/templates) or an absolute root "
                                 "file system directory; not '" +
                                     recipe.base.substr(0, 80) + "'"));
  }
  // As POST /v1/environments: a directory shows that host directory inside.
  if (directory && !principal.master) {
    return errorResponse(
        {403, "forbidden", "build.base: only the master token may build on a directory template", "build.base"});
  }
  if (!b.contains("run") || !b["run"].is_array() || b["run"].empty() || b["run"].size() > kMaxSteps) {
    return errorResponse(
        invalid("build.run", "required: 1 to " + std::to_string(kMaxSteps) + " shell lines (strings)"));
  }
  for (const auto& line : b["run"]) {
    if (!line.is_string() || line.get<std::string>().empty() || line.get<std::string>().size() > kMaxLine ||
        line.get<std::string>().find('\0') != std::string::npos) {
      return errorResponse(invalid("build.run", "each step is a non-empty string of at most " +
                                                    std::to_string(kMaxLine) + " bytes without NUL"));
    }
    recipe.run.push_back(line);
  }
  if (b.contains("env")) {
    if (auto e = stringMap(b["env"], "build.env", true, recipe.env)) return errorResponse(*e);
  }
  if (!templates::validName(j["name"].get<std::string>())) {
    return errorResponse(invalid("name", "'" + j["name"].get<std::string>().substr(0, 80) +
                                             "': 1 to 64 of a-z 0-9 . _ : - starting with a letter or digit, "
                                             "not 'host'"));
  }
  // The base must be usable now: a clear answer rather than a failed build.
  if (templates::validName(recipe.base)) {
    auto usable = templates_->defaultsFor(recipe.base);
    if (!usable.ok()) {
      ApiError e = fromError(usable.error());
      e.field = "build.base";
      return errorResponse(e);
    }
  }
  // What the caller's ceiling refuses outright is refused now; the rest is
  // judged step by step against the build's environment (which may ask).
  for (const auto& line : recipe.run) {
    gate::Action action = stepAction(line, recipe.env);
    gate::Evaluation e = gate::evaluate({environments_.config().defaultPermissions}, principal.ceiling.get(), action);
    if (e.decision == gate::Decision::kDeny) {
      audit_.record("gate.denied", "", principal.owner(),
                    {{"action", action.toJson()}, {"rule", e.ruleJson}, {"template", j["name"]}});
      json err = {{"code", "denied_by_policy"},
                  {"message", "build.run: step '" + shortLine(line) + "' is denied by " +
                                  (e.layer < 0 ? "the API key's ceiling" : "the default permissions")},
                  {"scope", "run_command"},
                  {"action", action.toJson()},
                  {"field", "build.run"}};
      if (!e.ruleJson.is_null()) err["rule"] = e.ruleJson;
      return respond(403, {{"error", err}});
    }
  }
  const std::string name = j["name"];
  auto started =
      templates_->build(name, recipe.base, principal.owner(),
                        [this, req, principal, name, recipe](const std::function<void(const std::string&)>& progress,
                                                             const std::function<bool()>& stopping) {
                          return runTemplateBuild(req, principal, name, recipe, progress, stopping);
                        });
  if (!started.ok()) {
    ApiError e = fromError(started.error());
    if (started.error().code == Code::kInvalidRequest) e.field = "name";
    return errorResponse(e);
  }
  audit_.record("template.build_started", "", principal.owner(),
                {{"template", name}, {"base", recipe.base}, {"steps", recipe.run.size()}});
  return respond(202, templateJson(started.value(), principal));
}

Result<templates::Built> Api::runTemplateBuild(const HttpRequest& req, const Principal& principal,
                                               const std::string& name, const BuildRecipe& recipe,
                                               const std::function<void(const std::string&)>& progress,
                                               const std::function<bool()>& stopping) {
  progress("creating an environment from " + recipe.base);
  const auto stillActive = keys_.stillActive(principal);  // a revoked key's build ends at its next step
  manager::CreateRequest create;
  create.owner = principal.owner();  // its ceiling rules what the steps run
  create.labels[std::string(kTemplateBuildLabel)] = name;
  // On a built template: a fork of its snapshot (the manager's create).
  create.templateName = recipe.base;
  // Its steps end in a snapshot, which the namespace backend makes.
  create.isolation = backend::Isolation::kNamespaces;
  MOAT_ASSIGN(templates::Defaults base, templates_->defaultsFor(recipe.base));
  auto created = environments_.create(create);
  if (!created.ok())
    return Error::make(created.error().code,
                       "creating the build's environment from " + recipe.base + ": " + created.error().message());
  const std::string id = created->id;
  ScopeExit destroy([&] { (void)environments_.destroy(id, "the build of template " + name + " ended", "moatd"); });
  const size_t n = recipe.run.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string step = "step " + std::to_string(i + 1) + "/" + std::to_string(n);
    if (stopping()) return Error::make(Code::kUnavailable, "stopped before " + step);
    if (!stillActive())
      return Error::make(Code::kUnauthorized, "the API key that started it was revoked before " + step);
    const std::string& line = recipe.run[i];
    progress(step + ": " + shortLine(line));
    manager::ExecRequest exec;
    exec.argv = {"/bin/sh", "-c", line};
    exec.actor = principal.owner();
    exec.timeoutMs = kStepTimeoutMs;
    exec.outputLimit = 1u << 20;
    gate::Action action = stepAction(line, commands_.envOf(id));
    for (const auto& [k, v] : recipe.env) action.env[k] = v;
    if (auto refused = check(req, principal, id, action)) {
      json body = json::parse(refused->body, nullptr, false);
      std::string why = body.is_object() ? body["error"].value("message", refused->body) : refused->body;
      return Error::make(Code::kRefused, step + " ('" + shortLine(line) + "'): " + why);
    }
    auto ran = commands_.exec(id, exec, recipe.env);
    if (!ran.ok())
      return Error::make(ran.error().code, step + " ('" + shortLine(line) + "'): " + ran.error().message());
    if (!ran->started) {
      return Error::make(Code::kFailed, step + " ('" + shortLine(line) + "') could not start /bin/sh (" +
                                            ran->spawnStage + ": " + std::strerror(ran->spawnErrno) + ")");
    }
    if (ran->timedOut || ran->signal || ran->exitCode != 0) {
      int code = ran->signal ? 128 + ran->signal : ran->exitCode;
      std::string output = tail(ran->out + ran->err);
      return Error::make(Code::kFailed, step + " ('" + shortLine(line) + "') " +
                                            (ran->timedOut ? "timed out" : "exited with code " + std::to_string(code)) +
                                            (output.empty() ? std::string() : ": " + output));
    }
  }
  if (stopping()) return Error::make(Code::kUnavailable, "stopped before the snapshot");
  progress("taking the snapshot");
  MOAT_ASSIGN(auto snap,
              snapshots_.snapshotOwnedBy(id, templates::snapshotOwner(name), "template " + name, principal.owner()));
  templates::Built built;
  built.snapshot = snap.id;
  built.config = base.config;
  progress("removing the build's environment");
  return built;
}

void Api::endOrphanedTemplateBuilds() {
  if (!templates_) return;
  auto all = environments_.list({});
  if (all.ok()) {
    for (const auto& e : all.value()) {
      if (e.labels.count(std::string(kTemplateBuildLabel)) == 0) continue;
      if (e.state == store::EnvironmentState::kGone || e.state == store::EnvironmentState::kFailed) continue;
      (void)environments_.destroy(e.id, "the template build it ran ended with the moatd that held it", "moatd");
    }
  }
  // Template snapshots no ready template names: left by a build cut short.
  auto snaps = snapshots_.snapshots("", "");
  if (!snaps.ok()) return;
  for (const auto& s : snaps.value()) {
    if (s.owner.rfind("template:", 0) != 0) continue;
    auto t = templates_->get(s.owner.substr(9));
    bool kept =
        t.ok() && t->record.state == store::TemplateState::kReady && templates::builtSnapshot(t->record) == s.id;
    if (!kept) (void)snapshots_.deleteSnapshot(s.id, "moatd");
  }
}

}  // namespace moat::api
