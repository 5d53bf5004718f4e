#include "server/http/http_server.h"

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/base/thread_name.h"

namespace strata::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr size_t kWatchBufferCap = 64 << 10;

std::string StatusLine(int status) {
  const auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return absl::StrCat("HTTP/1.1 ", status, " ", std::string(reason.data(), reason.size()), "\r\n");
}

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  Handler handler;
  HttpServerStats* stats = nullptr;
  net::io_context ioc;
  // Declared after ioc, so destroyed first: work still queued holds sessions of ioc.
  std::optional<net::thread_pool> workers;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};

  void Accept();
};

namespace {

class Session;

class SessionResponder : public Responder {
 public:
  // `response`: the number the session gave the response this responder answers.
  SessionResponder(std::shared_ptr<Session> session, uint64_t response)
      : session_(std::move(session)), response_(response) {}
  void Send(int status, const std::string& content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers) override;
  void StartStream(int status, const std::string& content_type,
                   std::vector<std::pair<std::string, std::string>> headers) override;
  void Write(std::string chunk) override;
  void End() override;
  void Offload(std::function<void()> work) override;
  void OnClose(std::function<void()> callback) override;
  bool closed() const override { return closed_.load(); }

  // Called on the session strand.
  void NotifyClosed() {
    if (closed_.exchange(true)) return;
    std::function<void()> cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cb = std::move(on_close_);
    }
    if (cb) cb();
  }
  void MarkDone() { done_ = true; }
  bool done() const { return done_.load(); }

 private:
  std::shared_ptr<Session> session_;
  const uint64_t response_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::function<void()> on_close_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl* server)
      : stream_(std::move(socket)), grace_(stream_.get_executor()), server_(server) {
    ++server_->stats->open_connections;
    beast::error_code ec;
    const auto endpoint = stream_.socket().remote_endpoint(ec);
    if (!ec) peer_ = absl::StrCat(endpoint.address().to_string(), ":", endpoint.port());
  }
  ~Session() { --server_->stats->open_connections; }

  void Start() { WaitForRequest(); }

  // --- called through SessionResponder, from any thread ---
  // `streamed`: a part of a chunked response, whose unread bytes are capped.
  //
  // A part of a stream that is not its end goes straight to the socket, on the caller's
  // thread, when nothing is queued, being written or posted before it and its response
  // (`response`, the responder's number) is the one in progress: the socket takes it
  // without blocking, and no event-loop thread wakes up for it (one wake-up per token of a
  // streamed completion otherwise). What the socket does not take at once, and everything
  // else, is posted to the strand, which writes it in order. (Between responses the socket
  // may be closed by a read's deadline without this lock: a responder whose response has
  // ended never sends directly.)
  void Enqueue(std::string bytes, bool last, bool streamed, uint64_t response) {
    {
      absl::MutexLock lock(&direct_mu_);
      if (streamed && !last && strand_idle_ && posted_ == 0 && response == response_ &&
          !server_->stopped.load()) {
        const ssize_t n = ::send(stream_.socket().native_handle(), bytes.data(), bytes.size(),
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n == static_cast<ssize_t>(bytes.size())) {
          ++server_->stats->chunks_written_directly;
          return;
        }
        // The rest, or all of it after an error, which the strand's write then reports.
        if (n > 0) bytes.erase(0, static_cast<size_t>(n));
      }
      ++posted_;
      strand_idle_ = false;
    }
    net::post(stream_.get_executor(),
              [self = shared_from_this(), bytes = std::move(bytes), last, streamed]() mutable {
                {
                  // In one hold with the queueing below it: the strand is not idle from
                  // here on until it has written what this brings.
                  absl::MutexLock lock(&self->direct_mu_);
                  --self->posted_;
                  self->strand_idle_ = false;
                }
                self->EnqueueOnStrand(std::move(bytes), last, streamed);
              });
  }
  void Offload(std::function<void()> work) { net::post(*server_->workers, std::move(work)); }
  void SetCloseAfterResponse() { keep_alive_ = false; }
  bool keep_alive() const { return keep_alive_; }

 private:
  // Waits (idle timeout) for the first bytes of the next request, unless some are buffered.
  void WaitForRequest() {
    if (buffer_.size() > 0) {
      ReadRequest();
      return;
    }
    stream_.expires_after(absl::ToChronoMilliseconds(server_->options.idle_timeout));
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->buffer_.commit(n);
                              if (ec) return self->Close();
                              self->ReadRequest();
                            });
  }

  void ReadRequest() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_->options.max_header_bytes));
    parser_->body_limit(static_cast<uint64_t>(server_->options.max_body_bytes));
    stream_.expires_after(absl::ToChronoMilliseconds(server_->options.request_read_timeout));
    bhttp::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRequest(ec); });
  }

  void OnRequest(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) return Reject(413, "request body exceeds the limit");
    if (ec == bhttp::error::header_limit) return Reject(431, "request headers exceed the limit");
    if (ec == beast::error::timeout || ec == bhttp::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset) {
      return Close();
    }
    if (ec) return Reject(400, absl::StrCat("malformed HTTP request: ", ec.message()));
    stream_.expires_never();
    const auto& msg = parser_->get();
    Request request;
    request.method = std::string(msg.method_string());
    request.target = std::string(msg.target());
    request.path = request.target.substr(0, request.target.find('?'));
    for (const auto& field : msg) {
      request.headers[absl::AsciiStrToLower(std::string(field.name_string()))] =
          std::string(field.value());
    }
    request.body = msg.body();
    request.peer = peer_;
    keep_alive_ = msg.keep_alive();
    responder_ = std::make_shared<SessionResponder>(shared_from_this(), NewResponse());
    response_done_ = false;
    Watch();
    server_->handler(request, responder_);
  }

  // Reads while a request is processed, to notice a client that goes away (and to keep any
  // pipelined bytes for the next request).
  void Watch() {
    if (watching_ || buffer_.size() >= kWatchBufferCap) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->watching_ = false;
                              self->buffer_.commit(n);
                              if (std::exchange(self->watch_cancelled_, false) &&
                                  ec == net::error::operation_aborted && !self->closed_) {
                                // Stopped when the response ended: go on to the next request.
                                return self->WaitForRequest();
                              }
                              if (ec) {
                                self->client_gone_ = true;
                                if (!self->response_done_ && self->responder_)
                                  self->responder_->NotifyClosed();
                                if (self->response_done_) return self->Close();
                                // EOF may be a half-close from a client that still reads:
                                // a response already on its way (an error, say) is sent,
                                // then the connection closes; a cancelled generation sends
                                // none, so the connection closes after a short grace.
                                self->CloseAfterGrace();
                                return;
                              }
                              if (self->response_done_) {
                                self->ReadRequest();
                              } else {
                                self->Watch();
                              }
                            });
  }

  void Reject(int status, const std::string& message) {
    const std::string body =
        absl::StrCat(R"({"error":{"message":")", message,
                     R"(","type":"invalid_request_error","param":null,"code":)", status, "}}");
    keep_alive_ = false;
    responder_ = std::make_shared<SessionResponder>(shared_from_this(), NewResponse());
    std::string bytes = absl::StrCat(
        StatusLine(status), "Content-Type: application/json\r\nContent-Length: ", body.size(),
        "\r\nConnection: close\r\n\r\n", body);
    EnqueueOnStrand(std::move(bytes), /*last=*/true, /*streamed=*/false);
  }

  // A whole response is queued as one piece however large: it is already in memory, and
  // cutting it off would lose work done. The cap is for streams, which grow while the
  // client does not read.
  // The strand is marked busy already: by the post that brought `bytes` (Enqueue), or, for
  // Reject's answer, it does not matter: Reject's new response shuts out every earlier
  // responder's direct path.
  void EnqueueOnStrand(std::string bytes, bool last, bool streamed) {
    if (closed_) return;
    queued_bytes_ += bytes.size();
    queue_.push_back(std::move(bytes));
    if (last) last_queued_ = true;
    if (streamed && queued_bytes_ > static_cast<size_t>(server_->options.max_stream_buffer_bytes)) {
      ++server_->stats->slow_clients_dropped;
      LOG_FIRST_N(WARNING, 5) << "dropping " << peer_ << ": " << queued_bytes_
                              << " bytes queued that the client does not read";
      if (responder_) responder_->NotifyClosed();
      return Close();
    }
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    if (queue_.empty()) {
      writing_ = false;
      if (last_queued_) OnResponseDone();
      if (!closed_) SetStrandIdle(true);
      return;
    }
    writing_ = true;
    net::async_write(stream_, net::buffer(queue_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->queued_bytes_ -= self->queue_.front().size();
                       self->queue_.pop_front();
                       if (ec) {
                         if (self->responder_) self->responder_->NotifyClosed();
                         return self->Close();
                       }
                       self->DoWrite();
                     });
  }

  void OnResponseDone() {
    last_queued_ = false;
    response_done_ = true;
    NewResponse();  // none in progress: the ended one's responder sends nothing directly
    if (responder_) responder_->MarkDone();
    responder_.reset();
    if (!keep_alive_ || client_gone_ || server_->stopped.load()) return Close();
    if (watching_) {
      // The watch read has no deadline, and a request the client pipelined may be buffered
      // already: stop it; its handler then waits for the next request (idle timeout) or
      // reads the buffered one.
      watch_cancelled_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    WaitForRequest();
  }

  void CloseAfterGrace() {
    grace_.expires_after(absl::ToChronoNanoseconds(absl::Seconds(2)));
    grace_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->Close();
    });
  }

  void Close() {
    if (closed_) return;
    grace_.cancel();
    closed_ = true;
    // Under the direct path's lock: no send starts on the descriptor once it is closed
    // (and perhaps reused).
    absl::MutexLock lock(&direct_mu_);
    strand_idle_ = false;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  void SetStrandIdle(bool idle) {
    absl::MutexLock lock(&direct_mu_);
    strand_idle_ = idle;
  }

  // On the strand: a new response begins (or, from OnResponseDone, none is in progress);
  // responders of earlier ones no longer send directly.
  uint64_t NewResponse() {
    absl::MutexLock lock(&direct_mu_);
    return ++response_;
  }

  beast::tcp_stream stream_;
  net::steady_timer grace_;
  HttpServer::Impl* server_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<SessionResponder> responder_;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool watching_ = false;
  bool watch_cancelled_ = false;  // the watch read was cancelled as the response ended
  bool last_queued_ = false;
  bool response_done_ = true;
  bool keep_alive_ = true;
  bool client_gone_ = false;
  bool closed_ = false;
  std::string peer_;

  // The direct path (Enqueue).
  absl::Mutex direct_mu_;
  // The strand has nothing queued and no write in flight, and the socket is open.
  bool strand_idle_ ABSL_GUARDED_BY(direct_mu_) = true;
  int posted_ ABSL_GUARDED_BY(direct_mu_) = 0;         // Enqueue's posts not yet run on the strand
  uint64_t response_ ABSL_GUARDED_BY(direct_mu_) = 0;  // the response in progress (NewResponse)
};

std::string HeaderBlock(int status, const std::string& content_type,
                        const std::vector<std::pair<std::string, std::string>>& headers,
                        bool keep_alive) {
  std::string out = StatusLine(status);
  absl::StrAppend(&out, "Content-Type: ", content_type, "\r\n");
  for (const auto& [name, value] : headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
  absl::StrAppend(&out, "Connection: ", keep_alive ? "keep-alive" : "close", "\r\n");
  return out;
}

void SessionResponder::Send(int status, const std::string& content_type, std::string body,
                            std::vector<std::pair<std::string, std::string>> headers) {
  std::string bytes = HeaderBlock(status, content_type, headers, session_->keep_alive());
  absl::StrAppend(&bytes, "Content-Length: ", body.size(), "\r\n\r\n");
  bytes += body;
  session_->Enqueue(std::move(bytes), /*last=*/true, /*streamed=*/false, response_);
}

void SessionResponder::StartStream(int status, const std::string& content_type,
                                   std::vector<std::pair<std::string, std::string>> headers) {
  std::string bytes = HeaderBlock(status, content_type, headers, session_->keep_alive());
  bytes += "Transfer-Encoding: chunked\r\n\r\n";
  session_->Enqueue(std::move(bytes), /*last=*/false, /*streamed=*/true, response_);
}

void SessionResponder::Write(std::string chunk) {
  if (chunk.empty()) return;
  std::string bytes = absl::StrFormat("%x\r\n", chunk.size());
  bytes += chunk;
  bytes += "\r\n";
  session_->Enqueue(std::move(bytes), /*last=*/false, /*streamed=*/true, response_);
}

void SessionResponder::End() {
  session_->Enqueue("0\r\n\r\n", /*last=*/true, /*streamed=*/true, response_);
}

void SessionResponder::Offload(std::function<void()> work) { session_->Offload(std::move(work)); }

void SessionResponder::OnClose(std::function<void()> callback) {
  bool call_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.load()) {
      call_now = true;
    } else {
      on_close_ = std::move(callback);
    }
  }
  if (call_now && callback) callback();
}

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (stopped.load()) return;
    if (!ec) {
      if (stats->open_connections.load() >= options.max_connections) {
        ++stats->rejected_connections;
        static const std::string kBusy =
            StatusLine(503) +
            "Content-Type: application/json\r\nConnection: close\r\nContent-Length: 103\r\n\r\n"
            R"({"error":{"message":"too many connections","type":"server_error","param":null,"code":503}})"
            "          ";
        boost::system::error_code ignored;
        net::write(socket, net::buffer(kBusy), ignored);
        socket.close(ignored);
      } else {
        std::make_shared<Session>(std::move(socket), this)->Start();
      }
    }
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              Handler handler) {
  auto server = std::unique_ptr<HttpServer>(new HttpServer);
  server->impl_ = std::make_unique<Impl>();
  Impl& impl = *server->impl_;
  impl.options = options;
  impl.handler = std::move(handler);
  impl.stats = &server->stats_;
  beast::error_code ec;
  const auto address = net::ip::make_address(options.host, ec);
  if (ec) return absl::InvalidArgumentError("bad listen address " + options.host);
  impl.acceptor.emplace(impl.ioc);
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(options.port));
  impl.acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor->bind(endpoint, ec);
  if (!ec) impl.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port, ": ", ec.message()));
  }
  server->port_ = impl.acceptor->local_endpoint().port();
  impl.workers.emplace(static_cast<size_t>(std::max(1, options.worker_threads)));
  impl.Accept();
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    impl.threads.emplace_back([&impl] {
      SetCurrentThreadName("http-io");
      impl.ioc.run();
    });
  }
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (impl_ == nullptr || impl_->stopped.exchange(true)) return;
  net::post(impl_->ioc, [this] {
    beast::error_code ec;
    impl_->acceptor->close(ec);
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  // Work running finishes (what it sends goes nowhere: the event loop has stopped); work
  // queued is dropped when the pool is destroyed.
  if (impl_->workers) {
    impl_->workers->stop();
    impl_->workers->join();
  }
}

}  // namespace strata::http
