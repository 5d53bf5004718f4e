#include "server/api/tool_calls.h"

#include <random>

#include "common/grammar/grammar.h"
#include "gtest/gtest.h"

namespace strata::api {
namespace {

using json = nlohmann::ordered_json;

// Whole parse and streamed parse, fed in pieces of every size, agree.
ParsedOutput Streamed(ToolCallFormat format, const std::string& text, std::mt19937* rng) {
  ParsedOutput out;
  ToolCallStream stream(format);
  std::vector<ToolCallDelta> deltas;
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = 1 + (*rng)() % 7;
    out.content += stream.Push(text.substr(i, n), &deltas);
    i += n;
  }
  out.content += stream.Finish(&deltas);
  // As a client accumulates them: a call's first piece names it, the rest add arguments.
  for (const ToolCallDelta& d : deltas) {
    if (d.index == static_cast<int>(out.calls.size())) {
      EXPECT_FALSE(d.name.empty()) << "the first piece of a call names it";
      out.calls.push_back({d.name, ""});
    }
    EXPECT_LT(d.index, static_cast<int>(out.calls.size()));
    if (d.index < static_cast<int>(out.calls.size())) out.calls[d.index].arguments += d.arguments;
  }
  return out;
}

struct Case {
  ToolCallFormat format;
  std::string text;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

TEST(ToolCallsTest, ParsesEveryFormatWholeAndStreamed) {
  const std::vector<Case> cases = {
      {ToolCallFormat::kHermes,
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
       "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>"
       "{\"name\":\"now\",\"arguments\":{}}</tool_call>",
       "Let me check.\n",
       {{"get_weather", R"({"city":"Paris"})"}, {"now", "{}"}}},
      {ToolCallFormat::kHermes,
       "no calls, just <tool text> and a < sign",
       "no calls, just <tool text> and a < sign",
       {}},
      {ToolCallFormat::kHermes,
       "<tool_call>{not json}</tool_call>",
       "<tool_call>{not json}</tool_call>",
       {}},
      {ToolCallFormat::kHermes,
       "<tool_call>{\"name\": \"cut\", \"arguments\": {\"a\": 1}}",
       "",
       {{"cut", R"({"a":1})"}}},  // cut before the closing tag, but whole
      {ToolCallFormat::kLlama3,
       "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}",
       "",
       {{"search", R"({"q":"x"})"}}},
      {ToolCallFormat::kLlama3,
       " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": [1]}}",
       "",
       {{"a", "{}"}, {"b", R"({"k":[1]})"}}},
      {ToolCallFormat::kLlama3, "The answer is {braces} 42.", "The answer is {braces} 42.", {}},
      {ToolCallFormat::kLlama3, "{\"not\": \"a call\"}", "{\"not\": \"a call\"}", {}},
      {ToolCallFormat::kMistral,
       "Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\": true}}, "
       "{\"name\": \"g\", \"arguments\": \"{\\\"y\\\":2}\"}]",
       "Sure.",
       {{"f", R"({"x":true})"}, {"g", R"({"y":2})"}}},
      {ToolCallFormat::kMistral, "[TOOL_CALLS] broken", "[TOOL_CALLS] broken", {}},
      // Keys after the arguments (Mistral's call ids) do not lose the calls after them.
      {ToolCallFormat::kMistral,
       "[TOOL_CALLS][{\"name\":\"f\",\"arguments\":{\"a\":1},\"id\":\"abc123xyz\"},"
       "{\"name\":\"g\",\"arguments\":{}}]",
       "",
       {{"f", R"({"a":1})"}, {"g", "{}"}}},
  };
  std::mt19937 rng(3);
  for (const Case& c : cases) {
    for (int trial = 0; trial < 20; ++trial) {
      const ParsedOutput out =
          trial == 0 ? ParseToolCalls(c.format, c.text) : Streamed(c.format, c.text, &rng);
      EXPECT_EQ(out.content, c.content) << c.text;
      ASSERT_EQ(out.calls.size(), c.calls.size()) << c.text;
      for (size_t k = 0; k < c.calls.size(); ++k) {
        EXPECT_EQ(out.calls[k].name, c.calls[k].first) << c.text;
        EXPECT_EQ(json::parse(out.calls[k].arguments), json::parse(c.calls[k].second)) << c.text;
      }
    }
  }
}

TEST(ToolCallsTest, HermesArgumentsStreamAsTheyAreWritten) {
  ToolCallStream stream(ToolCallFormat::kHermes);
  std::vector<ToolCallDelta> deltas;
  std::string content;
  for (const char* piece : {"Sure. <tool", "_call>\n{\"name\": \"get_weather\", \"argu",
                            "ments\": {\"city\": \"Pa", "ris, \\\"}\" ", "}", "}\n</tool_call>"}) {
    content += stream.Push(piece, &deltas);
  }
  content += stream.Finish(&deltas);
  EXPECT_EQ(content, "Sure. ");
  ASSERT_GE(deltas.size(), 3u) << "the arguments came in one piece";
  EXPECT_EQ(deltas[0].name, "get_weather");
  std::string arguments;
  for (const ToolCallDelta& d : deltas) {
    EXPECT_EQ(d.index, 0);
    arguments += d.arguments;
  }
  EXPECT_EQ(arguments, R"({"city": "Paris, \"}" })");
}

TEST(ToolCallsTest, Llama3AndMistralArgumentsStreamToo) {
  const std::vector<std::pair<ToolCallFormat, std::vector<const char*>>> cases = {
      {ToolCallFormat::kLlama3,
       {"<|python", "_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x", "yz\", \"n\": [1, ",
        "2]}}; {\"name\": \"b\", \"parameters\": {", "}}"}},
      {ToolCallFormat::kMistral,
       {"[TOOL_", "CALLS][{\"name\": \"a\", \"arguments\": {\"q\": \"x", "yz\", \"n\": [1, ",
        "2]}}, {\"name\": \"b\", \"arguments\": {", "}}]"}},
  };
  for (const auto& [format, pieces] : cases) {
    ToolCallStream stream(format);
    std::vector<ToolCallDelta> deltas;
    std::string content;
    int pieces_with_deltas = 0;
    for (const char* piece : pieces) {
      const size_t before = deltas.size();
      content += stream.Push(piece, &deltas);
      pieces_with_deltas += deltas.size() > before;
    }
    content += stream.Finish(&deltas);
    EXPECT_EQ(content, "");
    EXPECT_GE(pieces_with_deltas, 3) << "the calls did not stream";
    std::vector<std::string> names(2), args(2);
    for (const ToolCallDelta& d : deltas) {
      ASSERT_LT(d.index, 2);
      names[d.index] += d.name;
      args[d.index] += d.arguments;
    }
    EXPECT_EQ(names, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(args[0], R"({"q": "xyz", "n": [1, 2]})");
    EXPECT_EQ(args[1], "{}");
  }
}

TEST(ToolCallsTest, FormatFollowsTheTemplate) {
  EXPECT_EQ(ToolCallFormatOfTemplate("... <tool_call> ..."), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOfTemplate("... [TOOL_CALLS] ..."), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOfTemplate("{{ '<|python_tag|>' }} ipython"), ToolCallFormat::kLlama3);
  ToolCallFormat f;
  EXPECT_TRUE(ParseToolCallFormat("mistral", &f));
  EXPECT_EQ(f, ToolCallFormat::kMistral);
  EXPECT_FALSE(ParseToolCallFormat("xml", &f));
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
     "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
     "required": ["city"]}}},
  {"type": "function", "function": {"name": "now"}}
])");

bool Accepts(const std::string& gbnf, const std::string& text) {
  auto g = grammar::Grammar::Parse(gbnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << gbnf;
  return g.ok() && grammar::State::Start(**g).Advance(**g, text).accepting();
}

TEST(ToolCallsTest, RequiredCallsFollowTheFunctionsSchemas) {
  auto any = ToolCallGrammar(ToolCallFormat::kHermes, kTools, std::nullopt, true);
  ASSERT_TRUE(any.ok()) << any.status();
  const std::string weather = R"({"name": "get_weather", "arguments": {"city":"Oslo","unit":"c"}})";
  const std::string now = R"({"name": "now", "arguments": {}})";
  EXPECT_TRUE(Accepts(*any, "<tool_call>\n" + weather + "\n</tool_call>"));
  EXPECT_TRUE(Accepts(
      *any, "<tool_call>\n" + weather + "\n</tool_call>\n<tool_call>\n" + now + "\n</tool_call>"));
  EXPECT_FALSE(Accepts(
      *any, "<tool_call>\n" + std::string(R"({"name": "get_weather", "arguments": {"unit":"c"}})") +
                "\n</tool_call>"));
  EXPECT_FALSE(Accepts(
      *any,
      "<tool_call>\n" + std::string(R"({"name": "other", "arguments": {}})") + "\n</tool_call>"));
  EXPECT_FALSE(Accepts(*any, "hello"));
  // One call only, and only the named function.
  auto one = ToolCallGrammar(ToolCallFormat::kHermes, kTools, std::string("now"), false);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(Accepts(*one, "<tool_call>\n" + now + "\n</tool_call>"));
  EXPECT_FALSE(Accepts(*one, "<tool_call>\n" + weather + "\n</tool_call>"));
  EXPECT_FALSE(Accepts(
      *one, "<tool_call>\n" + now + "\n</tool_call>\n<tool_call>\n" + now + "\n</tool_call>"));
  // The other formats, and what the parser makes of a grammar's output.
  auto llama = ToolCallGrammar(ToolCallFormat::kLlama3, kTools, std::nullopt, true);
  ASSERT_TRUE(llama.ok());
  const std::string llama_text =
      R"({"name": "now", "parameters": {}}; {"name": "get_weather", "parameters": {"city":"Rome"}})";
  EXPECT_TRUE(Accepts(*llama, llama_text));
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kLlama3, llama_text).calls.size(), 2u);
  auto mistral = ToolCallGrammar(ToolCallFormat::kMistral, kTools, std::nullopt, true);
  ASSERT_TRUE(mistral.ok());
  const std::string mistral_text = "[TOOL_CALLS][" + now + ", " + weather + "]";
  EXPECT_TRUE(Accepts(*mistral, mistral_text));
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kMistral, mistral_text).calls.size(), 2u);
  // Errors.
  EXPECT_FALSE(ToolCallGrammar(ToolCallFormat::kHermes, kTools, std::string("missing"), true).ok());
  EXPECT_FALSE(CheckTools(json::parse(R"([{"type": "function"}])")).ok());
  EXPECT_FALSE(
      CheckTools(
          json::parse(R"([{"type": "function", "function": {"name": "x", "parameters": 3}}])"))
          .ok());
  auto bad = ToolCallGrammar(
      ToolCallFormat::kHermes,
      json::parse(
          R"([{"type": "function", "function": {"name": "x", "parameters": {"type": "object", "patternProperties": {}}}}])"),
      std::nullopt, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("patternProperties"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace strata::api
