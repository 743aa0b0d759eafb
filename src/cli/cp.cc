// moat cp: files between the host and one of moatd's environments.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "common/unique_fd.h"
#include "os/file.h"
#include "os/terminal.h"
#include "os/tree.h"

namespace moat::cli {
namespace {

constexpr const char* kCpUsage = R"(usage: moat cp HOST_PATH ENV:PATH
       moat cp ENV:PATH HOST_PATH

Copies one regular file between the host and an environment of moatd, in
8 MiB pieces (any size). Parent directories inside are created. `-` as
HOST_PATH is stdin or stdout. A sparse file copied out of an environment
keeps its holes, and they are not sent.

options:
  --progress     show progress on stderr, one line per piece (the default
                 when stderr is a terminal: one line, rewritten)
  --no-progress  do not
)";

constexpr size_t kChunk = 8u << 20;

// How far a copy of more than one piece got, on stderr: on a terminal one
// line rewritten in place and cleared at the end; elsewhere a line per piece.
class Progress {
 public:
  Progress(bool shown, uint64_t total) : shown_(shown), total_(total), terminal_(os::isTerminal(2)) {}
  ~Progress() {
    if (drawn_ && terminal_) std::fputs("\r\033[K", stderr);  // the copy's end, or its error, is the news
  }
  void update(uint64_t done) {
    if (!shown_ || done < kChunk) return;  // one piece: over before a line would help
    std::string line = "moat cp: " + mib(done);
    if (total_ > 0) line += " of " + mib(total_) + " (" + std::to_string(done * 100 / total_) + "%)";
    std::fputs((terminal_ ? "\r\033[K" + line : line + "\n").c_str(), stderr);
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  static std::string mib(uint64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1u << 20));
    return text;
  }
  bool shown_;
  uint64_t total_;  // 0: not known (stdin)
  bool terminal_;
  bool drawn_ = false;
};

struct Remote {
  std::string env;
  std::string path;
};

// ENV:PATH with PATH absolute; anything else is a host path.
bool parseRemote(const std::string& arg, Remote& out) {
  auto colon = arg.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= arg.size() || arg[colon + 1] != '/') {
    return false;
  }
  if (arg.find('/') < colon) return false;  // a host path with a colon in it
  out.env = arg.substr(0, colon);
  out.path = arg.substr(colon + 1);
  return true;
}

// The host side of a copy follows no symlink (os::openHostPath): moat cp
// runs as root beside directories environments write into (moat run -v),
// where a link they planted would lead a copy into a root-only file.
Result<UniqueFd> openHost(const std::string& host, int flags, mode_t mode = 0) {
  if (host == "-") return UniqueFd(::dup((flags & O_ACCMODE) == O_RDONLY ? 0 : 1));
  std::string path = host;
  if (path[0] != '/') {
    MOAT_ASSIGN(std::string cwd, os::currentDirectory());  // physical: no links in it
    path = os::joinPath(cwd, path);
  }
  return os::openHostPath(path, "host path", flags, mode);
}

int upload(Client& client, const std::string& host, const Remote& remote, bool showProgress) {
  auto envPath = environmentPath(remote.env);
  if (!envPath.ok()) return reportFailure("moat cp", envPath.error());
  auto opened = openHost(host, O_RDONLY);
  if (!opened.ok()) return complain(kExitEnvironment, "cannot read " + host + ": " + opened.error().message());
  UniqueFd fd = std::move(opened.value());
  struct stat st = {};
  if (::fstat(fd.get(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return complain(kExitUsage, host + " is a directory; moat cp copies files");
  }
  std::string base = envPath.value() + "/files?path=" + urlEncode(remote.path);
  Progress progress(showProgress, S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0);
  bool first = true;
  for (uint64_t sent = 0;;) {
    std::string chunk(kChunk, '\0');
    size_t got = 0;
    while (got < kChunk) {
      ssize_t n = ::read(fd.get(), chunk.data() + got, kChunk - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return complain(kExitEnvironment, "read " + host + ": " + std::strerror(errno));
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    chunk.resize(got);
    if (got == 0 && !first) break;
    auto reply = client.request("PUT", base + (first ? "" : "&append=1"), chunk);
    if (!reply.ok()) return reportFailure("moat cp", reply.error());
    if (reply->status != 200) return complain(kExitEnvironment, describeError(reply.value()));
    first = false;
    progress.update(sent += got);
    if (got < kChunk) break;
  }
  return 0;
}

std::optional<uint64_t> headerNumber(const HttpReply& reply, const std::string& name) {
  auto it = reply.headers.find(name);
  if (it == reply.headers.end()) return std::nullopt;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), value);
  if (ec != std::errc() || end != it->second.data() + it->second.size()) return std::nullopt;
  return value;
}

Status seekTo(int fd, uint64_t offset) {
  if (offset > static_cast<uint64_t>(INT64_MAX)) return Error::make(Code::kInvalidArgument, "offset too large");
  if (::lseek(fd, static_cast<off_t>(offset), SEEK_SET) < 0) return Error::fromErrno("seek");
  return {};
}

Status writeZeros(int fd, uint64_t count) {
  const std::string zeros(std::min<uint64_t>(count, kChunk), '\0');
  for (uint64_t left = count; left > 0;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(left, zeros.size()));
    if (!writeAll(fd, zeros.substr(0, n))) return Error::fromErrno("write");
    left -= n;
  }
  return {};
}

int download(Client& client, const Remote& remote, const std::string& host, bool showProgress) {
  auto envPath = environmentPath(remote.env);
  if (!envPath.ok()) return reportFailure("moat cp", envPath.error());
  auto opened = openHost(host, O_WRONLY | O_CREAT, 0644);
  if (!opened.ok()) return complain(kExitEnvironment, "cannot write " + host + ": " + opened.error().message());
  UniqueFd fd = std::move(opened.value());
  struct stat st = {};
  if (::fstat(fd.get(), &st) != 0) return complain(kExitEnvironment, "stat " + host + ": " + std::strerror(errno));
  // A regular file keeps the environment's holes: a sparse file of a
  // terabyte (within a 100 MiB quota) takes no more of the host's disk
  // than it did of the environment's. Devices and pipes are written as is.
  bool regular = S_ISREG(st.st_mode);
  if (regular && ::ftruncate(fd.get(), 0) != 0) {
    return complain(kExitEnvironment, "truncate " + host + ": " + std::strerror(errno));
  }
  std::string base = envPath.value() + "/files?path=" + urlEncode(remote.path);
  uint64_t total = 0;
  if (showProgress) {  // the total, for the progress line only: the file may still grow
    auto stat = call(client, "GET", envPath.value() + "/files/stat?path=" + urlEncode(remote.path), "", 200);
    if (stat.ok() && stat->is_object() && stat->contains("size") && (*stat)["size"].is_number_unsigned()) {
      total = (*stat)["size"].get<uint64_t>();
    }
  }
  Progress progress(showProgress, total);
  // moatd skips the file's holes (skip_holes=1): each answer says where its
  // bytes begin; an empty one, that no data follows (its offset: the end).
  uint64_t offset = 0;
  for (;;) {
    auto reply = client.request(
        "GET", base + "&skip_holes=1&offset=" + std::to_string(offset) + "&length=" + std::to_string(kChunk));
    if (!reply.ok()) return reportFailure("moat cp", reply.error());
    if (reply->status != 200) return complain(kExitEnvironment, describeError(reply.value()));
    auto at = headerNumber(reply.value(), "x-moat-offset");
    if (!at || *at < offset) {
      return complain(kExitEnvironment,
                      "moatd's answer has no offset at or after " + std::to_string(offset) + " (an older moatd?)");
    }
    const std::string& body = reply->body;
    if (*at > static_cast<uint64_t>(INT64_MAX) - body.size()) {
      return complain(kExitEnvironment, "moatd's answer is beyond any file's end (offset " + std::to_string(*at) + ")");
    }
    // A hole (skipped, or zeros read) stays a hole in a regular file; a
    // pipe or a device gets its zeros.
    bool zeros = body.find_first_not_of('\0') == std::string::npos;
    Status wrote = regular ? seekTo(fd.get(), *at + (zeros ? body.size() : 0)) : writeZeros(fd.get(), *at - offset);
    if (wrote.ok() && !(regular && zeros) && !writeAll(fd.get(), body)) wrote = Error::fromErrno("write");
    if (!wrote.ok()) return complain(kExitEnvironment, "write " + host + ": " + wrote.error().message());
    const uint64_t reached = *at + body.size();
    if (reached > offset) progress.update(reached);  // an answer that moved nothing (the end) shows nothing
    offset = reached;
    if (body.empty()) break;
  }
  // A hole at the end has no bytes written after it: the size says so.
  if (regular && ::ftruncate(fd.get(), static_cast<off_t>(offset)) != 0) {
    return complain(kExitEnvironment, "truncate " + host + ": " + std::strerror(errno));
  }
  return 0;
}

}  // namespace

int cpCommand(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  std::vector<std::string> positional;
  bool showProgress = os::isTerminal(2);
  FlagReader flags(args);
  while (!flags.done()) {
    if (!flags.currentIsFlag()) {
      positional.push_back(flags.current());
      flags.skip();
      continue;
    }
    if (flags.current() == "-h" || flags.current() == "--help") {
      std::fputs(kCpUsage, stdout);
      return 0;
    }
    Status s = flags.next();
    if (!s.ok()) return reportFailure("moat cp", s.error());
    bool matched = true;
    if (flags.name() == "--progress" || flags.name() == "--no-progress") {
      s = flags.noValue();
      if (!s.ok()) return reportFailure("moat cp", s.error());
      showProgress = flags.name() == "--progress";
      continue;
    }
    s = readConnectionFlag(flags, connection, matched);
    if (!s.ok()) return reportFailure("moat cp", s.error());
    if (!matched) return reportFailure("moat cp", usageError("unknown option " + flags.name()));
  }
  if (positional.size() != 2) {
    return reportFailure("moat cp", usageError("expected a source and a destination\n" + std::string(kCpUsage)));
  }
  Remote from, to;
  bool fromRemote = parseRemote(positional[0], from);
  bool toRemote = parseRemote(positional[1], to);
  if (fromRemote == toRemote) {
    return reportFailure("moat cp", usageError("exactly one side must be ENV:/absolute/path"));
  }
  auto client = Client::fromOptions(connection);
  if (!client.ok()) return reportFailure("moat cp", client.error());
  return toRemote ? upload(client.value(), positional[0], to, showProgress)
                  : download(client.value(), from, positional[1], showProgress);
}

}  // namespace moat::cli
