#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/result.h"

// An OCI image as skopeo leaves it in an image layout: its manifest's
// layers and its config's defaults. Every file of the layout came from the
// image, so every field is checked before use (a digest names a file).
namespace moat::templates {

// What an environment made from the template starts with (docs/TEMPLATES.md).
struct ImageConfig {
  std::vector<std::string> env;  // KEY=VALUE
  std::string workingDir;        // absolute, or empty
  std::string user;              // as the image says: "", "1000", "app", "app:staff"
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  // `user` resolved against the image's /etc/passwd and /etc/group.
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string home;  // the user's home directory from /etc/passwd; empty: unknown
};

nlohmann::json configJson(const ImageConfig& config);  // the API's "config" (and uid, gid, home)
ImageConfig configFromJson(const nlohmann::json& j);   // what configJson wrote (lenient: a stored value)

// The config blob's JSON (the "config" object of an OCI image config).
Result<ImageConfig> parseImageConfig(const std::string& text);

struct Image {
  std::vector<std::string> layers;  // paths of the layer blobs, bottom first
  uint64_t declaredBytes = 0;       // the manifest's sizes of them
  ImageConfig config;
};

// The image tagged `ref` in the OCI layout at `layout`.
Result<Image> readImage(const std::string& layout, const std::string& ref);

// `user` ("uid[:gid]" or names) in the tree rootFd is open on, reading its
// /etc/passwd and /etc/group without leaving the tree. A name not found is
// an error; a numeric uid not found keeps gid 0 (as a runtime would).
Status resolveUser(int rootFd, ImageConfig& config);

}  // namespace moat::templates
