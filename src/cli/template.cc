// moat template: named templates from OCI images and recipes (docs/TEMPLATES.md).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "os/file.h"

namespace moat::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kTemplateUsage =
    R"(usage: moat template import SOURCE --name NAME [--no-wait]
                                           import an OCI image as template NAME, showing
                                           progress until it is ready (or failed)
       moat template build --name NAME --base BASE --run LINE [--run LINE...]
                           [--env K=V...] [-f RECIPE.json] [--no-wait]
                                           build template NAME from a recipe: an
                                           environment of BASE runs each LINE with
                                           /bin/sh -c (under your key's permissions),
                                           then is snapshotted as NAME; progress is
                                           shown until it is ready (or failed)
       moat template ls                    the templates
       moat template rm NAME...            delete templates (refused while in use)

  SOURCE  docker-archive:FILE   what `docker save` writes
          oci-archive:FILE      an OCI image layout as a tar
          oci:DIR[:TAG]         an OCI image layout directory
          docker://REF          pulled from a registry (when moatd's host reaches it)
          (FILE and DIR are paths on moatd's host: master token only)
  BASE    host, a template's name, or (master token) a root directory
  RECIPE  a JSON file: {"base": ..., "run": [...], "env": {...}} (the body's
          "build"); --base, --run and --env add to or override it
  --json   print moatd's JSON instead (import, build, ls)

Environments use one with `moat env create --template NAME`. Keys need the
'templates' scope to import or delete (ls: 'read').

)";

struct TemplateOptions : Parsed {
  bool wait = true;
  std::string name;
  std::string base;
  std::string recipeFile;
  std::vector<std::string> run;
  std::map<std::string, std::string> env;
};

Status parseTemplateArgs(const std::vector<std::string>& args, const std::string& sub, TemplateOptions& out) {
  const bool importing = sub == "import", building = sub == "build";
  return parseArgs(args, out, [&](FlagReader& flags, bool& matched) -> Status {
    const std::string& name = flags.name();
    matched = true;
    if (name == "--name" && (importing || building)) {
      MOAT_ASSIGN(out.name, flags.value());
    } else if (name == "--base" && building) {
      MOAT_ASSIGN(out.base, flags.value());
    } else if (name == "--run" && building) {
      MOAT_ASSIGN(std::string line, flags.value());
      out.run.push_back(line);
    } else if ((name == "-f" || name == "--file") && building) {
      MOAT_ASSIGN(out.recipeFile, flags.value());
    } else if (name == "--env" && building) {
      MOAT_ASSIGN(std::string kv, flags.value());
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) return usageError("--env takes K=V, not '" + kv + "'");
      out.env[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else if (name == "--no-wait" && (importing || building)) {
      MOAT_TRY(flags.noValue());
      out.wait = false;
    } else {
      matched = false;
    }
    return {};
  });
}

// A name as a path segment (':' is fine in one).
Result<std::string> templatePath(const std::string& name) {
  if (name.empty() || name.size() > 64 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789._:-") != std::string::npos) {
    return usageError("'" + name + "' is not a template name (a-z 0-9 . _ : -, at most 64)");
  }
  return "/v1/templates/" + name;
}

std::string humanBytes(uint64_t n) {
  char buf[32];
  if (n >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(n) / (1ull << 30));
  } else if (n >= (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(n) / (1u << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(n >> 10));
  }
  return buf;
}

void printTemplates(const json& list) {
  std::printf("%-24s  %-9s  %-10s  %s\n", "NAME", "STATE", "SIZE", "SOURCE");
  for (const auto& t : list) {
    std::string size = t.contains("size_bytes") ? humanBytes(t["size_bytes"].get<uint64_t>()) : "-";
    std::printf("%-24s  %-9s  %-10s  %s\n", t.value("name", "").c_str(), t.value("state", "").c_str(), size.c_str(),
                t.value("source", "").c_str());
    if (t.contains("error")) std::printf("  error: %s\n", t["error"].value("message", "").c_str());
  }
}

}  // namespace

int templateCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kTemplateUsage, stderr);
    return kExitUsage;
  }
  const std::string sub = args[0];
  if (sub == "-h" || sub == "--help" || sub == "help") {
    std::fputs(kTemplateUsage, stdout);
    std::fputs(connectionUsage(), stdout);
    return 0;
  }
  const std::string what = "template " + sub;
  const std::map<std::string, std::pair<size_t, size_t>> arity = {{"import", {1, 1}}, {"build", {0, 0}},
                                                                  {"ls", {0, 0}},     {"list", {0, 0}},
                                                                  {"rm", {1, 1000}},  {"remove", {1, 1000}}};
  auto known = arity.find(sub);
  if (known == arity.end()) {
    std::fprintf(stderr, "moat template: unknown command '%s' (import, build, ls or rm; see moat template --help)\n",
                 sub.c_str());
    return kExitUsage;
  }
  TemplateOptions o;
  Status s = parseTemplateArgs(std::vector<std::string>(args.begin() + 1, args.end()), sub, o);
  if (s.ok() && !o.help && (o.positional.size() < known->second.first || o.positional.size() > known->second.second)) {
    s = usageError("wrong number of arguments (see moat template --help)");
  }
  if (s.ok() && !o.help && (sub == "import" || sub == "build") && o.name.empty()) {
    s = usageError("--name NAME is required");
  }
  json recipe = json::object();
  if (s.ok() && !o.help && sub == "build") {
    if (!o.recipeFile.empty()) {
      auto text = os::readFile(o.recipeFile);
      if (!text.ok()) return reportFailure(what, text.error());
      recipe = json::parse(text.value(), nullptr, false);
      if (!recipe.is_object()) return reportFailure(what, usageError(o.recipeFile + ": not a JSON object"));
    }
    if (!o.base.empty()) recipe["base"] = o.base;
    for (const auto& line : o.run) recipe["run"].push_back(line);
    for (const auto& [k, v] : o.env) recipe["env"][k] = v;
    if (!recipe.contains("base")) s = usageError("--base BASE is required (or \"base\" in the recipe file)");
    if (s.ok() && !recipe.contains("run")) s = usageError("at least one --run LINE (or \"run\" in the recipe file)");
  }
  if (!s.ok()) return reportFailure(what, s.error());
  if (o.help) {
    std::fputs(kTemplateUsage, stdout);
    return 0;
  }
  auto client = Client::fromOptions(o.connection);
  if (!client.ok()) return reportFailure(what, client.error());

  if (sub == "rm" || sub == "remove") return deleteEach(client.value(), what, o.positional, templatePath);
  if (sub == "ls" || sub == "list") {
    auto listed = call(client.value(), "GET", "/v1/templates", "", 200);
    if (!listed.ok()) return reportFailure(what, listed.error());
    json list = listed->value("templates", json::array());
    if (o.json) {
      std::puts(list.dump(2).c_str());
    } else {
      printTemplates(list);
    }
    return 0;
  }
  auto path = templatePath(o.name);
  if (!path.ok()) return reportFailure(what, path.error());
  json body =
      sub == "build" ? json{{"name", o.name}, {"build", recipe}} : json{{"name", o.name}, {"source", o.positional[0]}};
  auto started = call(client.value(), "POST", "/v1/templates", body.dump(), 202);
  if (!started.ok()) return reportFailure(what, started.error());
  json t = started.value();
  // Progress on stderr while it imports (one line, rewritten on a terminal).
  const bool tty = ::isatty(2);
  std::string last;
  while (o.wait && (t.value("state", "") == "importing" || t.value("state", "") == "building")) {
    std::string line = t.value("state", "");
    if (t.contains("progress")) {
      line += ": " + t["progress"].value("stage", "");
      if (t["progress"].contains("bytes")) line += " (" + humanBytes(t["progress"]["bytes"].get<uint64_t>()) + ")";
    }
    if (line != last) {
      std::fprintf(stderr, tty ? "\r\033[K%s" : "%s\n", line.c_str());
      last = line;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // polling GET: nothing to wait on
    auto now = call(client.value(), "GET", path.value(), "", 200);
    if (!now.ok()) return reportFailure(what, now.error());
    t = now.value();
  }
  if (tty && !last.empty()) std::fputs("\r\033[K", stderr);
  if (o.json) {
    std::puts(t.dump(2).c_str());
  } else if (t.value("state", "") == "failed") {
    std::fprintf(stderr, "moat template %s: %s failed: %s\n", sub.c_str(), o.name.c_str(),
                 t.contains("error") ? t["error"].value("message", "").c_str() : "");
  } else {
    std::printf("%s  %s%s\n", o.name.c_str(), t.value("state", "").c_str(),
                t.contains("size_bytes") ? ("  " + humanBytes(t["size_bytes"].get<uint64_t>())).c_str() : "");
  }
  return t.value("state", "") == "failed" ? 1 : 0;
}

}  // namespace moat::cli
