// moat-guest-tool: the one program in the microVM tests' root file system
// (static: the image holds nothing else). `uname` prints the running
// kernel's release, `cat FILE` a file, `write FILE TEXT` writes one,
// `echo` copies stdin to stdout line by line, `flood FILE SIZE` writes SIZE
// MiB to FILE (SIZE KiB with a K after it: 256K), `fork N` starts N children that wait and prints how many
// it could start, `exec PROGRAM ARGS...` becomes PROGRAM (errno's text on
// stderr when it cannot), `time` prints the wall clock's seconds since the
// epoch, `random` 16 random bytes (getrandom) in hex, `count FILE` writes
// 1, 2, 3... to FILE for ever (each from a child of its own),
// `cgroup-escape REPORT FILE` tries to leave its cgroup's bound and pauses
// (errnos in REPORT) and then counts into FILE, `later SECONDS
// PROGRAM ARGS...` becomes PROGRAM after that many seconds, `hog MIB`
// takes and touches MIB MiB of memory, `sync` writes every file system to
// its disk, `leaderless` spins on a second thread after its first one ended
// (pthread_exit: the process stays listed by the leader's id). Started as
// `qemu-system-x86_64` (a stand-in for QEMU, in QEMU's jail), it tries what
// a QEMU taken over by its guest would reach for and prints, on stderr (the
// console log), its pid and each call's errno (0: it worked).
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

// What a QEMU taken over would try first: each call's errno, 0 when it
// worked (none of them needs a privilege this process lacks).
int probeJail() {
  auto result = [](long rc) { return rc < 0 ? errno : 0; };
  errno = 0;
  const int userns = result(syscall(SYS_unshare, CLONE_NEWUSER));
  unsigned char params[120] = {};  // struct io_uring_params, zeroed
  const long ring = syscall(SYS_io_uring_setup, 4, params);
  const int uring = result(ring);
  if (ring >= 0) close(static_cast<int>(ring));
  const int keys = result(syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3 /* session */, 1));
  const long uffd = syscall(SYS_userfaultfd, 1 /* UFFD_USER_MODE_ONLY */);
  const int faults = result(uffd);
  if (uffd >= 0) close(static_cast<int>(uffd));
  // What it can learn of the host's files without reading any (Landlock
  // allows a stat): the host's /etc/passwd, and its pid 2 (kthreadd).
  struct stat st;
  const int passwd = result(stat("/etc/passwd", &st));
  const int hostPid = result(stat("/proc/2", &st));
  std::fprintf(stderr, "jail: pid=%d unshare-user=%d io_uring=%d keyctl=%d userfaultfd=%d passwd=%d proc-2=%d\n",
               getpid(), userns, uring, keys, faults, passwd, hostPid);
  return 0;
}

int main(int argc, char** argv) {
  const char* name = std::strrchr(argv[0], '/');
  if (std::strcmp(name != nullptr ? name + 1 : argv[0], "qemu-system-x86_64") == 0) return probeJail();
  if (argc == 2 && std::strcmp(argv[1], "uname") == 0) {
    struct utsname u;
    if (uname(&u) != 0) return 1;
    std::printf("%s\n", u.release);
    return 0;
  }
  if ((argc == 2 || argc == 3) && std::strcmp(argv[1], "keeper-escape") == 0) {
    // What a command tries against a process of the guest that holds
    // SYS_ADMIN (moat-init's identity keeper): trace it, write its memory,
    // read it, take its descriptors. Prints "found N", then for each such
    // process its pid and each call's errno (0: it worked); with `kill` or
    // `stop`, kills or stops them (which a command may: CAP_KILL) and
    // prints the result.
    std::vector<int> found;
    if (DIR* proc = opendir("/proc")) {
      while (dirent* e = readdir(proc)) {
        const int pid = std::atoi(e->d_name);
        if (pid <= 1 || pid == getpid()) continue;
        // Not the kernel's threads (no command line).
        FILE* cmdline = std::fopen(("/proc/" + std::to_string(pid) + "/cmdline").c_str(), "r");
        const bool program = cmdline && std::fgetc(cmdline) != EOF;
        if (cmdline) std::fclose(cmdline);
        if (!program) continue;
        FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
        if (!f) continue;
        char line[256];
        while (std::fgets(line, sizeof line, f)) {
          unsigned long long caps = 0;
          if (std::sscanf(line, "CapEff: %llx", &caps) == 1 && (caps & (1ull << 21))) found.push_back(pid);
        }
        std::fclose(f);
      }
      closedir(proc);
    }
    std::printf("found %zu\n", found.size());
    auto result = [](long rc) { return rc < 0 ? errno : 0; };
    for (int pid : found) {
      if (argc == 3) {
        const bool stop = std::strcmp(argv[2], "stop") == 0;
        std::printf("%d %s %d\n", pid, stop ? "stopped" : "killed", result(kill(pid, stop ? SIGSTOP : SIGKILL)));
        continue;
      }
      const int traced = result(ptrace(PTRACE_ATTACH, pid, nullptr, nullptr));
      const int mem = result(open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDWR));
      char byte = 0;
      iovec local = {&byte, 1}, remote = {reinterpret_cast<void*>(0x400000), 1};
      const int read = result(process_vm_readv(pid, &local, 1, &remote, 1, 0));
      const long pidfd = syscall(SYS_pidfd_open, pid, 0);
      const int fd = pidfd < 0 ? errno : result(syscall(SYS_pidfd_getfd, pidfd, 0, 0));
      std::printf("%d %d %d %d %d\n", pid, traced, mem, read, fd);
    }
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "hostname") == 0) {
    struct utsname u;
    if (uname(&u) != 0) return 1;
    std::printf("%s\n", u.nodename);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "cat") == 0) {
    FILE* f = std::fopen(argv[2], "rb");
    if (!f) {
      std::perror(argv[2]);
      return 1;
    }
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) std::fwrite(buf, 1, n, stdout);
    std::fclose(f);
    return 0;
  }
  if (argc == 4 && std::strcmp(argv[1], "write") == 0) {
    FILE* f = std::fopen(argv[2], "wb");
    if (!f) {
      std::perror(argv[2]);
      return 1;
    }
    std::fputs(argv[3], f);
    return std::fclose(f) == 0 ? 0 : 1;
  }
  if (argc == 3 && std::strcmp(argv[1], "remember") == 0) {
    // What it was told, kept in its memory alone: all of it, again, after
    // each line, on its output and in FILE (a REPL's state, for the
    // checkpoint tests).
    std::string kept;
    char line[4096];
    while (std::fgets(line, sizeof line, stdin)) {
      std::string word(line);
      while (!word.empty() && word.back() == '\n') word.pop_back();
      kept += (kept.empty() ? "" : " ") + word;
      std::printf("[%s]\n", kept.c_str());
      std::fflush(stdout);
      FILE* f = std::fopen(argv[2], "w");
      if (!f) return 1;
      std::fprintf(f, "[%s]", kept.c_str());
      if (std::fclose(f) != 0) return 1;
    }
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "echo") == 0) {
    char line[4096];
    while (std::fgets(line, sizeof line, stdin)) {
      std::fputs(line, stdout);
      std::fflush(stdout);
    }
    return 0;
  }
  if (argc == 4 && std::strcmp(argv[1], "flood") == 0) {
    FILE* f = std::fopen(argv[2], "wb");
    if (!f) {
      std::perror(argv[2]);
      return 1;
    }
    static char buffer[1 << 16];
    std::setvbuf(f, buffer, _IOFBF, sizeof buffer);
    // SIZE: KiB with a K after it, else MiB.
    static char block[1 << 10];
    std::memset(block, 'x', sizeof block);
    char* unit = nullptr;
    const long size = std::strtol(argv[3], &unit, 10);
    for (long i = 0; i < (*unit == 'K' ? size : size << 10); ++i) {
      if (std::fwrite(block, 1, sizeof block, f) != sizeof block) {
        std::perror(argv[2]);
        std::fclose(f);
        return 1;
      }
    }
    if (std::fclose(f) != 0) {
      std::perror(argv[2]);
      return 1;
    }
    return 0;
  }
  if (argc == 4 && std::strcmp(argv[1], "cgroup-escape") == 0) {
    // What a command tries against its cgroup's bound and a pause: user,
    // mount and cgroup namespaces of its own, the cgroup file system
    // mounted there (its root the command's cgroup), a cgroup below to move
    // into, the bound raised, the freeze lifted. Each errno (0: it worked)
    // goes to REPORT; then it counts into FILE, as `count` does.
    auto result = [](long rc) { return rc < 0 ? errno : 0; };
    auto put = [](const char* path, const char* text) {
      FILE* f = std::fopen(path, "w");
      if (!f) return errno;
      const bool written = std::fputs(text, f) >= 0;
      return std::fclose(f) == 0 && written ? 0 : errno;
    };
    const int userns = result(unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWCGROUP));
    put("/proc/self/setgroups", "deny");
    const int mapped = put("/proc/self/uid_map", "0 0 1") | put("/proc/self/gid_map", "0 0 1");
    mkdir("/workspace/cg", 0755);
    const int mounted = result(mount("cgroup2", "/workspace/cg", "cgroup2", 0, nullptr));
    mkdir("/workspace/cg/escape", 0755);
    const int moved = put("/workspace/cg/escape/cgroup.procs", std::to_string(getpid()).c_str());
    const int bound = put("/workspace/cg/pids.max", "max");
    const int freeze = put("/workspace/cg/cgroup.freeze", "0");
    FILE* report = std::fopen(argv[2], "w");
    if (!report) return 1;
    std::fprintf(report, "userns=%d mapped=%d mounted=%d moved=%d pids.max=%d cgroup.freeze=%d\n", userns, mapped,
                 mounted, moved, bound, freeze);
    std::fclose(report);
    argv[2] = argv[3];  // and counts, below
    argc = 3;
    argv[1] = const_cast<char*>("count");
  }
  if (argc == 3 && std::strcmp(argv[1], "count") == 0) {
    // Each step a child of its own writes the next number (a pause must
    // catch processes being born too).
    const std::string tmp = std::string(argv[2]) + ".tmp";
    for (long i = 1;; ++i) {
      const pid_t child = fork();
      if (child < 0) return 1;
      if (child == 0) {
        FILE* f = std::fopen(tmp.c_str(), "w");
        if (!f) _exit(1);
        std::fprintf(f, "%ld\n", i);
        _exit(std::fclose(f) == 0 && std::rename(tmp.c_str(), argv[2]) == 0 ? 0 : 1);
      }
      int status = 0;
      waitpid(child, &status, 0);
    }
  }
  if (argc >= 4 && std::strcmp(argv[1], "later") == 0) {
    sleep(static_cast<unsigned>(std::atoi(argv[2])));
    execv(argv[3], argv + 3);
    std::perror(argv[3]);
    return 126;
  }
  if (argc >= 3 && std::strcmp(argv[1], "exec") == 0) {
    execv(argv[2], argv + 2);
    std::perror(argv[2]);
    return 126;
  }
  if (argc == 3 && std::strcmp(argv[1], "fork") == 0) {
    int gate[2];
    if (pipe(gate) != 0) return 1;
    long started = 0;
    for (long i = 0; i < std::atol(argv[2]); ++i) {
      pid_t pid = fork();
      if (pid < 0) break;
      if (pid == 0) {
        close(gate[1]);
        char c;
        (void)read(gate[0], &c, 1);  // until the parent closes its end
        _exit(0);
      }
      ++started;
    }
    close(gate[1]);
    while (wait(nullptr) > 0) {
    }
    std::printf("%ld\n", started);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "hog") == 0) {
    for (long i = 0; i < std::atol(argv[2]); ++i) {
      void* p = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return 1;
      std::memset(p, 'x', 1 << 20);
    }
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "leaderless") == 0) {
    std::thread([] {
      for (unsigned long n = 0;; ++n) asm volatile("" : "+r"(n));  // spins; never optimized away
    }).detach();
    pthread_exit(nullptr);
  }
  if (argc == 2 && std::strcmp(argv[1], "sync") == 0) {
    sync();
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "time") == 0) {
    std::printf("%lld\n", static_cast<long long>(time(nullptr)));
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "random") == 0) {
    unsigned char bytes[16];
    if (getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) return 1;
    for (unsigned char b : bytes) std::printf("%02x", b);
    std::printf("\n");
    return 0;
  }
  std::fprintf(
      stderr,
      "usage: moat-guest-tool uname | cat FILE | write FILE TEXT | echo | flood FILE SIZE | fork N | exec "
      "PROGRAM ARGS... | time | random | hostname | keeper-escape [kill|stop] | count FILE | cgroup-escape REPORT "
      "FILE | later SECONDS PROGRAM "
      "ARGS... | hog MIB | sync | leaderless\n");
  return 2;
}
