#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"

namespace moat::isolation::fs {

// What an environment's root is made of. `host` (the default) shows the
// host's /usr read-only over a small generated skeleton with its own /etc; a
// directory (e.g. made by debootstrap) is used whole as the read-only lower
// layer. Either way the environment writes only to its own upper layer.
struct Template {
  std::string name;
  std::string lowerDir;                       // read-only lower layer of the overlay (where it is)
  UniqueFd lower;                             // ... opened (O_PATH): what the overlay gets
  std::vector<std::string> hostReadOnlyDirs;  // host dirs shown read-only at the same path
};

// Named templates (made by moatd from OCI images or recipes, src/templates/)
// live in <state>/templates/images/<name>, each directory the whole root
// file system, present only once complete. The images directory is
// root's, mode 0700: the trees hold setuid files no host user may reach.
std::string namedTemplatesDir(const std::string& stateDir);
// ^[a-z0-9][a-z0-9._:-]{0,63}$ and not "host".
bool isTemplateName(const std::string& name);

// A directory template is opened as named, following no symlink
// (os::openHostPath): its path may lead through a directory an environment
// was given.
Result<Template> resolveTemplate(const std::string& spec, const std::string& stateDir);

// Text of the generated /etc files (exposed for tests).
std::string generatedPasswd(bool haveBash);
std::string generatedGroup();

}  // namespace moat::isolation::fs
