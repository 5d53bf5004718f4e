#include "common/process/supervisor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

extern char** environ;

namespace strata {

Supervisor::~Supervisor() { StopAll(absl::Seconds(5)); }

absl::StatusOr<pid_t> Supervisor::Spawn(const ChildSpec& spec) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (!spec.env.count(key)) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the launcher already died
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
    fprintf(stderr, "cannot start %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  children_[spec.name] = pid;
  return pid;
}

bool Supervisor::Reap(std::string* name, int* status) {
  for (auto it = children_.begin(); it != children_.end(); ++it) {
    int s = 0;
    if (waitpid(it->second, &s, WNOHANG) == it->second) {
      *name = it->first;
      *status = s;
      children_.erase(it);
      return true;
    }
  }
  return false;
}

void Supervisor::Stop(const std::string& name, absl::Duration grace) {
  std::vector<std::pair<std::string, pid_t>> targets;
  for (const auto& [n, pid] : children_) {
    if (name.empty() || n == name) targets.emplace_back(n, pid);
  }
  for (const auto& [n, pid] : targets) kill(pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  for (const auto& [n, pid] : targets) {
    while (true) {
      int status;
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid || r < 0) break;
      if (absl::Now() > deadline) {
        LOG(WARNING) << n << " did not stop within " << absl::FormatDuration(grace)
                     << "; killing it";
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    children_.erase(n);
  }
}

bool Supervisor::Running(const std::string& name) const { return children_.count(name) > 0; }

pid_t Supervisor::Pid(const std::string& name) const {
  auto it = children_.find(name);
  return it == children_.end() ? -1 : it->second;
}

std::vector<std::string> Supervisor::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, pid] : children_) names.push_back(name);
  return names;
}

int HttpGetStatus(int port, const std::string& path, absl::Duration timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{static_cast<time_t>(absl::ToInt64Seconds(timeout)),
             static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return -1;
  }
  char buf[64] = {0};
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  int status = -1;
  if (n > 12 && sscanf(buf, "HTTP/1.%*d %d", &status) == 1) return status;
  return -1;
}

}  // namespace strata
