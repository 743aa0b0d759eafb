// moatd API benchmark: create -> exec true -> destroy over HTTP on the unix
// socket (p50/p99), "create, run ten commands, destroy", and exec
// throughput with 1, 8 and 64 concurrent clients, and exec latency while 100
// clients follow a chatty process's output in another environment. Usage:
//   moat-api-bench SOCKET TOKEN [ROUNDS] [CREATE_BODY]
// CREATE_BODY "{}" asks for the default spec, which a warm pool serves.
// Every table has a peer row measured in the same run: the machine's floor,
// posix_spawn + waitpid of /bin/true on the host with no moat at all (what
// any exec of `true` costs here, whatever runs it).
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

  std::vector<double> cycle, createOnly, firstExec, tenCommands;
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
    }
    if (argc > 4) std::this_thread::sleep_for(std::chrono::milliseconds(15));  // let a pool refill
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

  if (std::getenv("BENCH_CYCLE_ONLY")) return 0;  // A/B runs of the create path
  std::string id =
      idOf(c.call(http::verb::post, "/v1/environments", R"({"spec":{"cpus":2,"ram_mb":512,"pids":4096}})").second);
  std::vector<std::string> ids{id};
  for (int e = 1; e < (getenv("BENCH_ENVS") ? atoi(getenv("BENCH_ENVS")) : 1); ++e)
    ids.push_back(
        idOf(c.call(http::verb::post, "/v1/environments", R"({"spec":{"cpus":2,"ram_mb":512,"pids":4096}})").second));
  std::printf("\n| concurrent clients | exec/s (true) | p50 ms | p99 ms |\n|---:|---:|---:|---:|\n");
  for (int clients : {1, 8, 64}) {
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
    std::this_thread::sleep_for(std::chrono::seconds(3));
    stop = true;
    for (auto& t : threads) t.join();
    double seconds = (nowMs() - t0) / 1000;
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    std::printf("| %d | %.0f | %.2f | %.2f |\n", clients, static_cast<double>(all.size()) / seconds, pct(all, 0.5),
                pct(all, 0.99));
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
  return 0;
}
