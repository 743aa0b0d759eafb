#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "common/result.h"
#include "templates/image.h"
#include "templates/tar_scan.h"

// One import of an OCI image into a template's root file system, with the
// tools Debian carries: skopeo copies the image (from an archive, a layout
// or a registry) into an OCI layout in a private directory, moatd checks
// every layer against its limits, umoci unpacks them, and moatd removes
// what no template may hold (device nodes). docs/TEMPLATES.md.
namespace moat::templates {

struct ImportLimits {
  uint64_t maxBytes = 8ull << 30;  // the image's files, and what the copy writes
  uint64_t maxEntries = 1000000;   // files, directories and links over all layers
  std::chrono::seconds timeout{1800};
};

// A source as the API takes it: docker-archive:FILE, oci-archive:FILE,
// oci:DIR[:TAG] (host paths, absolute) or docker://REF (a registry).
struct Source {
  std::string transport;  // "docker-archive", "oci-archive", "oci", "docker"
  std::string rest;       // what follows the transport's prefix
  bool namesHostPath() const { return transport != "docker"; }
  std::string skopeoReference() const;  // what skopeo copy takes
};
Result<Source> parseSource(const std::string& text);

struct ImportJob {
  Source source;
  std::string workDir;  // private, empty, made by the caller; everything goes below it
  ImportLimits limits;
  std::function<void(const std::string& stage, uint64_t bytes)> progress;
  std::function<bool()> stopping;  // true: give up now (moatd stops)
};

struct Imported {
  std::string rootfs;  // workDir/rootfs: the template's tree
  ImageConfig config;
  uint64_t sizeBytes = 0;
  uint64_t devicesDropped = 0;
};

Result<Imported> importImage(const ImportJob& job);

// After an unpack: removes every device node (character or block) of the
// tree, counts its files and their bytes (each inode once), and refuses a
// tree deeper than 256 levels. Never follows a symlink.
struct TreeCount {
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t devicesRemoved = 0;
};
Result<TreeCount> sanitizeTree(const std::string& root);

}  // namespace moat::templates
