// The HTTP API at its edges, against a real server: non-streamed responses larger than
// --max_stream_buffer_bytes arrive whole, pipelined requests on one connection are all
// answered in order, an idle keep-alive connection is closed after --idle_timeout_s, an
// oversized logit_bias is refused quickly with the limit named, and /health stays prompt
// while large bodies are being parsed and tokenized.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/stopwatch.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

// One response read off a connection that may carry more (Content-Length bodies only).
struct RawResponse {
  int status = -1;
  std::string headers;
  std::string body;
};

// A connection to the server on 127.0.0.1 whose reads give up after `timeout_s`; -1 if none.
int Connect(int port, int timeout_s) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool Send(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Reads the next response from `fd`, consuming it from `*buffer`; status -1 on EOF or
// timeout.
RawResponse ReadResponse(int fd, std::string* buffer) {
  RawResponse r;
  char tmp[16384];
  size_t header_end;
  while ((header_end = buffer->find("\r\n\r\n")) == std::string::npos) {
    const ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) return r;
    buffer->append(tmp, n);
  }
  r.headers = buffer->substr(0, header_end);
  std::smatch m;
  if (!std::regex_search(r.headers, m, std::regex("Content-Length: (\\d+)", std::regex::icase)) ||
      r.headers.size() < 12) {
    return r;
  }
  const size_t length = std::stoul(m[1]);
  while (buffer->size() < header_end + 4 + length) {
    const ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) return r;
    buffer->append(tmp, n);
  }
  r.status = std::atoi(r.headers.substr(9, 3).c_str());
  r.body = buffer->substr(header_end + 4, length);
  buffer->erase(0, header_end + 4 + length);
  return r;
}

class HttpLimitsTest : public ::testing::Test {
 protected:
  static constexpr int64_t kMaxBodyBytes = 16 << 20;
  static constexpr int kIdleTimeoutSeconds = 3;

  static void SetUpTestSuite() {
    DeploymentOptions options;
    options.server_args = {absl::StrCat("--max_body_bytes=", kMaxBodyBytes),
                           absl::StrCat("--idle_timeout_s=", kIdleTimeoutSeconds)};
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    deployment_ = d->release();
    model_ = json::parse(HttpRequest(port(), "GET", "/v1/models").body)["data"][0]["id"];
    std::ifstream config(deployment_->model_dir() + "/config.json");
    vocab_size_ = json::parse(config)["vocab_size"];
  }
  static void TearDownTestSuite() {
    if (deployment_ != nullptr) EXPECT_EQ(deployment_->Stop(), 0);
    delete deployment_;
  }
  static int port() { return deployment_->http_port(); }

  // strata_request_success_total{finished_reason="length"}.
  static double FinishedByLength() {
    const std::string text = HttpRequest(port(), "GET", "/metrics").body;
    std::smatch m;
    const std::regex re(
        "strata_request_success_total\\{[^}]*finished_reason=\"length\"[^}]*\\} (\\S+)");
    return std::regex_search(text, m, re) ? std::stod(m[1]) : -1;
  }

  // A completion body whose logit_bias has `entries` keys 0, 1, ... (all bias 0).
  static std::string LogitBiasBody(int entries) {
    std::string bias;
    for (int i = 0; i < entries; ++i) absl::StrAppend(&bias, i == 0 ? "" : ",", "\"", i, "\":0");
    return absl::StrCat("{\"model\":\"", model_,
                        "\",\"prompt\":\"Hello\",\"max_tokens\":1,\"logit_bias\":{", bias, "}}");
  }

  static Deployment* deployment_;
  static std::string model_;
  static int64_t vocab_size_;
};

Deployment* HttpLimitsTest::deployment_ = nullptr;
std::string HttpLimitsTest::model_;
int64_t HttpLimitsTest::vocab_size_ = 0;

TEST_F(HttpLimitsTest, LargeNonStreamedCompletionArrivesWhole) {
  const double finished_before = FinishedByLength();
  const json request = {{"model", model_},
                        {"prompt", "Hello"},
                        {"n", 16},
                        {"logprobs", 20},
                        {"max_tokens", 500},
                        {"ignore_eos", true},
                        {"temperature", 1.0},
                        {"return_tokens_as_token_ids", true}};
  HttpResponse r = HttpRequest(port(), "POST", "/v1/completions", request.dump(), {}, nullptr, 120);
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
  EXPECT_GT(r.body.size(), size_t{4} << 20);  // more than --max_stream_buffer_bytes
  const json body = json::parse(r.body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << "truncated body of " << r.body.size() << " bytes";
  ASSERT_EQ(body["choices"].size(), 16u);
  for (const json& choice : body["choices"]) {
    EXPECT_EQ(choice["finish_reason"], "length");
    EXPECT_EQ(choice["logprobs"]["tokens"].size(), 500u);
    EXPECT_EQ(choice["logprobs"]["top_logprobs"][499].size(), 20u);
  }
  EXPECT_EQ(body["usage"]["completion_tokens"], 16 * 500);
  EXPECT_EQ(FinishedByLength(), finished_before + 16);  // one per sample
}

TEST_F(HttpLimitsTest, LargeDetokenizeArrivesWhole) {
  // A token whose text is several bytes, repeated a million times: over 4 MiB of text.
  const json tokens = json::parse(
      HttpRequest(
          port(), "POST", "/tokenize",
          json({{"prompt", "international relations"}, {"add_special_tokens", false}}).dump())
          .body)["tokens"];
  int32_t token = -1;
  std::string one;
  for (const json& t : tokens) {
    const std::string text = json::parse(
        HttpRequest(port(), "POST", "/detokenize", json({{"tokens", {t}}}).dump()).body)["prompt"];
    if (text.size() > one.size()) {
      token = t;
      one = text;
    }
  }
  ASSERT_GE(one.size(), 5u) << tokens;
  std::string ids;
  for (int i = 0; i < 1000000; ++i) absl::StrAppend(&ids, i == 0 ? "" : ",", token);
  HttpResponse r = HttpRequest(port(), "POST", "/detokenize",
                               absl::StrCat("{\"tokens\":[", ids, "]}"), {}, nullptr, 120);
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
  const json body = json::parse(r.body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << "truncated body of " << r.body.size() << " bytes";
  EXPECT_GE(body["prompt"].get<std::string>().size(), 1000000 * one.size() - 1);
}

TEST_F(HttpLimitsTest, PipelinedRequestsAreAnsweredInOrder) {
  const int fd = Connect(port(), 15);
  ASSERT_GE(fd, 0);
  const std::string completion =
      json({{"model", model_}, {"prompt", "Hello"}, {"max_tokens", 4}}).dump();
  const std::string bytes =
      absl::StrCat("GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                   "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
                   "Content-Length: ", completion.size(), "\r\n\r\n", completion,
                   "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
                   "GET /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(Send(fd, bytes));

  std::string buffer;
  const RawResponse health = ReadResponse(fd, &buffer);
  EXPECT_EQ(health.status, 200) << health.headers;
  EXPECT_EQ(json::parse(health.body, nullptr, false).value("status", ""), "ok");
  const RawResponse generated = ReadResponse(fd, &buffer);
  ASSERT_EQ(generated.status, 200) << generated.headers << generated.body;
  EXPECT_EQ(json::parse(generated.body)["object"], "text_completion");
  const RawResponse models = ReadResponse(fd, &buffer);
  ASSERT_EQ(models.status, 200) << models.headers << models.body;
  EXPECT_EQ(json::parse(models.body)["object"], "list");
  const RawResponse wrong_method = ReadResponse(fd, &buffer);
  EXPECT_EQ(wrong_method.status, 405) << wrong_method.headers << wrong_method.body;
  // The last request asked to close: the server closes after it.
  char tmp[16];
  EXPECT_EQ(recv(fd, tmp, sizeof(tmp), 0), 0);
  close(fd);
}

TEST_F(HttpLimitsTest, KeepAliveConnectionClosesWhenIdle) {
  const int fd = Connect(port(), 15);
  ASSERT_GE(fd, 0);
  std::string buffer;
  for (int i = 0; i < 2; ++i) {  // the second request comes after a first one was answered
    ASSERT_TRUE(Send(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_EQ(ReadResponse(fd, &buffer).status, 200);
  }
  const Stopwatch idle_watch;
  char tmp[16];
  EXPECT_EQ(recv(fd, tmp, sizeof(tmp), 0), 0) << "the server did not close the idle connection";
  const double idle_seconds = idle_watch.ElapsedSeconds();
  EXPECT_GT(idle_seconds, kIdleTimeoutSeconds - 1.0);
  EXPECT_LT(idle_seconds, kIdleTimeoutSeconds + 5.0);
  close(fd);
}

TEST_F(HttpLimitsTest, LogitBiasOverTheVocabularyIsRefusedQuickly) {
  ASSERT_LT(vocab_size_, 100000);
  const Stopwatch watch;
  HttpResponse r = HttpRequest(port(), "POST", "/v1/completions", LogitBiasBody(100000));
  const double seconds = watch.ElapsedSeconds();
  ASSERT_EQ(r.status, 400) << r.body;
  const json error = json::parse(r.body)["error"];
  EXPECT_EQ(error["param"], "logit_bias");
  EXPECT_NE(error["message"].get<std::string>().find(absl::StrCat("at most ", vocab_size_)),
            std::string::npos)
      << error["message"];
  // Parsing is linear: this took 14 s when each key cost a scan of the keys before it.
  EXPECT_LT(seconds, 3.0);

  // A bias for every token of the vocabulary is allowed, and is as quick.
  const Stopwatch full_watch;
  HttpResponse full = HttpRequest(port(), "POST", "/v1/completions", LogitBiasBody(vocab_size_));
  EXPECT_EQ(full.status, 200) << full.body.substr(0, 300);
  EXPECT_LT(full_watch.ElapsedSeconds(), 3.0);

  const std::string past_vocab = absl::StrCat(
      "{\"model\":\"", model_, "\",\"prompt\":\"Hello\",\"logit_bias\":{\"", vocab_size_, "\":1}}");
  r = HttpRequest(port(), "POST", "/v1/completions", past_vocab);
  EXPECT_EQ(r.status, 400) << r.body;
  const std::string twice = absl::StrCat(
      "{\"model\":\"", model_, "\",\"prompt\":\"Hello\",\"logit_bias\":{\"7\":1,\"07\":2}}");
  r = HttpRequest(port(), "POST", "/v1/completions", twice);
  EXPECT_EQ(r.status, 400) << r.body;
}

TEST_F(HttpLimitsTest, HealthAnswersWhileLargeBodiesAreParsed) {
  // Two long prompts to tokenize: seconds of work each, during which /health must answer.
  std::string text;
  while (text.size() < (12u << 20)) text += "the quick brown fox jumps over the lazy dog ";
  const std::string body = json({{"prompt", text}}).dump();
  std::vector<std::thread> clients;
  std::vector<int> statuses(2, 0);
  std::vector<double> seconds(2, 0);
  const Stopwatch watch;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] {
      statuses[i] = HttpRequest(port(), "POST", "/tokenize", body, {}, nullptr, 120).status;
      seconds[i] = watch.ElapsedSeconds();
    });
  }
  absl::SleepFor(absl::Milliseconds(500));
  const Stopwatch health_watch;
  HttpResponse health = HttpRequest(port(), "GET", "/health", "", {}, nullptr, 120);
  const double health_seconds = health_watch.ElapsedSeconds();
  const double health_done = watch.ElapsedSeconds();
  for (std::thread& t : clients) t.join();
  std::printf("/health took %.3f s; the large requests took %.1f s and %.1f s\n", health_seconds,
              seconds[0], seconds[1]);
  EXPECT_EQ(health.status, 200);
  EXPECT_LT(health_seconds, 2.0);
  // The test means something only if the large requests were still in flight.
  EXPECT_LT(health_done, std::min(seconds[0], seconds[1]))
      << "the large requests finished before /health was answered";
  EXPECT_EQ(statuses[0], 200);
  EXPECT_EQ(statuses[1], 200);
}

}  // namespace
}  // namespace strata::testing
