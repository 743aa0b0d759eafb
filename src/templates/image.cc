#include "templates/image.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "os/file.h"
#include "os/tree.h"
#include "os/users.h"

namespace moat::templates {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxJson = 4u << 20;

bool validDigest(const std::string& d) {
  if (d.size() != 71 || d.compare(0, 7, "sha256:") != 0) return false;
  for (size_t i = 7; i < d.size(); ++i) {
    char c = d[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Result<std::string> blobPath(const std::string& layout, const json& descriptor, const std::string& what) {
  if (!descriptor.is_object() || !descriptor.contains("digest") || !descriptor["digest"].is_string()) {
    return Error::make(Code::kInvalidArgument, "the image's " + what + " has no digest");
  }
  std::string digest = descriptor["digest"];
  if (!validDigest(digest)) {
    return Error::make(Code::kInvalidArgument, "the image's " + what + " has an unsupported digest '" +
                                                   digest.substr(0, 80) + "' (sha256 only)");
  }
  return layout + "/blobs/sha256/" + digest.substr(7);
}

Result<json> readJson(const std::string& path, const std::string& what) {
  MOAT_ASSIGN(UniqueFd fd, os::open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  MOAT_ASSIGN(struct stat st, os::statFd(fd.get()));
  if (!S_ISREG(st.st_mode)) return Error::make(Code::kInvalidArgument, "the image's " + what + " is not a file");
  MOAT_ASSIGN(os::ReadBytes bytes, os::readUpTo(fd.get(), kMaxJson));
  if (bytes.truncated) return Error::make(Code::kTooLarge, "the image's " + what + " is over 4 MiB");
  json j = json::parse(bytes.data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Error::make(Code::kInvalidArgument, "the image's " + what + " is not a JSON object");
  }
  return j;
}

Status stringList(const json& j, const char* key, std::vector<std::string>& out) {
  if (!j.contains(key) || j[key].is_null()) return {};
  if (!j[key].is_array())
    return Error::make(Code::kInvalidArgument, std::string("image config: ") + key + " is not a list");
  for (const auto& v : j[key]) {
    if (!v.is_string())
      return Error::make(Code::kInvalidArgument, std::string("image config: ") + key + " holds a non-string");
    out.push_back(v.get<std::string>());
  }
  return {};
}

std::optional<uint32_t> numeric(const std::string& s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > 65535) return std::nullopt;  // an environment maps 65536 ids
  return static_cast<uint32_t>(v);
}

// A file of the image's tree (resolved inside it, never out); empty when absent
// or not a regular file. O_NONBLOCK: an image's /etc/passwd may be a FIFO,
// whose open would wait for a writer for ever (and hold the import's slot).
std::string imageFile(int rootFd, const std::string& path) {
  auto fd = os::openAt(rootFd, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY,
                       RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV);
  if (!fd.ok()) return "";
  auto st = os::statFd(fd->get());
  if (!st.ok() || !S_ISREG(st->st_mode)) return "";
  auto bytes = os::readUpTo(fd->get(), 4u << 20);
  return bytes.ok() ? bytes->data : "";
}

}  // namespace

json configJson(const ImageConfig& c) {
  return {{"env", c.env},   {"working_dir", c.workingDir},
          {"user", c.user}, {"entrypoint", c.entrypoint},
          {"cmd", c.cmd},   {"uid", c.uid},
          {"gid", c.gid},   {"home", c.home}};
}

ImageConfig configFromJson(const json& j) {
  ImageConfig c;
  if (!j.is_object()) return c;
  c.env = j.value("env", std::vector<std::string>{});
  c.workingDir = j.value("working_dir", "");
  c.user = j.value("user", "");
  c.entrypoint = j.value("entrypoint", std::vector<std::string>{});
  c.cmd = j.value("cmd", std::vector<std::string>{});
  c.uid = j.value("uid", 0u);
  c.gid = j.value("gid", 0u);
  c.home = j.value("home", "");
  return c;
}

Result<ImageConfig> parseImageConfig(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error::make(Code::kInvalidArgument, "the image config is not JSON");
  ImageConfig c;
  if (!j.contains("config") || j["config"].is_null()) return c;
  const json& cfg = j["config"];
  if (!cfg.is_object()) return Error::make(Code::kInvalidArgument, "image config: config is not an object");
  MOAT_TRY(stringList(cfg, "Env", c.env));
  for (const auto& e : c.env) {
    auto eq = e.find('=');
    if (eq == std::string::npos || eq == 0 || e.find('\0') != std::string::npos) {
      return Error::make(Code::kInvalidArgument, "image config: Env entry '" + e.substr(0, 64) + "' is not KEY=VALUE");
    }
  }
  MOAT_TRY(stringList(cfg, "Entrypoint", c.entrypoint));
  MOAT_TRY(stringList(cfg, "Cmd", c.cmd));
  if (cfg.contains("WorkingDir") && cfg["WorkingDir"].is_string()) {
    c.workingDir = cfg["WorkingDir"];
    if (!c.workingDir.empty() && c.workingDir[0] != '/') {
      return Error::make(Code::kInvalidArgument, "image config: WorkingDir '" + c.workingDir + "' is not absolute");
    }
  }
  if (cfg.contains("User") && cfg["User"].is_string()) c.user = cfg["User"];
  return c;
}

Result<Image> readImage(const std::string& layout, const std::string& ref) {
  MOAT_ASSIGN(json index, readJson(layout + "/index.json", "index.json"));
  if (!index.contains("manifests") || !index["manifests"].is_array()) {
    return Error::make(Code::kInvalidArgument, "the image's index.json lists no manifests");
  }
  const json* chosen = nullptr;
  for (const auto& m : index["manifests"]) {
    if (m.is_object() && m.contains("annotations") && m["annotations"].is_object() &&
        m["annotations"].value("org.opencontainers.image.ref.name", "") == ref) {
      chosen = &m;
    }
  }
  if (!chosen) return Error::make(Code::kNotFound, "the image layout has no image tagged " + ref);
  MOAT_ASSIGN(std::string manifestPath, blobPath(layout, *chosen, "manifest"));
  MOAT_ASSIGN(json manifest, readJson(manifestPath, "manifest"));
  if (!manifest.contains("layers") || !manifest["layers"].is_array() || !manifest.contains("config")) {
    return Error::make(Code::kInvalidArgument, "the image's manifest is not an image manifest (a list of platforms?)");
  }
  Image image;
  MOAT_ASSIGN(std::string configPath, blobPath(layout, manifest["config"], "config"));
  MOAT_ASSIGN(json config, readJson(configPath, "config"));
  MOAT_ASSIGN(image.config, parseImageConfig(config.dump()));
  size_t i = 0;
  for (const auto& layer : manifest["layers"]) {
    MOAT_ASSIGN(std::string path, blobPath(layout, layer, "layer " + std::to_string(i++)));
    if (layer.contains("size") && layer["size"].is_number_unsigned())
      image.declaredBytes += layer["size"].get<uint64_t>();
    image.layers.push_back(std::move(path));
  }
  return image;
}

Status resolveUser(int rootFd, ImageConfig& c) {
  c.uid = 0;
  c.gid = 0;
  c.home = "/root";
  if (c.user.empty()) return {};
  std::string userPart = c.user;
  std::string groupPart;
  if (auto colon = c.user.find(':'); colon != std::string::npos) {
    userPart = c.user.substr(0, colon);
    groupPart = c.user.substr(colon + 1);
  }
  const auto passwd = os::colonLines(imageFile(rootFd, "etc/passwd"));
  bool found = false;
  for (const auto& f : passwd) {
    if (f.size() < 7) continue;
    auto uid = numeric(f[2]);
    if (!uid) continue;
    if (f[0] == userPart || (numeric(userPart) && *numeric(userPart) == *uid)) {
      c.uid = *uid;
      c.gid = numeric(f[3]).value_or(0);
      c.home = f[5];
      found = true;
      break;
    }
  }
  if (!found) {
    auto uid = numeric(userPart);
    if (!uid) {
      return Error::make(Code::kInvalidArgument,
                         "the image's User '" + c.user + "' is not in its /etc/passwd (and not a number up to 65535)");
    }
    c.uid = *uid;
    c.home = "/";
  }
  if (!groupPart.empty()) {
    if (auto gid = numeric(groupPart)) {
      c.gid = *gid;
    } else {
      bool group = false;
      for (const auto& f : os::colonLines(imageFile(rootFd, "etc/group"))) {
        if (f.size() >= 3 && f[0] == groupPart && numeric(f[2])) {
          c.gid = *numeric(f[2]);
          group = true;
          break;
        }
      }
      if (!group) {
        return Error::make(Code::kInvalidArgument,
                           "the image's User '" + c.user + "': no group " + groupPart + " in its /etc/group");
      }
    }
  }
  return {};
}

}  // namespace moat::templates
