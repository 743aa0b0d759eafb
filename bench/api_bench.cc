// moatd API benchmark: create -> exec true -> destroy over HTTP on the unix
// socket (p50/p99), "create, run ten commands, destroy", and exec
// throughput with 1, 8 and 64 concurrent clients, and exec latency while 100
// clients follow a chatty process's output in another environment. Usage:
//   moat-api-bench SOCKET TOKEN [ROUNDS] [CREATE_BODY]
// CREATE_BODY "{}" asks for the default spec, which a warm pool serves.
// Every table has a peer row measured in the same run: the machine's floor,
// posix_spawn + waitpid of /bin/true on the host with no moat at all (what
// any exec of `true` costs here, whatever runs it). The first table is the
// ratios of docs/BENCHMARKS.md ("Speed against the machine's floor"), each
// measured interleaved with its peer, round by round: on a day when the
// machine is 3x slower both sides are.
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace asio = boost::asio;

double nowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// One keep-alive connection.
class Client {
 public:
  Client(const std::string& socket, const std::string& token) : socket_(io_), token_(token) {
    socket_.connect(asio::local::stream_protocol::endpoint(socket));
  }
  std::pair<int, std::string> call(http::verb verb, const std::string& target, const std::string& body = "") {
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::authorization, "Bearer " + token_);
    req.keep_alive(true);
    if (!body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
    }
    req.prepare_payload();
    http::write(socket_, req);
    http::response<http::string_body> res;
    http::read(socket_, buffer_, res);
    return {res.result_int(), res.body()};
  }

 private:
  asio::io_context io_;
  asio::local::stream_protocol::socket socket_;
  beast::flat_buffer buffer_;
  std::string token_;
};

std::string idOf(const std::string& json) {
  auto p = json.find("\"id\":\"");
  return p == std::string::npos ? "" : json.substr(p + 6, 12);
}

// A follower: a raw connection that asks for the stream and then only reads.
int openFollower(const std::string& socket, const std::string& token, const std::string& target) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket.data(), std::min(socket.size(), sizeof addr.sun_path - 1));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  std::string req = "GET " + target + " HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + token + "\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return -1;
  return fd;
}

// The floor: /bin/true started and reaped on the host, one at a time per
// thread, for `ms` milliseconds from `threads` threads; the latencies.
std::vector<double> spawnTrue(int threads, double ms) {
  std::vector<std::vector<double>> lat(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int k = 0; k < threads; ++k) {
    workers.emplace_back([&, k] {
      char arg0[] = "/bin/true";
      char* argv[] = {arg0, nullptr};
      char* envp[] = {nullptr};
      double end = nowMs() + ms;
      while (nowMs() < end) {
        double s = nowMs();
        pid_t pid = -1;
        if (posix_spawn(&pid, "/bin/true", nullptr, nullptr, argv, envp) != 0) return;
        int status = 0;
        ::waitpid(pid, &status, 0);
        lat[static_cast<size_t>(k)].push_back(nowMs() - s);
      }
    });
  }
  for (auto& w : workers) w.join();
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  return all;
}

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// One program started and reaped on the host (its output to /dev/null);
// milliseconds, or -1 when it could not start or did not exit 0.
double spawnOnce(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  char* envp[] = {nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  double s = nowMs();
  pid_t pid = -1;
  int started = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  if (started != 0) return -1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  double ms = nowMs() - s;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? ms : -1;
}

// The peer of a create -> exec -> destroy: unshare(1) making the same kinds
// of namespaces an environment has and running /bin/true in them.
const std::vector<std::string> kUnshareTrue = {"/usr/bin/unshare", "--user", "--map-root-user", "--pid", "--fork",
                                               "--mount",          "--net",  "--uts",           "--ipc", "--cgroup",
                                               "/bin/true"};

// A line of the ratio table: moat's figure against its peer's, and the
// target (`atMost`: the ratio may be at most `target`; else at least).
std::string ratioRow(const char* measure, const char* peer, double moat, double floor, const char* unit, double target,
                     bool atMost) {
  const double ratio = floor > 0 ? moat / floor : 0;
  const bool met = atMost ? ratio <= target : ratio >= target;
  char line[512];
  std::snprintf(line, sizeof line, "| %s | %s | %.2f %s | %.2f %s | %.2fx | %s %.2fx: %s |\n", measure, peer, moat,
                unit, floor, unit, ratio, atMost ? "≤" : "≥", target, met ? "met" : "not met");
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SOCKET TOKEN [ROUNDS]\n", argv[0]);
    return 2;
  }
  std::string socket = argv[1], token = argv[2];
  int rounds = argc > 3 ? std::atoi(argv[3]) : 100;
  const std::string createBody = argc > 4 ? argv[4] : R"({"spec":{"ram_mb":256}})";
  Client c(socket, token);
  const std::string execTrue = R"({"cmd":["true"]})";

  if (const char* seconds = std::getenv("BENCH_EXEC_ONLY")) {
    // Execs of `true` from one client for that many seconds, nothing else:
    // what bench/profile.sh EXEC=1 samples.
    std::string id = idOf(c.call(http::verb::post, "/v1/environments", createBody).second);
    std::vector<double> lat;
    const double end = nowMs() + 1000 * std::atof(seconds);
    while (nowMs() < end) {
      double s = nowMs();
      c.call(http::verb::post, "/v1/environments/" + id + "/exec", execTrue);
      lat.push_back(nowMs() - s);
    }
    c.call(http::verb::delete_, "/v1/environments/" + id);
    std::printf("%zu execs of true, p50 %.2f ms, p99 %.2f ms\n", lat.size(), pct(lat, 0.5), pct(lat, 0.99));
    return 0;
  }
  const bool warm = argc > 4;  // creates are claims of a warm pool
  std::vector<double> cycle, createOnly, firstExec, tenCommands, peerOfCycle;
  std::vector<std::string> ratios;  // the first table's rows, printed last
  for (int i = 0; i < rounds + 3; ++i) {
    double t0 = nowMs();
    auto created = c.call(http::verb::post, "/v1/environments", createBody);
    double t1 = nowMs();
    std::string id = idOf(created.second);
    if (created.first != 201 || id.empty()) {
      std::fprintf(stderr, "create failed: %d %s\n", created.first, created.second.c_str());
      return 1;
    }
    c.call(http::verb::post, "/v1/environments/" + id + "/exec", execTrue);
    double tExec = nowMs();
    c.call(http::verb::delete_, "/v1/environments/" + id);
    double t2 = nowMs();
    if (i >= 3) {
      createOnly.push_back(t1 - t0);
      firstExec.push_back(tExec - t0);
      cycle.push_back(t2 - t0);
      // Its peer in the same round: for a claim, one spawn of true on the
      // host; for a cold cycle, unshare making the same namespaces.
      const double peer = spawnOnce(warm ? std::vector<std::string>{"/bin/true"} : kUnshareTrue);
      if (peer < 0) {
        std::fprintf(stderr, "the peer (%s) failed\n", warm ? "/bin/true" : "unshare");
        return 1;
      }
      peerOfCycle.push_back(peer);
    }
    // Let the pool refill (it waits 10 ms after a claim, then creates: a
    // few milliseconds of CPU), so that each round's create is a claim and
    // nothing of the refill runs beside the next round.
    if (warm) std::this_thread::sleep_for(std::chrono::milliseconds(60));
  }
  for (int i = 0; i < std::max(10, rounds / 5); ++i) {
    double t0 = nowMs();
    std::string id = idOf(c.call(http::verb::post, "/v1/environments", createBody).second);
    for (int k = 0; k < 10; ++k) c.call(http::verb::post, "/v1/environments/" + id + "/exec", execTrue);
    c.call(http::verb::delete_, "/v1/environments/" + id);
    tenCommands.push_back(nowMs() - t0);
  }
  std::printf("| operation | p50 ms | p99 ms |\n|---|---:|---:|\n");
  std::printf("| create | %.2f | %.2f |\n", pct(createOnly, 0.5), pct(createOnly, 0.99));
  std::printf("| create -> first exec done | %.2f | %.2f |\n", pct(firstExec, 0.5), pct(firstExec, 0.99));
  std::printf("| create -> exec true -> destroy | %.2f | %.2f |\n", pct(cycle, 0.5), pct(cycle, 0.99));
  std::printf("| create, 10 x exec true, destroy | %.2f | %.2f |\n", pct(tenCommands, 0.5), pct(tenCommands, 0.99));
  std::vector<double> floor = spawnTrue(1, 2000);
  std::printf("| peer: posix_spawn /bin/true on the host (the machine's floor for one exec) | %.2f | %.2f |\n",
              pct(floor, 0.5), pct(floor, 0.99));
  std::printf("| peer: %s, in the same rounds as the above | %.2f | %.2f |\n",
              warm ? "posix_spawn /bin/true on the host" : "unshare of the same namespaces running /bin/true",
              pct(peerOfCycle, 0.5), pct(peerOfCycle, 0.99));
  if (warm) {
    ratios.push_back(ratioRow("warm claim -> first exec done", "one posix_spawn of /bin/true", pct(firstExec, 0.5),
                              pct(peerOfCycle, 0.5), "ms", 1.3, true));
  } else {
    ratios.push_back(ratioRow("create -> exec `true` -> destroy", "`unshare` of the same namespaces running /bin/true",
                              pct(cycle, 0.5), pct(peerOfCycle, 0.5), "ms", 1.0, true));
  }
  auto printRatios = [&ratios] {
    std::printf(
        "\n| measure (p50, interleaved with its peer) | peer | moat | peer | ratio | target |\n"
        "|---|---|---:|---:|---:|---|\n");
    for (const auto& row : ratios) std::fputs(row.c_str(), stdout);
  };
  if (std::getenv("BENCH_CYCLE_ONLY")) {  // A/B runs of the create path
    printRatios();
    return 0;
  }
  std::string id =
      idOf(c.call(http::verb::post, "/v1/environments", R"({"spec":{"cpus":2,"ram_mb":512,"pids":4096}})").second);
  std::vector<std::string> ids{id};
  for (int e = 1; e < (getenv("BENCH_ENVS") ? atoi(getenv("BENCH_ENVS")) : 1); ++e)
    ids.push_back(
        idOf(c.call(http::verb::post, "/v1/environments", R"({"spec":{"cpus":2,"ram_mb":512,"pids":4096}})").second));
  // `clients` keep-alive clients running `true` for `ms`: their latencies,
  // and the execs a second.
  auto execsFrom = [&](int clients, double ms, double& perSecond) {
    std::atomic<bool> stop{false};
    std::vector<std::vector<double>> lat(static_cast<size_t>(clients));
    std::vector<std::thread> threads;
    double t0 = nowMs();
    for (int k = 0; k < clients; ++k) {
      threads.emplace_back([&, k] {
        Client mine(socket, token);
        while (!stop) {
          double s = nowMs();
          mine.call(http::verb::post, "/v1/environments/" + ids[k % ids.size()] + "/exec", execTrue);
          lat[static_cast<size_t>(k)].push_back(nowMs() - s);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
    stop = true;
    for (auto& t : threads) t.join();
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    perSecond = static_cast<double>(all.size()) * 1000 / (nowMs() - t0);
    return all;
  };
  {
    // One exec at a time against one host spawn, alternately; then 8
    // clients against 2 host threads, in alternate windows of a second.
    std::vector<double> api, host;
    for (int i = 0; i < 2 * rounds + 3; ++i) {
      double s = nowMs();
      c.call(http::verb::post, "/v1/environments/" + id + "/exec", execTrue);
      double e = nowMs() - s;
      double h = spawnOnce({"/bin/true"});
      if (i >= 3 && h >= 0) {
        api.push_back(e);
        host.push_back(h);
      }
    }
    ratios.insert(ratios.begin(),
                  ratioRow("one API exec of `true` (keep-alive HTTP, one client)", "posix_spawn + wait of /bin/true",
                           pct(api, 0.5), pct(host, 0.5), "ms", 1.15, true));
    double moatRate = 0, hostRate = 0;
    for (int window = 0; window < 3; ++window) {
      double rate = 0;
      (void)execsFrom(8, 1000, rate);
      moatRate += rate / 3;
      hostRate += static_cast<double>(spawnTrue(2, 1000).size()) / 3;
    }
    ratios.push_back(
        ratioRow("exec/s, 8 clients", "the host's spawn rate from 2 threads", moatRate, hostRate, "/s", 1.0, false));
  }
  std::printf("\n| concurrent clients | exec/s (true) | p50 ms | p99 ms |\n|---:|---:|---:|---:|\n");
  for (int clients : {1, 8, 64}) {
    double rate = 0;
    std::vector<double> all = execsFrom(clients, 3000, rate);
    std::printf("| %d | %.0f | %.2f | %.2f |\n", clients, rate, pct(all, 0.5), pct(all, 0.99));
  }
  for (int threads : {1, 2}) {
    std::vector<double> spawned = spawnTrue(threads, 3000);
    std::printf("| peer: posix_spawn /bin/true on the host, %d thread%s | %.0f | %.2f | %.2f |\n", threads,
                threads == 1 ? "" : "s", static_cast<double>(spawned.size()) / 3.0, pct(spawned, 0.5),
                pct(spawned, 0.99));
  }
  // Exec latency alone, then with 100 followers of a process that prints a
  // line every millisecond in another environment.
  auto execLatency = [&] {
    std::vector<double> lat;
    double end = nowMs() + 3000;
    while (nowMs() < end) {
      double s = nowMs();
      c.call(http::verb::post, "/v1/environments/" + id + "/exec", execTrue);
      lat.push_back(nowMs() - s);
    }
    return lat;
  };
  std::vector<double> alone = execLatency();
  std::string chatty = idOf(c.call(http::verb::post, "/v1/environments", createBody).second);
  auto started = c.call(http::verb::post, "/v1/environments/" + chatty + "/processes",
                        R"({"cmd":["sh","-c","i=0; while true; do echo line $i; i=$((i+1)); sleep 0.001; done"]})");
  auto pidAt = started.second.find("\"id\":");
  std::string pid = pidAt == std::string::npos ? "1" : std::to_string(std::atoi(started.second.c_str() + pidAt + 5));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<double> chattyAlone = execLatency();  // the chatty process's own cost, no followers
  std::vector<int> followers;
  for (int k = 0; k < 100; ++k) {
    int fd = openFollower(socket, token, "/v1/environments/" + chatty + "/processes/" + pid + "/output?follow=1");
    if (fd >= 0) followers.push_back(fd);
  }
  std::atomic<bool> stopReading{false};
  std::atomic<uint64_t> followedBytes{0};
  std::thread reader([&] {
    std::vector<pollfd> fds;
    for (int fd : followers) fds.push_back({fd, POLLIN, 0});
    char buf[65536];
    while (!stopReading) {
      if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (auto& p : fds) {
        if (!(p.revents & POLLIN)) continue;
        ssize_t n = ::read(p.fd, buf, sizeof buf);
        if (n > 0) followedBytes += static_cast<uint64_t>(n);
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto producedAt = [&] {
    auto p = c.call(http::verb::get, "/v1/environments/" + chatty + "/processes/" + pid).second;
    auto at = p.find("\"output_offset\":");
    return at == std::string::npos ? 0.0 : std::atof(p.c_str() + at + 16);
  };
  double producedBefore = producedAt();
  uint64_t followedBefore = followedBytes;
  std::vector<double> crowded = execLatency();
  double produced = producedAt() - producedBefore;
  double followed = static_cast<double>(followedBytes - followedBefore);
  stopReading = true;
  reader.join();
  for (int fd : followers) ::close(fd);
  std::printf("\n| exec true, 1 client | p50 ms | p99 ms |\n|---|---:|---:|\n");
  std::printf("| alone | %.2f | %.2f |\n", pct(alone, 0.5), pct(alone, 0.99));
  std::printf("| while a chatty process runs in another environment, no followers | %.2f | %.2f |\n",
              pct(chattyAlone, 0.5), pct(chattyAlone, 0.99));
  std::printf("| while %zu clients follow a chatty process (%.0f KB/s produced, %.1f MB/s streamed) | %.2f | %.2f |\n",
              followers.size(), produced / 3e3, followed / 3e6, pct(crowded, 0.5), pct(crowded, 0.99));
  std::printf("| ratio p50, 100 followers vs none (same chatty process) | %.2fx | %.2fx |\n",
              pct(crowded, 0.5) / pct(chattyAlone, 0.5), pct(crowded, 0.99) / pct(chattyAlone, 0.99));
  c.call(http::verb::delete_, "/v1/environments/" + chatty);
  c.call(http::verb::delete_, "/v1/environments/" + id);
  printRatios();
  return 0;
}
