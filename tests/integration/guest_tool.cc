// moat-guest-tool: the one program in the microVM tests' root file system
// (static: the image holds nothing else). `uname` prints the running
// kernel's release, `cat FILE` a file, `write FILE TEXT` writes one,
// `echo` copies stdin to stdout line by line, `flood FILE MIB` writes MIB
// MiB to FILE.
#include <sys/utsname.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "uname") == 0) {
    struct utsname u;
    if (uname(&u) != 0) return 1;
    std::printf("%s\n", u.release);
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
    static char block[1 << 16];
    std::memset(block, 'x', sizeof block);
    for (long i = 0; i < std::atol(argv[3]) * 16; ++i) std::fwrite(block, 1, sizeof block, f);
    return std::fclose(f) == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "usage: moat-guest-tool uname | cat FILE | write FILE TEXT | echo | flood FILE MIB\n");
  return 2;
}
