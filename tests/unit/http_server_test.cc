// moatd's connection table (api/http.h): TCP clients never take the last
// sixteenth of --max-connections, so the host's operator on the unix socket
// is served while TCP clients hold every other place busy.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "api/http.h"
#include "moatd_process.h"

namespace moat::api {
namespace {

// Sends one request and reads the answer's status line (0: none).
int statusOf(int fd, const std::string& path) {
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return 0;
  char buf[512];
  ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  return n >= 12 ? std::atoi(std::string(buf + 9, 3).c_str()) : 0;
}

TEST(HttpServerPlaces, TcpClientsLeaveTheLastSixteenthToTheUnixSocket) {
  std::mutex mutex;
  std::condition_variable cv;
  bool release = false;
  size_t holding = 0;
  HttpServer server(
      [&](const HttpRequest& req) {
        HttpResponse r;
        if (req.path == "/hold") {
          std::unique_lock<std::mutex> lock(mutex);
          ++holding;
          cv.notify_all();
          cv.wait(lock, [&] { return release; });
        }
        r.body = "{}";
        return r;
      },
      nullptr, ServerLimits{.maxConnections = 16});
  char dir[] = "/tmp/moat-http-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string socket = std::string(dir) + "/s.sock";
  ASSERT_TRUE(server.listenTcp("127.0.0.1:0").ok());
  ASSERT_TRUE(server.listenUnix(socket).ok());
  // 15 TCP clients, each with a request in progress: every TCP place.
  std::vector<int> busy;
  for (int i = 0; i < 15; ++i) {
    int fd = test::connectLoopbackTcp(server.tcpPort());
    ASSERT_GE(fd, 0);
    const std::string req = "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    busy.push_back(fd);
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return holding == 15; })) << holding;
  }
  // A 16th TCP client, which would hold the last place too, is told to
  // retry; the unix socket is served.
  int more = test::connectLoopbackTcp(server.tcpPort());
  ASSERT_GE(more, 0);
  EXPECT_EQ(statusOf(more, "/hold"), 503);
  ::close(more);
  int local = test::connectUnix(socket);
  ASSERT_GE(local, 0);
  EXPECT_EQ(statusOf(local, "/ok"), 200);
  ::close(local);
  // Another user on the unix socket (a member of --socket-group's group)
  // counts as a TCP client: the kept places are not theirs.
  if (::geteuid() == 0) {
    ASSERT_EQ(::chmod(dir, 0711), 0);
    ASSERT_EQ(::chmod(socket.c_str(), 0666), 0);
    int answer[2];
    ASSERT_EQ(::pipe(answer), 0);
    pid_t child = ::fork();
    if (child == 0) {
      int status = 0;
      if (::setgid(65534) == 0 && ::setuid(65534) == 0) {
        // The 503 comes at once, before any request (one sent after it
        // would meet a closed socket); a place given would answer nothing.
        int fd = test::connectUnix(socket);
        struct timeval wait = {5, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
        char buf[512];
        ssize_t n = fd >= 0 ? ::recv(fd, buf, sizeof buf, 0) : -1;
        status = n >= 12 ? std::atoi(std::string(buf + 9, 3).c_str()) : -1;
      }
      (void)!::write(answer[1], &status, sizeof status);
      ::_exit(0);
    }
    ::close(answer[1]);
    int status = 0;
    ASSERT_EQ(::read(answer[0], &status, sizeof status), static_cast<ssize_t>(sizeof status));
    ::close(answer[0]);
    ::waitpid(child, nullptr, 0);
    EXPECT_EQ(status, 503) << "another user on the unix socket took a place kept for root";
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  cv.notify_all();
  for (int fd : busy) {
    char buf[512];
    EXPECT_GT(::recv(fd, buf, sizeof buf, 0), 0);
    ::close(fd);
  }
  server.stop();
  ::unlink(socket.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace moat::api
