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

TEST(DrainTest, SigtermFinishesStreamsAndRefusesNewWork) {
  auto d = Deployment::Start({});
  ASSERT_TRUE(d.ok()) << d.status();
  const int port = (*d)->http_port();
  const pid_t server = (*d)->Pid("server");
  const std::string model =
      json::parse(HttpRequest(port, "GET", "/v1/models").body)["data"][0]["id"];
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
  bool exited = false;
  for (int i = 0; i < 200 && !exited; ++i) {
    exited = kill(server, 0) != 0;
    if (!exited) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(exited) << "the server did not exit after draining";
  (*d)->Stop();
}

}  // namespace
}  // namespace strata::testing
