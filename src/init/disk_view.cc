#include "init/disk_view.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "os/statfs_notify.h"

namespace moat::init {

struct statfs diskView(const struct statfs& real, uint64_t limitBytes, uint64_t usedBytes) {
  struct statfs view = real;
  // statvfs's (and so df's) unit is f_frsize when the kernel gives one.
  const uint64_t unit = real.f_frsize > 0 ? static_cast<uint64_t>(real.f_frsize) : static_cast<uint64_t>(real.f_bsize);
  if (limitBytes == 0 || unit == 0) return view;
  const uint64_t blocks = limitBytes / unit;
  const uint64_t used = (usedBytes + unit - 1) / unit;
  const uint64_t left = used >= blocks ? 0 : blocks - used;
  view.f_blocks = blocks;
  view.f_bfree = std::min<uint64_t>(left, real.f_bfree);
  view.f_bavail = std::min<uint64_t>(left, real.f_bavail);
  return view;
}

namespace {

constexpr size_t kThreadStack = 128u << 10;

bool sameFileSystem(const struct statfs& a, const struct statfs& b) {
  return a.f_type == b.f_type && std::memcmp(&a.f_fsid, &b.f_fsid, sizeof a.f_fsid) == 0;
}

// What the feed starts with.
struct Start {
  int listener;
  bool fed;  // notifications come through the feed (else: from the listener)
};

bool readWhole(int fd, void* out, size_t len) {
  auto* p = static_cast<char*>(out);
  while (len > 0) {
    ssize_t got = ::read(fd, p, len);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    len -= static_cast<size_t>(got);
  }
  return true;
}

struct Responder {
  os::QgroupCounters counters;
  struct statfs root {};
  UniqueFd feed;
  UniqueFd listener;

  void answer(const os::ExecNotification& n) {
    auto real = os::statfsAsCalled(n);
    if (real.ok() && sameFileSystem(real.value(), root)) {
      auto limit = os::readSysfsNumber(counters.maxReferenced.get());
      auto used = os::readSysfsNumber(counters.referenced.get());
      if (limit.ok() && used.ok() && limit.value() > 0 &&
          os::answerStatfs(listener.get(), n, diskView(real.value(), limit.value(), used.value())).ok()) {
        return;
      }
    }
    // Anything else, and on any doubt: the call runs as it would (gone
    // meanwhile: nothing to answer).
    (void)os::answerExecNotification(listener.get(), n.id, true);
  }

  void run() {
    Start start{};
    if (!readWhole(feed.get(), &start, sizeof start) || start.listener < 0) return;
    listener.reset(start.listener);
    for (;;) {
      if (start.fed) {
        os::ExecNotification n;
        if (!readWhole(feed.get(), &n, sizeof n)) return;  // the feed closed: the end
        answer(n);
        continue;
      }
      auto n = os::receiveExecNotification(listener.get());
      if (n.ok() && os::isStatfsCall(n->nr)) {
        answer(n.value());
      } else if (n.ok()) {
        (void)os::answerExecNotification(listener.get(), n->id, false);  // not this filter's: cannot happen
      } else if (n.error().sysErrno != ENOENT && n.error().sysErrno != EINTR) {
        return;
      }
    }
  }

  static void* main(void* self) {
    auto* r = static_cast<Responder*>(self);
    r->run();
    delete r;
    return nullptr;
  }
};

}  // namespace

Result<std::unique_ptr<DiskView>> DiskView::start(os::QgroupCounters counters) {
  // moat-init's alone: no command inherits them.
  for (int fd : {counters.referenced.get(), counters.maxReferenced.get()}) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  auto r = std::make_unique<Responder>();
  r->counters = std::move(counters);
  if (os::statfsUnwatched("/", &r->root) != 0) return Error::fromErrno("statfs /");
  int pipe[2];
  if (::pipe2(pipe, O_CLOEXEC) != 0) return Error::fromErrno("pipe");
  r->feed.reset(pipe[0]);
  std::unique_ptr<DiskView> view(new DiskView);
  view->feed_.reset(pipe[1]);
  pthread_attr_t attr;
  pthread_t thread;
  ::pthread_attr_init(&attr);
  ::pthread_attr_setstacksize(&attr, kThreadStack);
  ::pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int err = ::pthread_create(&thread, &attr, &Responder::main, r.get());
  ::pthread_attr_destroy(&attr);
  if (err != 0) return Error::fromErrno("statfs thread", err);
  r.release();  // the thread's
  return view;
}

DiskView::~DiskView() = default;  // closing the feed ends the thread

void DiskView::serve(UniqueFd listener) {
  Start start{listener.release(), false};
  if (::write(feed_.get(), &start, sizeof start) != sizeof start) ::close(start.listener);
  feed_.reset();  // nothing more comes this way
}

void DiskView::share(int listener) {
  Start start{::fcntl(listener, F_DUPFD_CLOEXEC, 0), true};
  if (start.listener < 0 || ::write(feed_.get(), &start, sizeof start) != sizeof start) {
    if (start.listener >= 0) ::close(start.listener);
    feed_.reset();
    return;
  }
  listener_ = listener;
  ::fcntl(feed_.get(), F_SETFL, O_NONBLOCK);
}

void DiskView::hand(int listener, const os::ExecNotification& n) {
  // A notification is far less than PIPE_BUF: written whole or not at all.
  if (feed_ && listener == listener_ && ::write(feed_.get(), &n, sizeof n) == sizeof n) return;
  (void)os::answerExecNotification(listener, n.id, true);
}

}  // namespace moat::init
