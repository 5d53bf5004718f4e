// The disk tier through real processes: the launcher gives each KV pool (a memory node, or
// in co-located mode the compute node) its own subdirectory of --kv_disk_dir; a
// conversation's history, pushed out of a 1 MiB DRAM cache by other conversations, comes
// back from disk for the next turn. The next turn reports those tokens as cached
// (usage.prompt_tokens_details.cached_tokens), its output equals a deployment without any
// prefix cache, the server counts disk hits by tier, and the node counts the bytes it read
// and wrote. Saved blocks are 0600 in a 0700 directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/deployment.h"
#include "tests/common/http_client.h"

namespace strata::testing {
namespace {

using json = nlohmann::json;

struct Completion {
  int status = 0;
  std::vector<int> tokens;  // from the token_id:N logprob entries
  int64_t cached = -1;
};

Completion Complete(int http_port, const std::vector<int>& prompt) {
  const json body = {{"model", "tiny"},
                     {"prompt", prompt},
                     {"max_tokens", 8},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"logprobs", 0},
                     {"return_tokens_as_token_ids", true}};
  const HttpResponse r = HttpRequest(http_port, "POST", "/v1/completions", body.dump());
  Completion out;
  out.status = r.status;
  const json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.is_discarded()) {
    ADD_FAILURE() << r.status << " " << r.body;
    return out;
  }
  for (const auto& t : j["choices"][0]["logprobs"]["tokens"]) {
    out.tokens.push_back(std::stoi(t.get<std::string>().substr(std::string("token_id:").size())));
  }
  out.cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  return out;
}

// Empty when `dir` takes O_DIRECT (the tier refuses buffered I/O unless told).
std::string DirectIoUnavailable(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
  if (fd < 0) return absl::StrCat("no O_DIRECT on ", dir);
  close(fd);
  unlink(probe.c_str());
  return "";
}

class DiskTierTest : public ::testing::TestWithParam<int> {};  // memory nodes

TEST_P(DiskTierTest, TheNextTurnReadsItsHistoryFromDisk) {
  const int memory_nodes = GetParam();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/kv_disk_", memory_nodes);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  if (const std::string why = DirectIoUnavailable(dir); !why.empty()) GTEST_SKIP() << why;

  const std::vector<int> turn1 = RandomPromptTokens(300, 1);
  std::vector<int> turn2 = turn1;
  Completion answer1, answer2;
  {
    DeploymentOptions options;
    options.memory_nodes = memory_nodes;
    options.kv_budget_mib = 1;  // 1024 tokens of the tiny model: a few conversations
    options.memory_kv_budget_mib = 1;
    options.server_args = {"--served_model_name=tiny"};
    options.launcher_args = {"--kv_disk_dir=" + dir, "--kv_disk_budget_gib=0.0625",
                             "--max_model_len=512"};
    auto d = Deployment::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    const int http = (*d)->http_port();
    answer1 = Complete(http, turn1);
    ASSERT_EQ(answer1.tokens.size(), 8u);
    // Other conversations take the DRAM cache.
    for (uint32_t i = 0; i < 4; ++i)
      ASSERT_EQ(Complete(http, RandomPromptTokens(300, 10 + i)).status, 200);
    turn2.insert(turn2.end(), answer1.tokens.begin(), answer1.tokens.end());
    const std::vector<int> question = RandomPromptTokens(20, 2);
    turn2.insert(turn2.end(), question.begin(), question.end());
    const int server = (*d)->MetricsPort("server");
    const double computed_before = MetricSum(server, "strata_prefill_tokens_computed_total", "");
    answer2 = Complete(http, turn2);
    // The history's 18 full blocks (288 tokens), from disk: none was left in DRAM, and only
    // the rest of the prompt was computed.
    EXPECT_GE(answer2.cached, 288);
    EXPECT_LE(MetricSum(server, "strata_prefill_tokens_computed_total", "") - computed_before,
              static_cast<double>(turn2.size()) - 288);
    EXPECT_GE(MetricSum(server, "strata_prefix_cache_tier_hits_total", "tier=\"disk\""), 288);
    const std::string pool = memory_nodes > 0 ? "memory-0" : "compute-0";
    const int node = (*d)->MetricsPort(pool);
    EXPECT_GT(MetricSum(node, "strata_kv_disk_read_bytes_total", ""), 0);
    EXPECT_GT(MetricSum(node, "strata_kv_disk_written_bytes_total", ""), 0);
    EXPECT_EQ(MetricSum(node, "strata_kv_disk_checksum_failures_total", ""), 0);
    // Persisted KV is user data: only the node's user can read it.
    struct stat st;
    ASSERT_EQ(stat((dir + "/" + pool).c_str(), &st), 0) << dir << "/" << pool;
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    ASSERT_EQ(stat((dir + "/" + pool + "/blocks").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ((*d)->Stop(), 0);
  }
  // The same turn computed from nothing.
  DeploymentOptions fresh;
  fresh.memory_nodes = memory_nodes;
  fresh.server_args = {"--served_model_name=tiny", "--enable_prefix_caching=false"};
  fresh.launcher_args = {"--max_model_len=512"};
  auto d = Deployment::Start(fresh);
  ASSERT_TRUE(d.ok()) << d.status();
  const Completion reference = Complete((*d)->http_port(), turn2);
  EXPECT_EQ(reference.cached, 0);
  EXPECT_EQ(answer2.tokens, reference.tokens);
}

INSTANTIATE_TEST_SUITE_P(Pools, DiskTierTest, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("CoLocated")
                                                  : std::string("MemoryNode");
                         });

}  // namespace
}  // namespace strata::testing
