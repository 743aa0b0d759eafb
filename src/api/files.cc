#include <cstring>

#include "api/api.h"
#include "api/keys.h"
#include "api/validation.h"

// /v1/environments/{id}/files: moat-init resolves every path inside the
// environment's root (docs/API.md).
namespace moat::api {
namespace {

// What the audit log records of a file operation moat-init answered: the
// type and its data (with "error" when it failed).
std::pair<const char*, json> fileEvent(const init::FileRequest& f, const init::FileResult& r) {
  const char* type = "file.read";
  json data = {{"path", f.path}};
  switch (f.op) {
    case init::FileOp::kRead:
      data["offset"] = r.err != 0 ? f.offset : r.offset;  // where the bytes read begin (after a skipped hole too)
      data["size"] = r.data.size();
      break;
    case init::FileOp::kWrite:
      type = "file.written";
      data["size"] = f.data.size();
      data["sha256"] = sha256Hex(f.data);
      data["append"] = (f.flags & init::kFileAppend) != 0;
      data["mode"] = f.mode;
      break;
    case init::FileOp::kStat:
      data["op"] = "stat";
      break;
    case init::FileOp::kList:
      data["op"] = "list";
      data["entries"] = r.entries.size();
      break;
    case init::FileOp::kMkdir:
      type = "dir.created";
      data["parents"] = (f.flags & init::kFileCreateParents) != 0;
      break;
    case init::FileOp::kRemove:
      type = "file.removed";
      data["recursive"] = (f.flags & init::kFileRecursive) != 0;
      break;
    case init::FileOp::kRename:
      type = "file.moved";
      data = {{"from", f.path}, {"to", f.target}};
      break;
    case init::FileOp::kSync:  // moatd's own (a snapshot's): no route asks for it
      data["op"] = "sync";
      break;
    case init::FileOp::kPause:  // moatd's own (a pause's, the stats'), and no file's
    case init::FileOp::kResume:
    case init::FileOp::kTasks:
    case init::FileOp::kClock:
    case init::FileOp::kQuiesce:
    case init::FileOp::kChanges:  // moatd's own (a review's: the route records it)
      data["op"] = f.op == init::FileOp::kPause     ? "pause"
                   : f.op == init::FileOp::kResume  ? "resume"
                   : f.op == init::FileOp::kTasks   ? "tasks"
                   : f.op == init::FileOp::kClock   ? "clock"
                   : f.op == init::FileOp::kChanges ? "changes"
                                                    : "quiesce";
      break;
  }
  if (r.err != 0) {
    data.erase("size");
    data.erase("entries");
    data["error"] = r.message.empty() ? std::string(std::strerror(r.err)) : r.message;
  }
  return {type, std::move(data)};
}

}  // namespace

HttpResponse Api::filesRoute(const HttpRequest& req, const Principal& principal, const std::string& id,
                             const std::string& subsub) {
  ApiError perr{};
  auto fileCall = [&](init::FileRequest f) -> HttpResponse {
    // The gate: reads (read, stat, list) are read_file; everything that
    // changes the tree is write_file, for both ends of a move.
    bool reads = f.op == init::FileOp::kRead || f.op == init::FileOp::kStat || f.op == init::FileOp::kList;
    static const char* opNames[] = {"", "read", "write", "stat", "list", "mkdir", "remove", "move"};
    // A move also reads what it moves (elsewhere it may be read): read_file
    // for its source tree first.
    std::vector<std::pair<std::string, gate::Scope>> paths;
    if (f.op == init::FileOp::kRename) paths.emplace_back(f.path, gate::Scope::kReadFile);
    paths.emplace_back(f.path, reads ? gate::Scope::kReadFile : gate::Scope::kWriteFile);
    if (f.op == init::FileOp::kRename) paths.emplace_back(f.target, gate::Scope::kWriteFile);
    for (const auto& [path, scope] : paths) {
      gate::Action action;
      action.scope = scope;
      action.path = gate::normalizePath(path);
      action.size = f.data.size();
      if (f.op == init::FileOp::kWrite) action.sha256 = sha256Hex(f.data);  // approved: these bytes only
      action.op = opNames[static_cast<int>(f.op)];
      // What a recursive remove or a move reaches: everything below too.
      action.tree =
          f.op == init::FileOp::kRename || (f.op == init::FileOp::kRemove && (f.flags & init::kFileRecursive) != 0);
      if (auto answer = check(req, principal, id, action)) return *answer;
    }
    auto r = commands_.file(id, f);
    if (!r.ok()) return errorResponse(fromError(r.error()));
    auto [type, data] = fileEvent(f, r.value());
    audit_.record(type, id, principal.owner(), std::move(data));
    if (r->err != 0) {
      int status = r->err == ENOENT                        ? 404
                   : (r->err == EACCES || r->err == EPERM) ? 403
                   : r->err == EDQUOT || r->err == ENOSPC  ? 507
                                                           : 400;
      std::string code = r->err == ENOENT ? "not_found"
                                          : (status == 403   ? "forbidden"
                                             : status == 507 ? "no_space"
                                                             : "file_error");
      return errorResponse({status, code, r->message, "path"});
    }
    HttpResponse ok;
    ok.status = 200;
    if (f.op == init::FileOp::kRead) {
      ok.contentType = "application/octet-stream";
      ok.body = r->data;
      // Where these bytes begin (past the holes skip_holes=1 skipped) and
      // how large the file was when read: a copy that skips holes ends there.
      ok.headers.emplace_back("X-Moat-Offset", std::to_string(r->offset));
      ok.headers.emplace_back("X-Moat-File-Size", std::to_string(r->info.size));
      return ok;
    }
    auto info = [](const init::FileInfo& i) {
      std::string type = i.type == 'f' ? "file" : i.type == 'd' ? "dir" : i.type == 'l' ? "symlink" : "other";
      return json{{"name", i.name}, {"type", type}, {"size", i.size}, {"mode", i.mode}, {"mtime", i.mtimeSec}};
    };
    if (f.op == init::FileOp::kList) {
      // A name is something read: an entry whose read read_file denies is
      // left out, so a denied tree's names do not show in its listing.
      json arr = json::array();
      std::string dir = gate::normalizePath(f.path);
      for (const auto& e : r->entries) {
        gate::Action entry;
        entry.scope = gate::Scope::kReadFile;
        entry.op = "list";
        entry.path = gate::normalizePath(dir + "/" + e.name);
        auto verdict = permissionLayers_.evaluate(id, entry, principal.ceiling.get());
        if (verdict.ok() && verdict->decision == gate::Decision::kDeny) continue;
        arr.push_back(info(e));
      }
      return respond(200, {{"path", f.path}, {"entries", arr}});
    }
    if (f.op == init::FileOp::kStat) return respond(200, info(r->info));
    return respond(200, {{"ok", true}, {"path", f.path}});
  };
  init::FileRequest f;
  auto pathParam = [&]() -> std::optional<ApiError> {
    auto it = req.query.find("path");
    if (it == req.query.end()) return invalid("path", "required query parameter");
    return absolutePath(json(it->second), "path", f.path);
  };
  if (subsub.empty()) {
    if (auto e = pathParam()) return errorResponse(*e);
    if (req.method == "GET") {
      if (auto e = onlyQuery(req, {"path", "offset", "length", "skip_holes"})) return errorResponse(*e);
      f.op = init::FileOp::kRead;
      if (auto e = queryNumber(req, "offset", 1ULL << 53, 10, f.offset)) return errorResponse(*e);
      if (auto e = queryNumber(req, "length", 1ULL << 53, 10, f.length)) return errorResponse(*e);
      bool skipHoles = false;
      if (auto e = queryFlag(req, "skip_holes", skipHoles)) return errorResponse(*e);
      if (skipHoles) f.flags = init::kFileSkipHoles;
      return fileCall(f);
    }
    if (req.method == "PUT") {
      f.op = init::FileOp::kWrite;
      f.data = req.body;
      f.flags = init::kFileCreateParents;
      if (auto e = onlyQuery(req, {"path", "append", "mode"})) return errorResponse(*e);
      bool append = false;
      if (auto e = queryFlag(req, "append", append)) return errorResponse(*e);
      if (append) f.flags |= init::kFileAppend;
      uint64_t mode = 0644;
      if (auto e = queryNumber(req, "mode", 0777, 8, mode)) return errorResponse(*e);
      f.mode = static_cast<uint32_t>(mode);
      if (f.data.size() > (16u << 20))
        return errorResponse({413, "too_large", "files over 16 MiB: write in parts with append=1", ""});
      return fileCall(f);
    }
    if (req.method == "DELETE") {
      f.op = init::FileOp::kRemove;
      if (auto e = onlyQuery(req, {"path", "recursive"})) return errorResponse(*e);
      bool recursive = false;
      if (auto e = queryFlag(req, "recursive", recursive)) return errorResponse(*e);
      if (recursive) f.flags = init::kFileRecursive;
      return fileCall(f);
    }
    return wrongMethod(req, "GET, PUT or DELETE");
  }
  if (subsub == "list" || subsub == "stat") {
    if (auto e = onlyQuery(req, {"path"})) return errorResponse(*e);
    if (auto e = pathParam()) return errorResponse(*e);
    f.op = subsub == "list" ? init::FileOp::kList : init::FileOp::kStat;
    return fileCall(f);
  }
  if (subsub == "mkdir" || subsub == "move") {
    auto body = parseObject(req.body, perr);
    if (!body.ok()) return errorResponse(perr);
    const json& j = body.value();
    if (subsub == "mkdir") {
      if (auto e = onlyFields(j, {"path", "parents"}, "")) return errorResponse(*e);
      if (!j.contains("path")) return errorResponse(invalid("path", "required"));
      if (auto e = absolutePath(j["path"], "path", f.path)) return errorResponse(*e);
      f.op = init::FileOp::kMkdir;
      f.mode = 0755;
      if (j.contains("parents")) {
        if (!j["parents"].is_boolean()) return errorResponse(invalid("parents", "must be true or false"));
        if (j["parents"].get<bool>()) f.flags = init::kFileCreateParents;
      }
      return fileCall(f);
    }
    if (auto e = onlyFields(j, {"from", "to"}, "")) return errorResponse(*e);
    if (!j.contains("from")) return errorResponse(invalid("from", "required"));
    if (!j.contains("to")) return errorResponse(invalid("to", "required"));
    if (auto e = absolutePath(j["from"], "from", f.path)) return errorResponse(*e);
    if (auto e = absolutePath(j["to"], "to", f.target)) return errorResponse(*e);
    f.op = init::FileOp::kRename;
    return fileCall(f);
  }
  return errorResponse({404, "not_found", "no such endpoint: " + req.path, ""});
}

}  // namespace moat::api
