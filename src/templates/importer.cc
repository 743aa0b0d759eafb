#include "templates/importer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>

#include "os/file.h"
#include "os/tool.h"

namespace moat::templates {

namespace {

constexpr const char* kSkopeo = "/usr/bin/skopeo";
constexpr const char* kUmoci = "/usr/bin/umoci";
constexpr const char* kRef = "img";
constexpr int kMaxDepth = 256;

// skopeo's own trust policy: the image is untrusted whatever it is signed
// with; moatd checks what it holds instead. Written per import so the
// host's /etc/containers/policy.json plays no part.
constexpr const char* kPolicy = R"({"default":[{"type":"insecureAcceptAnything"}]})";

// Bytes in the regular files below dir (not following links): what a copy
// has written so far.
uint64_t bytesBelow(int dirFd, int depth) {
  if (depth > 16) return 0;
  int fd = ::dup(dirFd);
  if (fd < 0) return 0;
  DIR* dir = ::fdopendir(fd);
  if (!dir) {
    ::close(fd);
    return 0;
  }
  uint64_t total = 0;
  while (struct dirent* e = ::readdir(dir)) {
    if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
    struct stat st;
    if (::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode)) total += static_cast<uint64_t>(st.st_blocks) * 512;
    if (S_ISDIR(st.st_mode)) {
      int sub = ::openat(::dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        total += bytesBelow(sub, depth + 1);
        ::close(sub);
      }
    }
  }
  ::closedir(dir);
  return total;
}

uint64_t bytesBelow(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return 0;
  uint64_t n = bytesBelow(fd, 0);
  ::close(fd);
  return n;
}

std::vector<std::string> toolEnvironment(const std::string& workDir) {
  return {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + workDir + "/home", "TMPDIR=" + workDir + "/tmp",
          "LANG=C.UTF-8"};
}

// Which decompressor a layer needs, by its first bytes (its media type is
// the image's word; the bytes are what umoci will read).
Result<std::string> decompressorFor(const std::string& path) {
  MOAT_ASSIGN(UniqueFd fd, os::open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  unsigned char magic[4] = {0, 0, 0, 0};
  ssize_t n = ::read(fd.get(), magic, sizeof magic);
  if (n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) return std::string("/usr/bin/gzip");
  if (n >= 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd) {
    return std::string("/usr/bin/zstd");
  }
  return std::string();
}

// Reads a layer's tar stream (decompressed by gzip or zstd, a child
// process) into the scanner; stops the child as soon as a limit is passed.
Status scanLayer(const std::string& path, const ImportJob& job, TarScanner& scanner,
                 std::chrono::steady_clock::time_point deadline) {
  MOAT_ASSIGN(std::string decompressor, decompressorFor(path));
  MOAT_ASSIGN(UniqueFd blob, os::open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (decompressor.empty()) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(blob.get(), buf, sizeof buf);
      if (n < 0) return Error::fromErrno("read layer " + path);
      if (n == 0) break;
      MOAT_TRY(scanner.feed(std::string_view(buf, static_cast<size_t>(n))));
      if (std::chrono::steady_clock::now() >= deadline) {
        return Error::make(Code::kTimeout, "the import did not finish in time (checking the layers)");
      }
    }
    return scanner.finish();
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  UniqueFd readEnd(fds[0]);
  UniqueFd writeEnd(fds[1]);
  std::atomic<bool> refused{false};
  Status scanned;
  std::thread reader([&] {
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(readEnd.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        scanned = Error::fromErrno("read the decompressed layer");
        break;
      }
      if (n == 0) {
        scanned = scanner.finish();
        break;
      }
      Status s = scanner.feed(std::string_view(buf, static_cast<size_t>(n)));
      if (!s.ok()) {
        scanned = s;
        refused = true;
        break;
      }
    }
    readEnd.reset();  // the decompressor, if still writing, ends (EPIPE)
  });
  os::ToolRun run;
  run.argv = {decompressor, "-dc"};
  run.env = toolEnvironment(job.workDir);
  run.cwd = job.workDir;
  run.deadline = deadline;
  run.stdinFd = blob.get();
  run.stdoutFd = writeEnd.get();
  run.check = [&]() -> Status {
    if (refused) return Error::make(Code::kTooLarge, "refused");
    if (job.stopping && job.stopping()) return Error::make(Code::kUnavailable, "moatd is stopping");
    return {};
  };
  // The reader sees the end once the child and this copy are gone.
  Status ran = [&] {
    Status s = os::runTool(run);
    writeEnd.reset();
    return s;
  }();
  reader.join();
  if (!scanned.ok()) return scanned;  // the scanner's reason first: it is the one that names the problem
  if (!ran.ok()) return Error::make(ran.error().code, "decompressing a layer: " + ran.error().message());
  return {};
}

}  // namespace

std::string Source::skopeoReference() const {
  if (transport == "docker") return "docker://" + rest;
  return transport + ":" + rest;
}

Result<Source> parseSource(const std::string& text) {
  if (text.size() > 4096 || text.find('\0') != std::string::npos || text.find('\n') != std::string::npos) {
    return Error::invalidField("source", "at most 4096 bytes of one line");
  }
  Source s;
  if (text.rfind("docker://", 0) == 0) {
    s.transport = "docker";
    s.rest = text.substr(9);
    if (s.rest.empty() || s.rest[0] == '/' || s.rest.find(' ') != std::string::npos) {
      return Error::invalidField("source", "docker://REF needs an image reference, e.g. docker://debian:bookworm");
    }
    return s;
  }
  for (const char* t : {"docker-archive", "oci-archive", "oci"}) {
    std::string prefix = std::string(t) + ":";
    if (text.rfind(prefix, 0) == 0) {
      s.transport = t;
      s.rest = text.substr(prefix.size());
      if (s.rest.empty() || s.rest[0] != '/') {
        return Error::invalidField("source", std::string(t) + ": needs an absolute path on moatd's host");
      }
      return s;
    }
  }
  return Error::invalidField(
      "source",
      "'" + text.substr(0, 200) + "': use docker-archive:FILE, oci-archive:FILE, oci:DIR[:TAG] or docker://REF");
}

Result<TreeCount> sanitizeTree(const std::string& root) {
  TreeCount count;
  std::set<std::pair<dev_t, ino_t>> seen;
  struct Frame {
    DIR* dir;
    int depth;
  };
  std::vector<Frame> stack;
  auto closeAll = [&] {
    for (auto& f : stack) ::closedir(f.dir);
    stack.clear();
  };
  int rootFd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (rootFd < 0) return Error::fromErrno("open " + root);
  DIR* rootDir = ::fdopendir(rootFd);
  if (!rootDir) {
    ::close(rootFd);
    return Error::fromErrno("fdopendir " + root);
  }
  stack.push_back({rootDir, 0});
  while (!stack.empty()) {
    Frame& top = stack.back();
    struct dirent* e = ::readdir(top.dir);
    if (!e) {
      ::closedir(top.dir);
      stack.pop_back();
      continue;
    }
    if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
    const int parent = ::dirfd(top.dir);
    struct stat st;
    if (::fstatat(parent, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      closeAll();
      return Error::fromErrno(std::string("stat ") + e->d_name + " in the unpacked image");
    }
    ++count.entries;
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      // A device node in a lower layer would open the host's device for
      // root inside: no template holds one (/dev is moat's own).
      if (::unlinkat(parent, e->d_name, 0) != 0) {
        closeAll();
        return Error::fromErrno(std::string("remove the device node ") + e->d_name + " of the image");
      }
      ++count.devicesRemoved;
      continue;
    }
    if (S_ISREG(st.st_mode) && seen.insert({st.st_dev, st.st_ino}).second) {
      count.bytes += static_cast<uint64_t>(st.st_size);
    }
    if (S_ISDIR(st.st_mode)) {
      if (top.depth + 1 > kMaxDepth) {
        closeAll();
        return Error::make(Code::kTooLarge, "the image's tree is deeper than 256 directories");
      }
      int fd = ::openat(parent, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) {
        closeAll();
        return Error::fromErrno(std::string("open ") + e->d_name + " in the unpacked image");
      }
      DIR* sub = ::fdopendir(fd);
      if (!sub) {
        ::close(fd);
        closeAll();
        return Error::fromErrno("fdopendir");
      }
      int depth = top.depth + 1;
      stack.push_back({sub, depth});
    }
  }
  return count;
}

Result<Imported> importImage(const ImportJob& job) {
  const auto deadline = std::chrono::steady_clock::now() + job.limits.timeout;
  const std::string& work = job.workDir;
  auto say = [&](const std::string& stage, uint64_t bytes) {
    if (job.progress) job.progress(stage, bytes);
  };
  for (const char* sub : {"home", "tmp"}) MOAT_TRY(os::makeDir(work + "/" + sub, 0700));
  MOAT_TRY(os::writeFile(work + "/policy.json", kPolicy, 0600));
  if (::access(kSkopeo, X_OK) != 0 || ::access(kUmoci, X_OK) != 0) {
    return Error::make(
        Code::kMissingDependency,
        "importing images needs skopeo and umoci (apt-get install skopeo umoci; scripts/install-deps.sh)");
  }
  // 1. The image into an OCI layout of our own: nothing afterwards reads
  // the source again, so what was checked is what gets unpacked.
  say("copying", 0);
  os::ToolRun copy;
  copy.argv = {kSkopeo, "--policy", work + "/policy.json", "copy", "--quiet"};
  if (job.source.transport == "docker") copy.argv.push_back("--src-no-creds");  // never the host's credentials
  copy.argv.push_back(job.source.skopeoReference());
  copy.argv.push_back("oci:" + work + "/layout:" + kRef);
  copy.env = toolEnvironment(work);
  copy.cwd = work;
  copy.deadline = deadline;
  copy.maxFileBytes = job.limits.maxBytes;  // no single blob beyond the limit
  auto lastCount = std::chrono::steady_clock::now();
  copy.check = [&]() -> Status {
    if (job.stopping && job.stopping()) return Error::make(Code::kUnavailable, "moatd is stopping");
    auto now = std::chrono::steady_clock::now();
    if (now - lastCount < std::chrono::milliseconds(500)) return {};
    lastCount = now;
    uint64_t written = bytesBelow(work);
    say("copying", written);
    if (written > job.limits.maxBytes) {
      return Error::make(Code::kTooLarge, "the image is over the size limit of " + std::to_string(job.limits.maxBytes) +
                                              " bytes (moatd --template-max-bytes) while being copied");
    }
    return {};
  };
  if (Status s = os::runTool(copy); !s.ok()) {
    return Error::make(s.error().code, "copying " + job.source.skopeoReference() + ": " + s.error().message());
  }
  // 2. Every layer checked before any is unpacked.
  MOAT_ASSIGN(Image image, readImage(work + "/layout", kRef));
  LayerTally tally;
  LayerLimits limits{job.limits.maxBytes, job.limits.maxEntries};
  for (size_t i = 0; i < image.layers.size(); ++i) {
    say("checking layer " + std::to_string(i + 1) + " of " + std::to_string(image.layers.size()), tally.bytes);
    TarScanner scanner(limits, tally, "layer " + std::to_string(i + 1));
    MOAT_TRY(scanLayer(image.layers[i], job, scanner, deadline));
  }
  // 3. Unpacked by umoci (which keeps every name inside the tree: see
  // tests/integration/template_import_test.cc), as root, with owners and
  // modes as the image says.
  say("unpacking", tally.bytes);
  Imported out;
  out.rootfs = work + "/rootfs";
  os::ToolRun unpack;
  unpack.argv = {kUmoci, "raw", "unpack", "--image", work + "/layout:" + kRef, out.rootfs};
  unpack.env = toolEnvironment(work);
  unpack.cwd = work;
  unpack.deadline = deadline;
  unpack.maxFileBytes = job.limits.maxBytes;
  unpack.check = [&]() -> Status {
    if (job.stopping && job.stopping()) return Error::make(Code::kUnavailable, "moatd is stopping");
    return {};
  };
  if (Status s = os::runTool(unpack); !s.ok()) {
    return Error::make(s.error().code, "unpacking the image: " + s.error().message());
  }
  // 4. What no template may hold goes; the rest is counted.
  say("finishing", tally.bytes);
  MOAT_ASSIGN(TreeCount tree, sanitizeTree(out.rootfs));
  if (tree.entries > job.limits.maxEntries) {
    return Error::make(Code::kTooLarge, "the unpacked image has more than " + std::to_string(job.limits.maxEntries) +
                                            " files (moatd --template-max-files)");
  }
  out.sizeBytes = tree.bytes;
  out.devicesDropped = tree.devicesRemoved;
  out.config = image.config;
  MOAT_ASSIGN(UniqueFd rootFd, os::open(out.rootfs, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  MOAT_TRY(resolveUser(rootFd.get(), out.config));
  // The tree's top is the environment's "/": as a root file system's.
  MOAT_ASSIGN(UniqueFd top, os::open(out.rootfs, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (::fchmod(top.get(), 0755) != 0) return Error::fromErrno("chmod the template's top directory");
  return out;
}

}  // namespace moat::templates
