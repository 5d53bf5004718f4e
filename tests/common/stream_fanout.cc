#include "tests/common/stream_fanout.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "common/base/stopwatch.h"

namespace strata::testing {
namespace {

struct Conn {
  int fd = -1;
  std::string out;  // request bytes not yet written
  size_t written = 0;
  std::string in;   // response bytes not yet counted
  size_t scan = 0;  // where counting resumes in `in`
  bool headers_done = false;
  double last_event_s = -1;
  bool closed = false;
};

// Counts complete "data:" lines in `in` (from `*scan`), ignoring chunk framing: event
// payloads are single lines, and chunk-size lines never start with "data:".
int CountEvents(const std::string& in, size_t* scan, bool* done) {
  int events = 0;
  for (;;) {
    const size_t nl = in.find('\n', *scan);
    if (nl == std::string::npos) return events;
    const std::string_view line(in.data() + *scan, nl - *scan);
    if (line.rfind("data:", 0) == 0) {
      ++events;
      if (line.find("[DONE]") != std::string_view::npos) *done = true;
    }
    *scan = nl + 1;
  }
}

}  // namespace

long long RaiseOpenFileLimit(long long n) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  if (static_cast<long long>(limit.rlim_cur) < n) {
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, static_cast<rlim_t>(n));
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  return static_cast<long long>(limit.rlim_cur);
}

long long RssBytes(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      long long kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

std::vector<StreamStats> RunFanout(const FanoutOptions& options) {
  RaiseOpenFileLimit(options.streams + 64);
  const Stopwatch watch;
  std::vector<StreamStats> stats(options.streams);
  std::vector<Conn> conns(options.streams);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  int open = 0;
  for (int i = 0; i < options.streams; ++i) {
    Conn& c = conns[i];
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) {
      c.closed = true;
      continue;
    }
    const int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(options.port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));  // EINPROGRESS
    const std::string body = options.body(i);
    c.out = "POST " + options.path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
            "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\n\r\n" + body;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    ev.data.u32 = static_cast<uint32_t>(i);
    epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
    ++open;
  }
  auto close_conn = [&](int i) {
    Conn& c = conns[i];
    if (c.closed) return;
    c.closed = true;
    epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    close(c.fd);
    stats[i].end_s = watch.ElapsedSeconds();
    --open;
  };
  std::vector<epoll_event> events(256);
  double next_tick = options.tick_s;
  char buf[16384];
  while (open > 0 && watch.ElapsedSeconds() < options.timeout_s) {
    const int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
    for (int k = 0; k < n; ++k) {
      const int i = static_cast<int>(events[k].data.u32);
      Conn& c = conns[i];
      if (c.closed) continue;
      if ((events[k].events & EPOLLOUT) && c.written < c.out.size()) {
        const ssize_t w =
            send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
        if (w > 0) c.written += static_cast<size_t>(w);
        if (c.written == c.out.size()) {
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.u32 = static_cast<uint32_t>(i);
          epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
        }
      }
      if (events[k].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        for (;;) {
          const ssize_t r = recv(c.fd, buf, sizeof(buf), 0);
          if (r > 0) {
            c.in.append(buf, static_cast<size_t>(r));
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            close_conn(i);
          }
          break;
        }
        StreamStats& s = stats[i];
        if (!c.headers_done) {
          const size_t end = c.in.find("\r\n\r\n");
          if (end != std::string::npos) {
            c.headers_done = true;
            if (c.in.rfind("HTTP/1.", 0) == 0) s.status = std::atoi(c.in.substr(9, 3).c_str());
            c.scan = end + 4;
          }
        }
        if (c.headers_done) {
          const int got = CountEvents(c.in, &c.scan, &s.done);
          if (got > 0) {
            const double now = watch.ElapsedSeconds();
            if (s.first_event_s < 0) s.first_event_s = now;
            if (c.last_event_s >= 0) s.max_gap_s = std::max(s.max_gap_s, now - c.last_event_s);
            c.last_event_s = now;
            s.events += got;
            // Keep only the unscanned tail.
            c.in.erase(0, c.scan);
            c.scan = 0;
          }
          if (s.done) close_conn(i);
        }
      }
    }
    if (options.on_tick && watch.ElapsedSeconds() >= next_tick) {
      options.on_tick(watch.ElapsedSeconds(), open);
      next_tick += options.tick_s;
    }
  }
  for (int i = 0; i < options.streams; ++i) close_conn(i);
  close(ep);
  return stats;
}

}  // namespace strata::testing
