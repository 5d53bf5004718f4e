// Fuzz-style tests of the HTTP API against a real server: malformed HTTP, malformed and
// hostile JSON, huge numbers, wrong types, invalid UTF-8, truncated bodies, and seeded
// random mutations of valid requests. Every one must get a 4xx (or, for a mutation that
// stays valid, a 200): never a 5xx, never silence, never a crash. After each batch the
// server must still answer /health and serve a real completion.
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

int StatusOf(const std::string& raw) {
  // "HTTP/1.1 400 Bad Request\r\n..."
  if (raw.rfind("HTTP/1.", 0) != 0 || raw.size() < 12) return -1;
  return std::atoi(raw.substr(9, 3).c_str());
}

class HttpFuzzTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    DeploymentOptions options;
    options.server_args = {"--max_body_bytes=1048576"};
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    deployment_ = d->release();
    model_ = json::parse(HttpRequest(port(), "GET", "/v1/models").body)["data"][0]["id"];
  }
  static void TearDownTestSuite() {
    if (deployment_ != nullptr) EXPECT_EQ(deployment_->Stop(), 0);
    delete deployment_;
  }
  static int port() { return deployment_->http_port(); }

  static void ExpectStillServing() {
    EXPECT_EQ(HttpRequest(port(), "GET", "/health").status, 200);
    HttpResponse r =
        HttpRequest(port(), "POST", "/v1/completions",
                    json({{"model", model_}, {"prompt", "Hello"}, {"max_tokens", 2}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
  }

  static std::string Post(const std::string& path, const std::string& body,
                          const std::string& extra_headers = "") {
    return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
                        extra_headers, "Content-Length: ", body.size(), "\r\n\r\n", body);
  }

  static Deployment* deployment_;
  static std::string model_;
};

Deployment* HttpFuzzTest::deployment_ = nullptr;
std::string HttpFuzzTest::model_;

TEST_F(HttpFuzzTest, MalformedHttpGets4xx) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"garbage request line", "GARBAGE\r\n\r\n"},
      {"no version", "GET /health\r\n\r\n"},
      {"bad version", "GET /health HTTP/9.9\r\n\r\n"},
      {"binary junk", std::string("\x00\x01\x02\xff\xfe\r\n\r\n", 9)},
      {"header without colon", "GET /health HTTP/1.1\r\nHost x\r\n\r\n"},
      {"huge header",
       absl::StrCat("GET /health HTTP/1.1\r\nX-Big: ", std::string(64 << 10, 'a'), "\r\n\r\n")},
      {"negative content-length", "POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n{}"},
      {"non-numeric content-length",
       "POST /v1/completions HTTP/1.1\r\nContent-Length: lots\r\n\r\n{}"},
      {"body over the limit (declared)",
       "POST /v1/completions HTTP/1.1\r\nContent-Length: 1000000000000\r\n\r\n{"},
      {"bad chunk size",
       "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"},
      {"unknown method", "BREW /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"},
      {"wrong method", "DELETE /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"},
  };
  for (const auto& [name, bytes] : cases) {
    const int status = StatusOf(RawExchange(port(), bytes, 5));
    EXPECT_GE(status, 400) << name;
    EXPECT_LT(status, 500) << name;
  }
  // A body shorter than its Content-Length: the server waits, then gives up on the
  // connection; it must not hang a thread or stop serving others meanwhile.
  RawExchange(port(), "POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"mod", 1);
  ExpectStillServing();
}

TEST_F(HttpFuzzTest, HostileJsonGets400) {
  const std::string m = absl::StrCat("\"model\":\"", model_, "\"");
  std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "{not json"},
      {"truncated", absl::StrCat("{", m, ",\"prompt\":\"abc")},
      {"array", "[1,2,3]"},
      {"string", "\"hello\""},
      {"empty", ""},
      {"nan", absl::StrCat("{", m, ",\"prompt\":\"a\",\"temperature\":NaN}")},
      {"huge max_tokens", absl::StrCat("{", m, ",\"prompt\":\"a\",\"max_tokens\":1e308}")},
      {"huge integer",
       absl::StrCat("{", m, ",\"prompt\":\"a\",\"max_tokens\":99999999999999999999999999}")},
      {"negative max_tokens", absl::StrCat("{", m, ",\"prompt\":\"a\",\"max_tokens\":-1}")},
      {"fractional n", absl::StrCat("{", m, ",\"prompt\":\"a\",\"n\":1.5}")},
      {"string temperature", absl::StrCat("{", m, ",\"prompt\":\"a\",\"temperature\":\"hot\"}")},
      {"object prompt", absl::StrCat("{", m, ",\"prompt\":{}}")},
      {"empty prompt list", absl::StrCat("{", m, ",\"prompt\":[]}")},
      {"nested token lists", absl::StrCat("{", m, ",\"prompt\":[[[1]]]}")},
      {"negative token", absl::StrCat("{", m, ",\"prompt\":[-1]}")},
      {"token past vocab", absl::StrCat("{", m, ",\"prompt\":[4294967296]}")},
      {"numeric stop", absl::StrCat("{", m, ",\"prompt\":\"a\",\"stop\":5}")},
      {"bad logit_bias key", absl::StrCat("{", m, ",\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}")},
      {"huge seed", absl::StrCat("{", m, ",\"prompt\":\"a\",\"seed\":1180591620717411303424}")},
      {"boolean model", "{\"model\":true,\"prompt\":\"a\"}"},
      {"invalid utf-8", absl::StrCat("{", m, ",\"prompt\":\"\xff\xfe\xfd\"}")},
      {"lone surrogate escape", absl::StrCat("{", m, ",\"prompt\":\"\\ud800\"}")},
      {"messages not a list", absl::StrCat("{", m, ",\"messages\":\"hi\"}")},
      {"message without role", absl::StrCat("{", m, ",\"messages\":[{\"content\":\"hi\"}]}")},
      {"content of wrong type",
       absl::StrCat("{", m, ",\"messages\":[{\"role\":\"user\",\"content\":7}]}")},
  };
  // Deep nesting must not exhaust the stack (parse or destruction).
  cases.push_back({"deep nesting", std::string(200000, '[') + std::string(200000, ']')});
  cases.push_back(
      {"deep nesting in a field", absl::StrCat("{", m, ",\"prompt\":", std::string(100000, '['),
                                               std::string(100000, ']'), "}")});
  for (const auto& [name, body] : cases) {
    const std::string path = name.rfind("message", 0) == 0 || name == "content of wrong type"
                                 ? "/v1/chat/completions"
                                 : "/v1/completions";
    const std::string raw = RawExchange(port(), Post(path, body), 10);
    const int status = StatusOf(raw);
    EXPECT_EQ(status, 400) << name << ": " << raw.substr(0, 300);
    if (status == 400) {
      const size_t at = raw.find("\r\n\r\n");
      json error = json::parse(raw.substr(at + 4), nullptr, false);
      EXPECT_TRUE(error.contains("error") && error["error"].contains("message")) << name;
    }
  }
  ExpectStillServing();
}

TEST_F(HttpFuzzTest, RandomMutationsNeverGet5xx) {
  const std::string valid = json({{"model", model_},
                                  {"prompt", "The sea is"},
                                  {"max_tokens", 3},
                                  {"temperature", 0.5},
                                  {"stop", {"\n"}},
                                  {"logprobs", 1}})
                                .dump();
  std::mt19937 rng(20261122);
  int ok = 0, client_errors = 0;
  for (int i = 0; i < 300; ++i) {
    std::string body = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % body.size();
      switch (rng() % 4) {
        case 0:
          body[at] = static_cast<char>(rng() % 256);  // flip a byte
          break;
        case 1:
          body.erase(at, 1 + rng() % 8);
          break;
        case 2:
          body.insert(at, std::string(1 + rng() % 4, "{}[]\",:0e-9"[rng() % 11]));
          break;
        case 3:
          body.resize(at);  // truncate
          break;
      }
      if (body.empty()) body = "{";
    }
    // Mutations that stay valid generate: keep the connection open for the answer.
    const std::string raw = RawExchange(
        port(), Post("/v1/completions", body, "Connection: close\r\n"), 30, /*half_close=*/false);
    const int status = StatusOf(raw);
    ASSERT_TRUE(status == 200 || (status >= 400 && status < 500))
        << "mutation " << i << " got " << status << " for body " << body << "\n"
        << raw.substr(0, 300);
    (status == 200 ? ok : client_errors)++;
  }
  EXPECT_GT(client_errors, 100);  // most mutations break the request
  ExpectStillServing();
}

}  // namespace
}  // namespace strata::testing
