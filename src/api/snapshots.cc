#include "api/api.h"
#include "api/validation.h"
#include "mcp/session.h"

// Snapshots, forks and restores (docs/API.md, "Snapshots"): a snapshot is
// an environment's files at one point in time; a fork is a new environment
// from a running one's files and settings; a restore puts an environment's
// files back as a snapshot has them.
namespace moat::api {
namespace {

// What the gate sees of an operation on every file of an environment.
gate::Action wholeTree(gate::Scope scope, const std::string& op) {
  gate::Action action;
  action.scope = scope;
  action.path = "/";
  action.op = op;
  action.tree = true;
  return action;
}

json snapshotJson(const store::SnapshotRecord& s) {
  return {{"id", s.id},
          {"environment_id", s.environment},
          {"name", s.name},
          {"template", s.templateName},
          {"storage_gb", s.storageGb},
          {"isolation", s.isolation},
          {"created_at", timestamp(s.createdAtMs)}};
}

// "snap-" and 12 lowercase hex digits: anything else names no snapshot
// (and never reaches a path in the storage pool).
bool validSnapshotId(const std::string& id) {
  return id.size() == 17 && id.compare(0, 5, "snap-") == 0 &&
         id.find_first_not_of("0123456789abcdef", 5) == std::string::npos;
}

json changeJson(const isolation::fs::LayerChange& c) {
  using Kind = isolation::fs::LayerChange::Kind;
  const char* type = c.type == 'f' ? "file" : c.type == 'd' ? "directory" : c.type == 'l' ? "symlink" : "other";
  json j = {{"path", c.path},
            {"change", c.kind == Kind::kAdded      ? "added"
                       : c.kind == Kind::kModified ? "modified"
                                                   : "deleted"},
            {"type", type}};
  if (c.type != 'd') {  // a directory's size says nothing of what it holds
    if (c.kind != Kind::kDeleted) j["size"] = c.size;
    if (c.kind != Kind::kAdded) j["size_before"] = c.sizeBefore;
  }
  if (c.type == 'l') j["target"] = c.target;
  if (!c.modeChange.empty()) j["mode"] = c.modeChange;
  if (!c.diff.empty()) j["diff"] = c.diff;
  if (!c.diffOmitted.empty()) j["diff_omitted"] = c.diffOmitted;
  return j;
}

}  // namespace

HttpResponse Api::changesRoute(const HttpRequest& req, const Principal& principal, const std::string& id) {
  if (auto e = onlyQuery(req, {"against", "diff"})) return errorResponse(*e);
  std::string against = "template";
  if (auto it = req.query.find("against"); it != req.query.end() && !it->second.empty()) against = it->second;
  if (against != "template" && !validSnapshotId(against)) {
    return errorResponse(invalid("against", "'template' or a snapshot id (snap- and 12 hex digits)"));
  }
  bool diffs = true;
  if (req.query.count("diff")) {
    const std::string& d = req.query.at("diff");
    if (d != "0" && d != "1") return errorResponse(invalid("diff", "0 or 1"));
    diffs = d == "1";
  }
  if (against != "template" && !visibleSnapshot(principal, against).ok()) {
    return errorResponse({404, "not_found", "no snapshot " + against, "against"});
  }
  // It shows what every changed file holds: the gate's read_file for the
  // whole tree, as a snapshot.
  if (auto answer = check(req, principal, id, wholeTree(gate::Scope::kReadFile, "changes"))) return *answer;
  isolation::fs::LayerChangeLimits limits;
  limits.diffs = diffs;
  auto changes = snapshots_.changes(id, against == "template" ? "" : against, limits);
  if (!changes.ok()) return errorResponse(fromError(changes.error()));
  // It reads what every changed file holds: recorded as any read is.
  audit_.record("file.read", id, principal.owner(),
                {{"path", "/"},
                 {"op", "changes"},
                 {"against", against},
                 {"entries", changes->changes.size()},
                 {"truncated", changes->truncated}});
  json list = json::array();
  for (const auto& c : changes->changes) list.push_back(changeJson(c));
  return respond(
      200,
      {{"environment", id}, {"against", against}, {"truncated", changes->truncated}, {"changes", std::move(list)}});
}

std::optional<ApiError> snapshotField(const json& body, const char* field, std::string& out) {
  if (!body.contains(field)) return invalid(field, "required");
  if (!body[field].is_string() || !validSnapshotId(body[field].get<std::string>())) {
    return invalid(field, "must be a snapshot id (snap- and 12 hex digits)");
  }
  out = body[field].get<std::string>();
  return std::nullopt;
}

Result<store::SnapshotRecord> Api::visibleSnapshot(const Principal& principal, const std::string& id) {
  MOAT_ASSIGN(auto snap, snapshots_.getSnapshot(id));
  if (!principal.master && snap.owner != principal.keyId) return Error::make(Code::kNotFound, "no snapshot " + id);
  return snap;
}

// /v1/snapshots and /v1/snapshots/{id}: a key sees only its own.
HttpResponse Api::snapshotsRoute(const HttpRequest& req, const Principal& principal) {
  std::string id = pathSegment(req.path, 2);
  if (pathSegment(req.path, 3) != "") return errorResponse({404, "not_found", "no such endpoint: " + req.path, ""});
  if (id.empty()) {
    if (auto e = onlyQuery(req, {"environment_id"})) return errorResponse(*e);
    std::string environment;
    if (auto it = req.query.find("environment_id"); it != req.query.end()) environment = it->second;
    auto list = snapshots_.snapshots(principal.master ? "" : principal.keyId, environment);
    if (!list.ok()) return errorResponse(fromError(list.error()));
    json arr = json::array();
    for (const auto& s : list.value()) arr.push_back(snapshotJson(s));
    return respond(200, {{"snapshots", arr}});
  }
  if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  auto snap = validSnapshotId(id) ? visibleSnapshot(principal, id)
                                  : Result<store::SnapshotRecord>(Error::make(Code::kNotFound, "no snapshot " + id));
  if (!snap.ok()) return errorResponse(fromError(snap.error()));
  if (req.method == "GET") return respond(200, snapshotJson(snap.value()));
  // A built template's (a key never sees one): it goes with the template.
  if (snap->owner.rfind("template:", 0) == 0) {
    return errorResponse({409, "conflict",
                          "snapshot " + id + " belongs to template " + snap->owner.substr(9) +
                              "; it is deleted with it (DELETE /v1/templates/" + snap->owner.substr(9) + ")",
                          ""});
  }
  Status s = snapshots_.deleteSnapshot(id, principal.owner());
  if (!s.ok()) return errorResponse(fromError(s.error()));
  return noContent();
}

// /v1/environments/{id}/snapshots, /restore and /fork (the caller owns the
// environment and holds the scope: checked by route()).
HttpResponse Api::environmentSnapshotsRoute(const HttpRequest& req, const Principal& principal, const std::string& id,
                                            const std::string& sub) {
  if (auto e = onlyQuery(req, {})) return errorResponse(*e);
  ApiError perr{};
  if (sub == "snapshots") {
    if (req.method == "GET") {
      auto list = snapshots_.snapshots(principal.master ? "" : principal.keyId, id);
      if (!list.ok()) return errorResponse(fromError(list.error()));
      json arr = json::array();
      for (const auto& s : list.value()) arr.push_back(snapshotJson(s));
      return respond(200, {{"snapshots", arr}});
    }
    auto body = parseObject(req.body, perr);
    if (!body.ok()) return errorResponse(perr);
    if (auto e = onlyFields(body.value(), {"name"}, "")) return errorResponse(*e);
    std::string name;
    if (body->contains("name")) {
      const json& n = (*body)["name"];
      if (!n.is_string() || n.get<std::string>().size() > 256) {
        return errorResponse(invalid("name", "must be a string of at most 256 bytes"));
      }
      name = n.get<std::string>();
    }
    // A snapshot reads every file (and a create from it shows them under
    // other permissions): the gate's read_file for the whole tree.
    if (auto answer = check(req, principal, id, wholeTree(gate::Scope::kReadFile, "snapshot"))) return *answer;
    auto snap = snapshots_.snapshot(id, name, principal.owner());
    if (!snap.ok()) return errorResponse(fromError(snap.error()));
    return respond(201, snapshotJson(snap.value()));
  }
  auto body = parseObject(req.body, perr);
  if (!body.ok()) return errorResponse(perr);
  if (sub == "restore") {
    if (auto e = onlyFields(body.value(), {"snapshot"}, "")) return errorResponse(*e);
    std::string snapshotId;
    if (auto e = snapshotField(body.value(), "snapshot", snapshotId)) return errorResponse(*e);
    if (!visibleSnapshot(principal, snapshotId).ok()) {
      return errorResponse({404, "not_found", "no snapshot " + snapshotId, "snapshot"});
    }
    // A restore rewrites every file: the gate's write_file for the whole tree.
    if (auto answer = check(req, principal, id, wholeTree(gate::Scope::kWriteFile, "restore"))) return *answer;
    auto restored = snapshots_.restore(id, snapshotId, principal.owner());
    if (!restored.ok()) return errorResponse(fromError(restored.error()));
    return respond(200, environmentJson(restored.value()));
  }
  // fork
  if (auto e = onlyFields(body.value(), {"task_id", "labels", "ttl_s", "memory", "count"}, ""))
    return errorResponse(*e);
  manager::ForkRequest fork;
  fork.owner = principal.owner();
  if (body->contains("task_id")) {
    const json& t = (*body)["task_id"];
    if (!t.is_string() || t.get<std::string>().size() > 256) {
      return errorResponse(invalid("task_id", "must be a string of at most 256 bytes"));
    }
    fork.taskId = t.get<std::string>();
  }
  if (body->contains("labels")) {
    std::map<std::string, std::string> labels;
    if (auto e = stringMap((*body)["labels"], "labels", false, labels)) return errorResponse(*e);
    fork.labels = labels;
  }
  if (body->contains("ttl_s")) {
    if (auto e = number((*body)["ttl_s"], "ttl_s", 1, static_cast<double>(environments_.config().maxTtlS), true,
                        fork.ttlS)) {
      return errorResponse(*e);
    }
  }
  if (body->contains("memory")) {
    if (!(*body)["memory"].is_boolean()) return errorResponse(invalid("memory", "must be true or false"));
    fork.memory = (*body)["memory"].get<bool>();
  }
  const bool many = body->contains("count");
  if (many) {
    double count = 0;
    if (auto e = number((*body)["count"], "count", 1, static_cast<double>(manager::kMaxForkCount), true, count)) {
      return errorResponse(*e);
    }
    fork.count = static_cast<size_t>(count);
  }
  if (!fork.labels) {
    // The source's labels, but not the mark of a /mcp session's own
    // environment: a fork outlives the session (a restarted moatd destroys
    // what carries that mark).
    auto source = environments_.get(id);
    if (!source.ok()) return errorResponse(fromError(source.error()));
    fork.labels = source->labels;
    if (auto it = fork.labels->find(mcp::kSessionLabel); it != fork.labels->end() && it->second == mcp::kMoatdSession) {
      fork.labels->erase(it);
    }
  }
  auto created = snapshots_.fork(id, fork);
  if (!created.ok()) return errorResponse(fromError(created.error()));
  if (!many) return respond(201, environmentJson(created->front()));
  json list = json::array();
  for (const auto& made : created.value()) list.push_back(environmentJson(made));
  return respond(201, {{"environments", std::move(list)}});
}

}  // namespace moat::api
