#include <nlohmann/json.hpp>

#include "api/api.h"
#include "api/validation.h"
#include "templates/catalog.h"

// /v1/templates and /v1/templates/{name}: named templates from OCI images
// (docs/TEMPLATES.md). Listing needs the read scope; importing and deleting
// the templates scope (the route table), and sources naming a host path the
// master token.
namespace moat::api {

// Also template_build.cc's. A host path is the master's to see: a key is
// shown the transport only, and no failure's text (a tool's stderr could
// quote the host's files).
json templateJson(const templates::TemplateView& v, const Principal& viewer) {
  const store::TemplateRecord& r = v.record;
  auto source = templates::parseSource(r.source);
  const bool hidden = !viewer.master && source.ok() && source->namesHostPath();
  json config = json::parse(r.config, nullptr, false);
  templates::ImageConfig c = templates::configFromJson(config.is_discarded() ? json::object() : config);
  json out = {{"name", r.name},
              {"source", hidden ? source->transport + ":" : r.source},
              {"state", store::stateName(r.state)},
              {"created_at", timestamp(r.createdAtMs)},
              {"config",
               {{"env", c.env},
                {"working_dir", c.workingDir},
                {"user", c.user},
                {"entrypoint", c.entrypoint},
                {"cmd", c.cmd}}}};
  if (r.state == store::TemplateState::kReady) out["size_bytes"] = r.sizeBytes;
  if (r.state == store::TemplateState::kFailed) {
    out["error"] = {
        {"code", r.errorCode},
        {"message", hidden ? "the import from a host path failed; the master token sees why" : r.errorMessage}};
  }
  if (v.progress) {
    out["progress"] = {{"stage", v.progress->stage}};
    if (v.progress->bytes) out["progress"]["bytes"] = v.progress->bytes;
  }
  return out;
}

namespace {

json hostTemplateJson() {
  return {{"name", "host"},
          {"source", "builtin"},
          {"state", "ready"},
          {"created_at", timestamp(0)},
          {"config",
           {{"env", json::array()},
            {"working_dir", ""},
            {"user", ""},
            {"entrypoint", json::array()},
            {"cmd", json::array()}}}};
}

// A path segment as sent: ':' may arrive as %3A.
std::string decoded(const std::string& segment) {
  std::string out;
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] == '%' && i + 2 < segment.size() && std::isxdigit(static_cast<unsigned char>(segment[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(segment[i + 2]))) {
      out += static_cast<char>(std::stoi(segment.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += segment[i];
    }
  }
  return out;
}

}  // namespace

HttpResponse Api::templatesRoute(const HttpRequest& req, const Principal& principal, const std::string& nameSegment) {
  if (!templates_) return errorResponse({503, "unavailable", "templates are not served by this moatd", ""});
  const std::string name = decoded(nameSegment);
  if (name.empty() && req.method == "GET") {
    auto list = templates_->list();
    if (!list.ok()) return errorResponse(fromError(list.error()));
    json arr = json::array({hostTemplateJson()});
    for (const auto& v : list.value()) arr.push_back(templateJson(v, principal));
    return respond(200, {{"templates", arr}});
  }
  if (name.empty() && req.method == "POST") {
    ApiError perr{};
    auto body = parseObject(req.body, perr);
    if (!body.ok()) return errorResponse(perr);
    const json& j = body.value();
    if (auto e = onlyFields(j, {"name", "source", "build"}, "")) return errorResponse(*e);
    if (!j.contains("name") || !j["name"].is_string()) return errorResponse(invalid("name", "required: a string"));
    if (j.contains("build")) {
      if (j.contains("source")) return errorResponse(invalid("source", "a template has a source or a build, not both"));
      return startTemplateBuild(req, principal, j);
    }
    if (!j.contains("source") || !j["source"].is_string()) {
      return errorResponse(
          invalid("source", "required: docker-archive:FILE, oci-archive:FILE, oci:DIR[:TAG] or docker://REF"));
    }
    const std::string source = j["source"];
    auto parsed = templates::parseSource(source);
    if (!parsed.ok()) return errorResponse(invalid("source", parsed.error().message().substr(8)));
    // A host path is read by moatd as root: only its master may name one.
    if (parsed->namesHostPath() && !principal.master) {
      return errorResponse({403, "forbidden",
                            "source: only the master token may import from a host path (" + parsed->transport +
                                ":); a key may use docker://REF",
                            "source"});
    }
    auto started = templates_->import(j["name"], source, principal.owner());
    if (!started.ok()) {
      ApiError e = fromError(started.error());
      if (started.error().code == Code::kInvalidRequest) e.field = "name";
      return errorResponse(e);
    }
    audit_.record("template.import_started", "", principal.owner(), {{"template", j["name"]}, {"source", source}});
    return respond(202, templateJson(started.value(), principal));
  }
  if (name == "host") {
    if (req.method == "GET") return respond(200, hostTemplateJson());
    return errorResponse({409, "conflict", "the built-in template host cannot be deleted", ""});
  }
  if (req.method == "GET") {
    auto v = templates_->get(name);
    if (!v.ok()) return errorResponse(fromError(v.error()));
    return respond(200, templateJson(v.value(), principal));
  }
  // DELETE. A key deletes only what it imported.
  auto v = templates_->get(name);
  if (!v.ok()) return errorResponse(fromError(v.error()));
  if (!principal.master && v->record.owner != principal.keyId) {
    return errorResponse({403, "forbidden",
                          "template " + name + " was made by another key; only it or the master token may delete it",
                          ""});
  }
  Status s = templates_->remove(name);
  if (!s.ok()) return errorResponse(fromError(s.error()));
  audit_.record("template.deleted", "", principal.owner(), {{"template", name}});
  return noContent();
}

}  // namespace moat::api
