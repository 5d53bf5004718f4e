// A small HTTP/1.1 server on Boost.Beast and Asio: an event loop on a few threads, not a
// thread per connection, so thousands of streaming connections cost memory, not threads.
//
// Protections: a cap on concurrent connections (503 beyond it), limits on header and body
// size (431 / 413), a deadline to receive a request's headers and body (slow clients cannot
// pin a connection), an idle timeout between requests, and a cap on bytes queued for a
// streaming client (a client that does not read is disconnected rather than buffered
// without bound). A whole response (Responder::Send) is delivered whatever its size. A
// client that disconnects while its request runs triggers the responder's close callback,
// so the request can be cancelled.
//
// Requests pipelined on one connection (HTTP/1.1) are handled one at a time and answered
// in the order they came.
//
// Handlers are called on an event-loop thread and must not block it: work that may take
// long (parsing a large body, tokenizing a long prompt) goes to the server's worker
// threads through Responder::Offload.
//
// Thread-safety: Responder methods may be called from any thread; they post to the
// connection's strand, except a part of a stream that the socket takes at once while
// nothing is queued before it, which is sent on the calling thread.
#ifndef STRATA_SERVER_HTTP_HTTP_SERVER_H_
#define STRATA_SERVER_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::http {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;         // 0: any free port
  int threads = 2;         // event-loop threads
  int worker_threads = 2;  // threads for the work handlers pass to Responder::Offload
  int64_t max_connections = 4096;
  int64_t max_header_bytes = 16 << 10;
  int64_t max_body_bytes = 8 << 20;
  absl::Duration request_read_timeout = absl::Seconds(15);  // headers + body
  absl::Duration idle_timeout = absl::Seconds(65);          // keep-alive between requests
  // Bytes of a streamed (chunked) response queued and not yet read by the client; past
  // it the client is disconnected. Whole responses are not capped.
  int64_t max_stream_buffer_bytes = 4 << 20;
};

struct Request {
  std::string method;
  std::string target;                          // path and query
  std::string path;                            // without the query
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string peer;

  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

// How a handler answers: one whole response, or a stream of chunks.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Send(int status, const std::string& content_type, std::string body,
                    std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  // Starts a chunked response; Write() appends chunks; End() finishes it.
  virtual void StartStream(int status, const std::string& content_type,
                           std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual void Write(std::string chunk) = 0;
  virtual void End() = 0;
  // Runs `work` on the server's worker threads instead of the event loop. Work not yet
  // started when the server stops is dropped (with its captures).
  virtual void Offload(std::function<void()> work) = 0;
  // Called once if the client goes away (or is cut off) before the response ended.
  virtual void OnClose(std::function<void()> callback) = 0;
  virtual bool closed() const = 0;
};

using Handler = std::function<void(const Request&, std::shared_ptr<Responder>)>;

struct HttpServerStats {
  std::atomic<int64_t> open_connections{0};
  std::atomic<int64_t> rejected_connections{0};
  std::atomic<int64_t> slow_clients_dropped{0};
  // Parts of streams sent to the socket on the caller's thread (Responder::Write's direct
  // path), without waking an event-loop thread.
  std::atomic<int64_t> chunks_written_directly{0};
};

class HttpServer {
 public:
  // `handler` sees every well-formed request; malformed ones get 400/413/431 here.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           Handler handler);
  ~HttpServer();
  void Stop();
  int port() const { return port_; }
  const HttpServerStats& stats() const { return stats_; }

  struct Impl;  // opaque; public so that the connection code in the .cc can reach it

 private:
  HttpServer() = default;
  HttpServerStats stats_;  // before impl_: connections still open at destruction update it
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace strata::http

#endif  // STRATA_SERVER_HTTP_HTTP_SERVER_H_
