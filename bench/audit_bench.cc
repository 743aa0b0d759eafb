// Audit log benchmark. Two parts:
//   1. In process, on a scratch SQLite file: what record() costs its caller
//      (p50/p99 per call, 1 and 8 threads) and how many events per second
//      the writer stores.
//   2. Against a running moatd (when SOCKET and TOKEN are given): exec
//      latency (p50/p99, one client) alone, with a paced background load of
//      unrecorded API calls (GET an environment), and with the same load of
//      recorded ones (file reads, one file.read event each), at RATE calls
//      per second; the events/s achieved are counted from GET /v1/events.
//      With MOATD_PID set, also moatd's CPU time in each phase, and its
//      audit writer thread's ("moatd-audit") per event.
// Usage: moat-audit-bench [SOCKET TOKEN [RATE] [SECONDS]]
#include <dirent.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "audit/log.h"
#include "os/file.h"
#include "store/store.h"

namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace asio = boost::asio;

double nowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// --- part 1 ------------------------------------------------------------------

// CPU time of moatd (all threads, ms) and of its audit writer thread (ms),
// from /proc; zeros without MOATD_PID.
struct Cpu {
  double processMs = 0;
  double writerMs = 0;
};

Cpu cpuOf(const char* pid) {
  Cpu cpu;
  if (pid == nullptr) return cpu;
  const std::string base = std::string("/proc/") + pid;
  {
    std::ifstream stat(base + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    auto close = text.rfind(')');
    if (close != std::string::npos) {
      std::istringstream fields(text.substr(close + 2));
      std::string f;
      double utime = 0, stime = 0;
      for (int i = 3; i <= 15 && fields >> f; ++i) {
        if (i == 14) utime = std::atof(f.c_str());
        if (i == 15) stime = std::atof(f.c_str());
      }
      cpu.processMs = (utime + stime) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  if (DIR* tasks = opendir((base + "/task").c_str())) {
    while (dirent* d = readdir(tasks)) {
      if (d->d_name[0] == '.') continue;
      std::ifstream comm(base + "/task/" + d->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      if (name != "moatd-audit") continue;
      std::ifstream schedstat(base + "/task/" + d->d_name + "/schedstat");
      double ns = 0;
      schedstat >> ns;
      cpu.writerMs = ns / 1e6;
    }
    closedir(tasks);
  }
  return cpu;
}

int inProcess() {
  char tmpl[] = "/tmp/moat-audit-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  auto store = moat::store::openSqliteStore(dir + "/moat.db");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.error().message().c_str());
    return 1;
  }
  std::printf("| record() from | events | caller p50 us | caller p99 us | stored events/s |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  for (int threads : {1, 8}) {
    auto log = moat::audit::Log::open(*store.value());
    if (!log.ok()) return 1;
    const int each = 200000 / threads;
    std::vector<std::vector<double>> lat(static_cast<size_t>(threads));
    std::vector<std::thread> workers;
    double t0 = nowMs();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        auto& mine = lat[static_cast<size_t>(t)];
        mine.reserve(static_cast<size_t>(each));
        for (int i = 0; i < each; ++i) {
          nlohmann::json data = {{"path", "/workspace/file-" + std::to_string(i)}, {"size", i}, {"offset", 0}};
          double s = nowMs();
          log.value()->record("file.read", "0123456789ab", "master", std::move(data));
          mine.push_back((nowMs() - s) * 1000);
        }
      });
    }
    for (auto& w : workers) w.join();
    if (!log.value()->flush(std::chrono::minutes(5)).ok()) return 1;
    double seconds = (nowMs() - t0) / 1000;
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    std::printf("| %d thread%s | %zu | %.2f | %.2f | %.0f |\n", threads, threads == 1 ? "" : "s", all.size(),
                pct(all, 0.5), pct(all, 0.99), static_cast<double>(all.size()) / seconds);
    auto verified = log.value()->verify();
    if (!verified.ok() || !verified->ok) {
      std::fprintf(stderr, "the chain does not verify\n");
      return 1;
    }
  }
  // Paced like a busy moatd: the writer's CPU per event with the default
  // gathering and with others.
  const std::string self = std::to_string(::getpid());
  std::printf(
      "\n| paced at 2,000 events/s for 3 s, gathering | writer CPU (of a core) | writer us/event "
      "|\n");
  std::printf("|---|---:|---:|\n");
  for (int coalesceMs : {2, 10, 50}) {
    // A fresh file each time: the same start for every row.
    auto fresh = moat::store::openSqliteStore(dir + "/paced-" + std::to_string(coalesceMs) + ".db");
    if (!fresh.ok()) return 1;
    moat::audit::LogOptions options;
    options.coalesce = std::chrono::milliseconds(coalesceMs);
    auto log = moat::audit::Log::open(*fresh.value(), options);
    if (!log.ok()) return 1;
    Cpu before = cpuOf(self.c_str());
    double t0 = nowMs();
    const int events = 6000;
    auto next = std::chrono::steady_clock::now();
    for (int i = 0; i < events; ++i) {
      next += std::chrono::microseconds(500);
      std::this_thread::sleep_until(next);
      log.value()->record("file.read", "0123456789ab", "master",
                          {{"path", "/workspace/file-" + std::to_string(i)}, {"size", i}, {"offset", 0}});
    }
    if (!log.value()->flush().ok()) return 1;
    Cpu after = cpuOf(self.c_str());
    double seconds = (nowMs() - t0) / 1000;
    double writerMs = after.writerMs - before.writerMs;
    std::printf("| %d ms%s | %.1f%% | %.1f |\n", coalesceMs, coalesceMs == 10 ? " (default)" : "",
                writerMs / seconds / 10, writerMs * 1000 / events);
  }
  store.value().reset();
  (void)moat::os::removeTree(dir);
  return 0;
}

// --- part 2 ------------------------------------------------------------------

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

// Events of `type` in `environment`, counted through the API (1000 a page).
uint64_t countEvents(Client& c, const std::string& environment, const std::string& type) {
  uint64_t since = 0, count = 0;
  for (;;) {
    const std::string body = c.call(http::verb::get, "/v1/events?environment=" + environment + "&type=" + type +
                                                         "&since=" + std::to_string(since))
                                 .second;
    uint64_t n = 0;
    for (size_t at = 0; at < body.size();) {
      size_t end = body.find('\n', at);
      if (end == std::string::npos) end = body.size();
      if (body.compare(at, 4, "id: ") == 0) {
        since = std::strtoull(body.c_str() + at + 4, nullptr, 10);
        ++n;
      }
      at = end + 1;
    }
    if (n == 0) return count;
    count += n;
  }
}

int againstMoatd(const std::string& socket, const std::string& token, int rate, int seconds) {
  Client c(socket, token);
  const std::string small = R"({"spec":{"ram_mb":256}})";
  std::string target = idOf(c.call(http::verb::post, "/v1/environments", small).second);
  std::string loaded = idOf(c.call(http::verb::post, "/v1/environments", small).second);
  if (target.empty() || loaded.empty()) {
    std::fprintf(stderr, "create failed\n");
    return 1;
  }
  c.call(http::verb::put, "/v1/environments/" + loaded + "/files?path=/workspace/f", "0123456789abcdef");
  const std::string execTrue = R"({"cmd":["true"]})";
  const char* moatdPid = std::getenv("MOATD_PID");
  auto execLatency = [&] {
    std::vector<double> lat;
    double end = nowMs() + seconds * 1000.0;
    while (nowMs() < end) {
      double s = nowMs();
      c.call(http::verb::post, "/v1/environments/" + target + "/exec", execTrue);
      lat.push_back(nowMs() - s);
    }
    return lat;
  };
  // `threads` clients together calling `loadTarget` `rate` times a second,
  // each on its own schedule, while the exec latency is measured.
  struct Loaded {
    std::vector<double> lat;
    double callsPerSecond;
    Cpu cpu;  // used during the measurement
    double seconds;
  };
  auto withLoad = [&](const std::string& loadTarget) {
    constexpr int threads = 4;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> calls{0};
    std::vector<std::thread> load;
    for (int k = 0; k < threads; ++k) {
      load.emplace_back([&, k] {
        Client mine(socket, token);
        const auto period = std::chrono::nanoseconds(1000000000LL * threads / rate);
        auto next = std::chrono::steady_clock::now() + period * k / threads;
        while (!stop) {
          std::this_thread::sleep_until(next);
          next += period;
          if (mine.call(http::verb::get, loadTarget).first == 200) ++calls;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the load settles
    uint64_t before = calls;
    Cpu cpu0 = cpuOf(moatdPid);
    double t0 = nowMs();
    Loaded out{execLatency(), 0, {}, 0};
    out.seconds = (nowMs() - t0) / 1000;
    Cpu cpu1 = cpuOf(moatdPid);
    out.cpu = {cpu1.processMs - cpu0.processMs, cpu1.writerMs - cpu0.writerMs};
    out.callsPerSecond = static_cast<double>(calls - before) / out.seconds;
    stop = true;
    for (auto& t : load) t.join();
    return out;
  };
  Cpu aloneCpu0 = cpuOf(moatdPid);
  double aloneT0 = nowMs();
  std::vector<double> alone = execLatency();
  double aloneSeconds = (nowMs() - aloneT0) / 1000;
  Cpu aloneCpu1 = cpuOf(moatdPid);
  Cpu aloneCpu{aloneCpu1.processMs - aloneCpu0.processMs, aloneCpu1.writerMs - aloneCpu0.writerMs};
  Loaded unrecorded = withLoad("/v1/environments/" + loaded);
  uint64_t readsBefore = countEvents(c, loaded, "file.read");
  double t0 = nowMs();
  Loaded recorded = withLoad("/v1/environments/" + loaded + "/files?path=/workspace/f");
  double loadSeconds = (nowMs() - t0) / 1000;
  uint64_t reads = countEvents(c, loaded, "file.read") - readsBefore;
  // Each exec is recorded too (exec.started, exec.ended).
  double execEventsPerSecond = 2.0 * static_cast<double>(recorded.lat.size()) / (seconds);
  std::printf("\n| exec true, 1 client | events/s recorded | p50 ms | p99 ms |\n|---|---:|---:|---:|\n");
  std::printf("| alone | %.0f (its own exec events) | %.2f | %.2f |\n",
              2.0 * static_cast<double>(alone.size()) / seconds, pct(alone, 0.5), pct(alone, 0.99));
  std::printf("| + %.0f/s GET environment (not recorded) | %.0f | %.2f | %.2f |\n", unrecorded.callsPerSecond,
              2.0 * static_cast<double>(unrecorded.lat.size()) / seconds, pct(unrecorded.lat, 0.5),
              pct(unrecorded.lat, 0.99));
  std::printf("| + %.0f/s file reads (each a file.read event) | %.0f + %.0f file.read | %.2f | %.2f |\n",
              recorded.callsPerSecond, execEventsPerSecond, static_cast<double>(reads) / loadSeconds,
              pct(recorded.lat, 0.5), pct(recorded.lat, 0.99));
  std::printf("| ratio, recorded load vs alone | | %.2fx | %.2fx |\n", pct(recorded.lat, 0.5) / pct(alone, 0.5),
              pct(recorded.lat, 0.99) / pct(alone, 0.99));
  std::printf("| ratio, recorded vs unrecorded load | | %.2fx | %.2fx |\n",
              pct(recorded.lat, 0.5) / pct(unrecorded.lat, 0.5), pct(recorded.lat, 0.99) / pct(unrecorded.lat, 0.99));
  std::printf("\nfile.read events stored during the recorded phase: %llu (%.0f/s)\n",
              static_cast<unsigned long long>(reads), static_cast<double>(reads) / loadSeconds);
  if (moatdPid != nullptr) {
    // Events in each phase: 2 per exec, plus the file reads in the last.
    auto row = [&](const char* name, const Cpu& cpu, double seconds, double events) {
      std::printf("| %s | %.0f%% | %.1f%% | %.0f | %.1f |\n", name, cpu.processMs / seconds / 10,
                  cpu.writerMs / seconds / 10, events / seconds, events > 0 ? cpu.writerMs * 1000 / events : 0.0);
    };
    std::printf("\n| phase | moatd CPU (of a core) | audit writer CPU | events/s | writer us/event |\n");
    std::printf("|---|---:|---:|---:|---:|\n");
    row("alone", aloneCpu, aloneSeconds, 2.0 * static_cast<double>(alone.size()));
    row("+ unrecorded load", unrecorded.cpu, unrecorded.seconds, 2.0 * static_cast<double>(unrecorded.lat.size()));
    row("+ recorded load", recorded.cpu, recorded.seconds,
        2.0 * static_cast<double>(recorded.lat.size()) + static_cast<double>(reads) * recorded.seconds / loadSeconds);
  }
  c.call(http::verb::delete_, "/v1/environments/" + target);
  c.call(http::verb::delete_, "/v1/environments/" + loaded);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 1 && argc < 3) {
    std::fprintf(stderr, "usage: %s [SOCKET TOKEN [RATE] [SECONDS]]\n", argv[0]);
    return 2;
  }
  if (int rc = inProcess(); rc != 0) return rc;
  if (argc < 3) return 0;
  int rate = argc > 3 ? std::atoi(argv[3]) : 1200;
  int seconds = argc > 4 ? std::atoi(argv[4]) : 5;
  return againstMoatd(argv[1], argv[2], std::max(rate, 4), std::max(seconds, 1));
}
