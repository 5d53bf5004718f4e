// The chat-template layer over the Jinja interpreter: the default template, message
// validation, and a template using an unsupported filter failing when it is loaded.
#include "server/chat/chat_template.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ChatTemplate, UnsupportedFilterFailsAtLoad) {
  auto t = ChatTemplate::Create("{{ x | nosuchfilter }}", "", "");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("nosuchfilter"), std::string::npos);
}

TEST(ChatTemplate, DefaultTemplateAndMessageValidation) {
  auto t = ChatTemplate::Create("", "<s>", "</s>");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE((*t)->is_default());
  nlohmann::ordered_json messages = {
      {{"role", "user"},
       {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}};
  auto out = (*t)->Render(messages, true, nullptr, nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s><|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE((*t)->Render(nlohmann::ordered_json::array(), true, nullptr, nullptr).ok());
  EXPECT_FALSE((*t)->Render({{{"role", "wizard"}, {"content", "x"}}}, true, nullptr, nullptr).ok());
  EXPECT_FALSE((*t)->Render({{{"role", "user"}}}, true, nullptr, nullptr).ok());
  EXPECT_FALSE((*t)->Render({{{"role", "user"}, {"content", 5}}}, true, nullptr, nullptr).ok());
  EXPECT_FALSE((*t)->Render({{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}, true,
                            nullptr, nullptr)
                   .ok());
}

}  // namespace
}  // namespace strata
