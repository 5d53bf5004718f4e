// A blocking HTTP/1.1 client for cross-process tests: one request per connection, bodies
// by Content-Length or chunked (Server-Sent Events are collected as they arrive).
#ifndef STRATA_TESTS_COMMON_HTTP_CLIENT_H_
#define STRATA_TESTS_COMMON_HTTP_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace strata::testing {

struct HttpResponse {
  int status = -1;                             // -1: no response (connection failed)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

// Where requests go (an IPv4 address; default 127.0.0.1), for tests across namespaces.
void SetHttpHost(const std::string& ipv4);

// `on_chunk` (optional) sees each chunk of a chunked body as it arrives; returning false
// closes the connection early (a client that goes away).
HttpResponse HttpRequest(int port, const std::string& method, const std::string& path,
                         const std::string& body = "",
                         const std::vector<std::pair<std::string, std::string>>& headers = {},
                         const std::function<bool(const std::string&)>& on_chunk = nullptr,
                         double timeout_s = 60);

// Sends raw bytes and returns whatever comes back until the server closes (for
// malformed-request tests). With half_close, the sending side is shut down after the
// bytes, which the server takes as a client gone away once it has answered or given up;
// without, the request should ask for "Connection: close".
std::string RawExchange(int port, const std::string& bytes, double timeout_s = 10,
                        bool half_close = true);

// The "data: ..." payloads of an SSE body, in order.
std::vector<std::string> SseEvents(const std::string& body);

// The sum of every series of `name` whose labels contain `label`, on a /metrics port.
double MetricSum(int port, const std::string& name, const std::string& label);

// `n` token ids for a prompt, from 100 up (clear of special tokens), the same for a seed.
std::vector<int> RandomPromptTokens(int n, uint32_t seed);

}  // namespace strata::testing

#endif  // STRATA_TESTS_COMMON_HTTP_CLIENT_H_
