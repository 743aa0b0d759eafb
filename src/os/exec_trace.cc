#include "os/exec_trace.h"

#include <elf.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/unique_fd.h"
#include "os/exec_notify.h"

namespace moat::os {

Status traceExec(pid_t pid) {
  if (::ptrace(PTRACE_SEIZE, pid, nullptr, PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL) != 0) {
    return Error::fromErrno("ptrace seize " + std::to_string(pid));
  }
  return {};
}

Status untrace(pid_t pid) {
  if (::ptrace(PTRACE_DETACH, pid, nullptr, nullptr) != 0) return Error::fromErrno("ptrace detach");
  return {};
}

TraceStop classifyStop(int status) {
  int event = status >> 16;
  if (event == PTRACE_EVENT_EXEC) return TraceStop::kExec;
  if (event == PTRACE_EVENT_STOP) return TraceStop::kGroup;
  if (event != 0) return TraceStop::kOther;
  return TraceStop::kSignal;
}

Status resumeStopped(pid_t pid, int status) {
  long r = 0;
  switch (classifyStop(status)) {
    case TraceStop::kSignal:
      r = ::ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(static_cast<long>(WSTOPSIG(status))));
      break;
    case TraceStop::kGroup:
      // Stopped by a stop signal: it stays stopped until a SIGCONT. Else a
      // trap (after that SIGCONT): it goes on.
      if (WSTOPSIG(status) == SIGTRAP) {
        r = ::ptrace(PTRACE_CONT, pid, nullptr, nullptr);
      } else {
        r = ::ptrace(PTRACE_LISTEN, pid, nullptr, nullptr);
      }
      break;
    default:
      r = ::ptrace(PTRACE_CONT, pid, nullptr, nullptr);
      break;
  }
  if (r != 0) return Error::fromErrno("ptrace resume");
  return {};
}

pid_t idBeforeExec(pid_t pid) {
  unsigned long former = 0;
  if (::ptrace(PTRACE_GETEVENTMSG, pid, nullptr, &former) != 0) return pid;
  return static_cast<pid_t>(former);
}

namespace {

// A whole /proc file of the process, at most `max` bytes.
Result<std::string> readProcFile(pid_t pid, const char* name, size_t max) {
  std::string path = "/proc/" + std::to_string(pid) + "/" + name;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::fromErrno("open " + path);
  std::string out;
  char buf[16384];
  while (out.size() < max) {
    ssize_t n = ::read(fd.get(), buf, std::min(sizeof buf, max - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::fromErrno("read " + path);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

Result<ExecImage> readExecImage(pid_t pid, size_t maxBytes) {
  ExecImage image;
  MOAT_ASSIGN(std::string auxv, readProcFile(pid, "auxv", 4096));
  uint64_t execFnAddr = 0;
  for (size_t off = 0; off + 2 * sizeof(uint64_t) <= auxv.size(); off += 2 * sizeof(uint64_t)) {
    uint64_t entry[2];
    std::memcpy(entry, auxv.data() + off, sizeof entry);
    if (entry[0] == AT_EXECFN) execFnAddr = entry[1];
    if (entry[0] == AT_NULL) break;
  }
  if (!execFnAddr) return Error::make(Code::kExec, "no AT_EXECFN in the new program's auxiliary vector");
  char name[4097];
  ssize_t got = readProcessMemory(pid, execFnAddr, name, sizeof name - 1);
  if (got <= 0) return Error::fromErrno("read the new program's name", got == 0 ? EFAULT : errno);
  name[got] = '\0';
  image.execFn = name;
  MOAT_ASSIGN(std::string cmdline, readProcFile(pid, "cmdline", maxBytes));
  size_t start = 0;
  while (start < cmdline.size()) {
    size_t end = cmdline.find('\0', start);
    if (end == std::string::npos) end = cmdline.size();
    image.argv.push_back(cmdline.substr(start, end - start));
    start = end + 1;
  }
  return image;
}

namespace {

Result<FileId> statId(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Error::fromErrno("stat " + path);
  return FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

}  // namespace

namespace {

bool spaceTab(char c) { return c == ' ' || c == '\t'; }

// The kernel's load_script (fs/binfmt_script.c), on the first 256 bytes
// zero-padded: false where it answers ENOEXEC.
bool parseScriptLine(const char (&buf)[256], ExecFile& file) {
  if (buf[0] != '#' || buf[1] != '!') return false;
  const size_t bufEnd = sizeof buf - 1;
  auto nextNonSpaceTab = [&](size_t from, size_t last) -> size_t {
    for (size_t i = from; i < last; ++i) {
      if (!spaceTab(buf[i])) return i;
    }
    return std::string::npos;
  };
  auto nextTerminator = [&](size_t from, size_t last) -> size_t {
    for (size_t i = from; i < last; ++i) {
      if (spaceTab(buf[i]) || buf[i] == '\0') return i;
    }
    return std::string::npos;
  };
  size_t end = std::string::npos;
  for (size_t i = 0; i < sizeof buf && buf[i] != '\0'; ++i) {
    if (buf[i] == '\n') {
      end = i;
      break;
    }
  }
  if (end == std::string::npos) {
    size_t first = nextNonSpaceTab(2, bufEnd);
    if (first == std::string::npos) return false;                          // all blanks
    if (nextTerminator(first, bufEnd) == std::string::npos) return false;  // the name may be cut
    end = bufEnd;
  }
  while (spaceTab(buf[end - 1])) --end;
  size_t name = nextNonSpaceTab(2, end);
  if (name == std::string::npos || name == end) return false;  // no interpreter
  size_t sep = nextTerminator(name, end);
  // Strings end at the first NUL, as the kernel's copies do.
  auto cString = [&](size_t from, size_t to) {
    std::string out(buf + from, to - from);
    return out.substr(0, out.find('\0'));
  };
  file.interpreter = cString(name, sep == std::string::npos ? end : sep);
  if (sep != std::string::npos && buf[sep] != '\0') {
    size_t arg = nextNonSpaceTab(sep, end);
    if (arg != std::string::npos) {
      file.hasInterpreterArg = true;
      file.interpreterArg = cString(arg, end);
    }
  }
  file.script = true;
  return true;
}

}  // namespace

Result<ExecFile> identifyExecFile(pid_t pid, const std::string& procPath) {
  // Not opened for reading until it is known to be a regular file: a FIFO
  // (or a device) at an allowed name would hold moat-init in open(2). The
  // kernel runs nothing else (EACCES).
  UniqueFd path(::open(procPath.c_str(), O_PATH | O_CLOEXEC));
  if (!path) return Error::fromErrno("open " + procPath);
  struct stat st;
  if (::fstat(path.get(), &st) != 0) return Error::fromErrno("fstat " + procPath);
  if (!S_ISREG(st.st_mode)) return Error::fromErrno(procPath + " is not a regular file", EACCES);
  ExecFile file;
  file.id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  std::string reopen = "/proc/self/fd/" + std::to_string(path.get());
  char name[4096];
  ssize_t len = ::readlink(reopen.c_str(), name, sizeof name);
  if (len > 0) file.path.assign(name, static_cast<size_t>(len));
  // Without blocking on a lease another process holds (EWOULDBLOCK).
  UniqueFd fd(::open(reopen.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd) return Error::fromErrno("open " + procPath);
  char buf[256] = {};
  ssize_t n = ::pread(fd.get(), buf, sizeof buf, 0);
  if (n < 0) return Error::fromErrno("read " + procPath);
  if (!parseScriptLine(buf, file)) return file;
  const std::string proc = "/proc/" + std::to_string(pid);
  auto interpreter =
      statId(file.interpreter[0] == '/' ? proc + "/root" + file.interpreter : proc + "/cwd/" + file.interpreter);
  if (interpreter.ok()) file.interpreterId = interpreter.value();
  return file;
}

Result<FileId> runningFile(pid_t pid) { return statId("/proc/" + std::to_string(pid) + "/exe"); }

pid_t tracerOf(pid_t pid) {
  auto status = readProcFile(pid, "status", 4096);
  if (!status.ok()) return -1;
  size_t at = status->find("\nTracerPid:");
  if (at == std::string::npos) return -1;
  return static_cast<pid_t>(std::strtol(status->c_str() + at + 11, nullptr, 10));
}

std::vector<std::string> scriptArgv(const ExecFile& file, const std::string& execFn,
                                    const std::vector<std::string>& argv) {
  std::vector<std::string> out{file.interpreter};
  if (file.hasInterpreterArg) out.push_back(file.interpreterArg);
  out.push_back(execFn);
  for (size_t i = 1; i < argv.size(); ++i) out.push_back(argv[i]);
  return out;
}

bool sameExec(const std::string& execFn, const std::vector<std::string>& argv, const ExecFile& file,
              const FileId& running, const ExecImage& image) {
  if (image.execFn != execFn) return false;
  if (file.script) {
    return file.interpreterId != FileId{} && running == file.interpreterId &&
           image.argv == scriptArgv(file, execFn, argv);
  }
  // No arguments at all: the kernel gives the program an empty argv[0].
  return running == file.id && image.argv == (argv.empty() ? std::vector<std::string>{""} : argv);
}

}  // namespace moat::os
