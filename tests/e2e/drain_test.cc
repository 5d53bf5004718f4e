// SIGTERM to the server drains it, as Kubernetes expects: /ready turns 503 at once, new
// generation requests are refused with 503, the stream in flight runs to its end with
// [DONE], and then the server exits.
#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

// The embedded default, its HTTP port, the server's pid and the served model's name.
class DrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = Deployment::Start({});
    ASSERT_TRUE(d.ok()) << d.status();
    d_ = std::move(*d);
    port_ = d_->http_port();
    server_ = d_->Pid("server");
    model_ = json::parse(HttpRequest(port_, "GET", "/v1/models").body)["data"][0]["id"];
  }
  void TearDown() override {
    if (d_) d_->Stop();
  }
  // Whether the server exits within 10 s (the drain's own deadline is 30 s).
  bool ServerExits() {
    for (int i = 0; i < 200; ++i) {
      if (kill(server_, 0) != 0) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  std::unique_ptr<Deployment> d_;
  int port_ = 0;
  pid_t server_ = -1;
  std::string model_;
};

TEST_F(DrainTest, SigtermFinishesStreamsAndRefusesNewWork) {
  const int port = port_;
  const pid_t server = server_;
  const std::string& model = model_;
  ASSERT_EQ(HttpRequest(port, "GET", "/ready").status, 200);

  std::atomic<bool> first_chunk{false};
  HttpResponse stream;
  std::thread client([&] {
    stream = HttpRequest(port, "POST", "/v1/completions",
                         json({{"model", model},
                               {"prompt", "A long story"},
                               {"max_tokens", 1500},
                               {"ignore_eos", true},
                               {"stream", true}})
                             .dump(),
                         {}, [&](const std::string&) {
                           first_chunk = true;
                           return true;
                         });
  });
  while (!first_chunk) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(kill(server, SIGTERM), 0);

  // Draining: not ready, and new work is refused, while the stream goes on.
  int ready = 0;
  for (int i = 0; i < 100 && ready != 503; ++i) {
    ready = HttpRequest(port, "GET", "/ready").status;
    if (ready != 503) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(ready, 503);
  HttpResponse refused =
      HttpRequest(port, "POST", "/v1/completions",
                  json({{"model", model}, {"prompt", "late"}, {"max_tokens", 2}}).dump());
  EXPECT_EQ(refused.status, 503) << refused.body;

  client.join();
  EXPECT_EQ(stream.status, 200);
  const std::vector<std::string> events = SseEvents(stream.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  int tokens = 0;
  std::string finish;
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    json chunk = json::parse(e);
    for (const auto& c : chunk["choices"]) {
      if (!c["text"].get<std::string>().empty()) ++tokens;
      if (c["finish_reason"].is_string()) finish = c["finish_reason"];
    }
  }
  EXPECT_EQ(finish, "length") << "the stream was cut instead of finishing";
  EXPECT_GT(tokens, 100);

  // Then the server exits on its own.
  EXPECT_TRUE(ServerExits()) << "the server did not exit after draining";
}

// A stream whose client went away stops counting once: after it, SIGTERM finds nothing to
// drain and the server exits at once, not after the drain's 30 s deadline (a completions
// stream used to be uncounted twice, by its close and by its end, and the drain then
// waited for a count of -1 to come back to 0).
TEST_F(DrainTest, AStreamItsClientLeftDoesNotHoldTheDrain) {
  const int port = port_;
  const std::string& model = model_;
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json body = {{"model", model}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}};
    if (std::string(path) == "/v1/completions") {
      body["prompt"] = "A long story";
    } else {
      body["messages"] = json::array({{{"role", "user"}, {"content", "A long story"}}});
    }
    int chunks = 0;
    // The client leaves after a few chunks.
    HttpRequest(port, "POST", path, body.dump(), {},
                [&](const std::string&) { return ++chunks < 3; });
    EXPECT_GE(chunks, 3) << path;
  }
  // Its requests are cancelled.
  bool idle = false;
  for (int i = 0; i < 200 && !idle; ++i) {
    const std::string metrics = HttpRequest(port, "GET", "/metrics").body;
    idle = metrics.find("strata_num_requests_running{model_name=\"" + model + "\"} 0") !=
           std::string::npos;
    if (!idle) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(idle) << "the abandoned streams' requests were never cancelled";
  ASSERT_EQ(kill(server_, SIGTERM), 0);
  EXPECT_TRUE(ServerExits()) << "the drain waited for streams that had ended";
}

}  // namespace
}  // namespace strata::testing
