#include "os/users.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "os/file.h"
#include "os/process.h"

namespace moat::os {
namespace {

constexpr size_t kMaxDatabase = 16u << 20;

std::vector<std::string> fieldsOf(const std::string& line, char separator) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (;;) {
    size_t colon = line.find(separator, start);
    fields.push_back(line.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) return fields;
    start = colon + 1;
  }
}

// A decimal id of 32 bits (not -1, which means "unchanged" to chown and
// setresuid): 4294967296 is not a way to say 0.
bool number(const std::string& text, unsigned long& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && out < 0xffffffffUL;
}

bool matches(const std::vector<std::string>& fields, size_t idField, const std::string& name) {
  unsigned long id = 0;
  return fields[0] == name || (number(name, id) && number(fields[idField], id) && fields[idField] == name);
}

}  // namespace

std::vector<std::vector<std::string>> colonLines(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    out.push_back(fieldsOf(line, ':'));
  }
  return out;
}

Result<UserEntry> userIn(const std::string& passwd, const std::string& name) {
  for (const auto& f : colonLines(passwd)) {
    unsigned long uid = 0, gid = 0;
    if (f.size() < 7 || !matches(f, 2, name) || !number(f[2], uid) || !number(f[3], gid)) continue;
    return UserEntry{f[0], static_cast<uid_t>(uid), static_cast<gid_t>(gid), f[5]};
  }
  return Error::make(Code::kNotFound, "no user " + name + " in /etc/passwd");
}

Result<gid_t> groupIn(const std::string& group, const std::string& name) {
  for (const auto& f : colonLines(group)) {
    unsigned long gid = 0;
    if (f.size() < 3 || !matches(f, 2, name) || !number(f[2], gid)) continue;
    return static_cast<gid_t>(gid);
  }
  return Error::make(Code::kNotFound, "no group " + name + " in /etc/group");
}

std::vector<gid_t> groupsOfIn(const std::string& group, const std::string& user) {
  std::vector<gid_t> gids;
  for (const auto& f : colonLines(group)) {
    unsigned long gid = 0;
    if (f.size() < 4 || !number(f[2], gid)) continue;
    for (const std::string& member : fieldsOf(f[3], ',')) {
      if (member == user) gids.push_back(static_cast<gid_t>(gid));
    }
  }
  return gids;
}

Status runAsUser(const UserEntry& user, const std::function<Status()>& work) {
  std::vector<gid_t> groups = supplementaryGroups(user.name);
  groups.push_back(user.gid);
  // What it does takes milliseconds; a user who stops the process (it is
  // theirs to signal) must not hold root's command up for good.
  constexpr std::chrono::seconds kLimit{30};
  return runInChild(
      [&]() -> Status {
        if (::setgroups(groups.size(), groups.data()) != 0 || ::setresgid(user.gid, user.gid, user.gid) != 0 ||
            ::setresuid(user.uid, user.uid, user.uid) != 0) {
          return Error::fromErrno("become user " + user.name);
        }
        if (user.uid != 0 && ::setuid(0) == 0) {
          return Error::make(Code::kSyscall, "become user " + user.name + ": root could be regained");
        }
        // Its memory holds root's secrets (the master token): the user it now
        // is may not ptrace it or read its /proc files.
        if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return Error::fromErrno("prctl PR_SET_DUMPABLE");
        return work();
      },
      kLimit);
}

Result<UserEntry> userNamed(const std::string& name) {
  MOAT_ASSIGN(std::string passwd, readFile("/etc/passwd", kMaxDatabase));
  return userIn(passwd, name);
}

Result<gid_t> groupNamed(const std::string& name) {
  MOAT_ASSIGN(std::string group, readFile("/etc/group", kMaxDatabase));
  return groupIn(group, name);
}

std::vector<gid_t> supplementaryGroups(const std::string& user) {
  auto group = readFile("/etc/group", kMaxDatabase);
  return group.ok() ? groupsOfIn(group.value(), user) : std::vector<gid_t>{};
}

}  // namespace moat::os
