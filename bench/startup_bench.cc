// Runs several commands side by side, interleaved round by round so that
// drift on the machine affects all of them alike, and prints medians, p90
// and the first command's median divided by each one's (so a row's ratio
// <= 1.0 means the first is no slower than that peer). Usage:
//   moat-startup-bench ROUNDS NAME=COMMAND... (COMMAND split on spaces)
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Peer {
  std::string name;
  std::vector<std::string> argv;
  std::vector<double> ms;
};

double nowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

bool runOnce(Peer& p) {
  std::vector<char*> argv;
  for (auto& a : p.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  double start = nowMs();
  pid_t pid;
  if (posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) return false;
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  waitpid(pid, &status, 0);
  p.ms.push_back(nowMs() - start);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROUNDS NAME=COMMAND...\n", argv[0]);
    return 2;
  }
  int rounds = std::atoi(argv[1]);
  std::vector<Peer> peers;
  for (int i = 2; i < argc; ++i) {
    std::string spec = argv[i];
    auto eq = spec.find('=');
    if (eq == std::string::npos) return 2;
    Peer p{spec.substr(0, eq), {}, {}};
    std::istringstream words(spec.substr(eq + 1));
    for (std::string w; words >> w;) p.argv.push_back(w);
    peers.push_back(p);
  }
  for (auto& p : peers) {  // warm-up (and first-use setup) outside the figures
    for (int i = 0; i < 3; ++i) {
      if (!runOnce(p)) {
        std::fprintf(stderr, "%s failed; skipping it\n", p.name.c_str());
        p.argv.clear();
        break;
      }
    }
    p.ms.clear();
  }
  for (int r = 0; r < rounds; ++r) {
    for (auto& p : peers) {
      if (!p.argv.empty()) runOnce(p);
    }
  }
  double base = peers[0].ms.empty() ? 0 : percentile(peers[0].ms, 0.5);
  std::printf("| command | median ms | p90 ms | %s ÷ this |\n|---|---:|---:|---:|\n", peers[0].name.c_str());
  for (auto& p : peers) {
    if (p.ms.empty()) {
      std::printf("| %s | n/a | n/a | n/a |\n", p.name.c_str());
      continue;
    }
    double median = percentile(p.ms, 0.5);
    std::printf("| %s | %.2f | %.2f | %.2f |\n", p.name.c_str(), median, percentile(p.ms, 0.9),
                median > 0 ? base / median : 0);
  }
  return 0;
}
