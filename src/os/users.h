#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "common/result.h"

// Users and groups as /etc/passwd and /etc/group name them. Read from the
// files themselves, not through NSS: moat is a static binary, and NSS
// modules would be the shared libraries it avoids (a user or group known
// only to LDAP or systemd-homed is not found: say so in the error).
namespace moat::os {

struct UserEntry {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;  // the primary group
  std::string home;
};

// The user named `name` (or with that number, given as digits).
// kNotFound names the file read.
Result<UserEntry> userNamed(const std::string& name);

// The group named `name` (or with that number, given as digits).
Result<gid_t> groupNamed(const std::string& name);

// The groups that list `user` as a member (not its primary one).
std::vector<gid_t> supplementaryGroups(const std::string& user);

// Runs `work` in a child process that is `user` (its uid, primary and
// supplementary groups; no capabilities left), and returns what it
// returned. For what root does in a user's home: the kernel then checks
// each path as for that user, so a link the user planted leads nowhere
// that user could not write anyway.
Status runAsUser(const UserEntry& user, const std::function<Status()>& work);

// The entries of a passwd- or group-like text: each line's fields split at
// ':'; blank lines and comments left out (an image's files are read with it
// too: templates/image.cc).
std::vector<std::vector<std::string>> colonLines(const std::string& text);

// The same, from the files' text (what the functions above read; tests).
Result<UserEntry> userIn(const std::string& passwd, const std::string& name);
Result<gid_t> groupIn(const std::string& group, const std::string& name);
std::vector<gid_t> groupsOfIn(const std::string& group, const std::string& user);

}  // namespace moat::os
