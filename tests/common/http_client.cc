#include "tests/common/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <random>

namespace strata::testing {
namespace {

std::string& Host() {
  static std::string host = "127.0.0.1";
  return host;
}

int Connect(int port, double timeout_s) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{static_cast<time_t>(timeout_s),
             static_cast<suseconds_t>((timeout_s - static_cast<int>(timeout_s)) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, Host().c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += n;
  }
  return true;
}

// Reads until `buffer` holds at least `n` bytes past `pos`; false at EOF/timeout.
bool Fill(int fd, std::string& buffer, size_t need) {
  char tmp[16384];
  while (buffer.size() < need) {
    const ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buffer.append(tmp, n);
  }
  return true;
}

bool ReadLine(int fd, std::string& buffer, size_t& pos, std::string* line) {
  while (true) {
    const size_t end = buffer.find("\r\n", pos);
    if (end != std::string::npos) {
      *line = buffer.substr(pos, end - pos);
      pos = end + 2;
      return true;
    }
    char tmp[16384];
    const ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buffer.append(tmp, n);
  }
}

}  // namespace

void SetHttpHost(const std::string& ipv4) { Host() = ipv4; }

HttpResponse HttpRequest(int port, const std::string& method, const std::string& path,
                         const std::string& body,
                         const std::vector<std::pair<std::string, std::string>>& headers,
                         const std::function<bool(const std::string&)>& on_chunk,
                         double timeout_s) {
  HttpResponse response;
  const int fd = Connect(port, timeout_s);
  if (fd < 0) return response;
  std::string request =
      method + " " + path + " HTTP/1.1\r\nHost: " + Host() + "\r\nConnection: close\r\n";
  for (const auto& [k, v] : headers) request += k + ": " + v + "\r\n";
  if (!body.empty() || method == "POST") {
    request +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  request += "\r\n" + body;
  if (!SendAll(fd, request)) {
    close(fd);
    return response;
  }
  std::string buffer;
  size_t pos = 0;
  std::string line;
  if (!ReadLine(fd, buffer, pos, &line) || line.size() < 12) {
    close(fd);
    return response;
  }
  response.status = std::atoi(line.substr(9, 3).c_str());
  while (ReadLine(fd, buffer, pos, &line) && !line.empty()) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t v = colon + 1;
    while (v < line.size() && line[v] == ' ') ++v;
    response.headers[name] = line.substr(v);
  }
  if (response.headers["transfer-encoding"] == "chunked") {
    while (true) {
      if (!ReadLine(fd, buffer, pos, &line)) break;
      const size_t size = std::strtoul(line.c_str(), nullptr, 16);
      if (size == 0) break;
      if (!Fill(fd, buffer, pos + size + 2)) break;
      const std::string chunk = buffer.substr(pos, size);
      pos += size + 2;
      response.body += chunk;
      if (on_chunk && !on_chunk(chunk)) break;
    }
  } else if (response.headers.count("content-length")) {
    const size_t length = std::strtoul(response.headers["content-length"].c_str(), nullptr, 10);
    Fill(fd, buffer, pos + length);
    response.body = buffer.substr(pos, length);
  } else {
    char tmp[16384];
    ssize_t n;
    while ((n = recv(fd, tmp, sizeof(tmp), 0)) > 0) buffer.append(tmp, n);
    response.body = buffer.substr(pos);
  }
  close(fd);
  return response;
}

std::string RawExchange(int port, const std::string& bytes, double timeout_s, bool half_close) {
  const int fd = Connect(port, timeout_s);
  if (fd < 0) return "";
  SendAll(fd, bytes);
  if (half_close) shutdown(fd, SHUT_WR);
  std::string out;
  char tmp[16384];
  ssize_t n;
  while ((n = recv(fd, tmp, sizeof(tmp), 0)) > 0) out.append(tmp, n);
  close(fd);
  return out;
}

std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> events;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    events.push_back(
        body.substr(pos + 6, end == std::string::npos ? std::string::npos : end - pos - 6));
    if (end == std::string::npos) break;
    pos = end + 2;
  }
  return events;
}

double MetricSum(int port, const std::string& name, const std::string& label) {
  const HttpResponse r = HttpRequest(port, "GET", "/metrics");
  double sum = 0;
  size_t at = 0;
  while ((at = r.body.find("\n" + name + "{", at)) != std::string::npos) {
    const size_t end = r.body.find('\n', at + 1);
    const std::string line = r.body.substr(at + 1, end - at - 1);
    at = end;
    if (line.find(label) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

std::vector<int> RandomPromptTokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(100 + static_cast<int>(rng() % 20000));
  return out;
}

}  // namespace strata::testing
