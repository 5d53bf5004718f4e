// Unit tests of the tokenizer's components on small hand-written tokenizer.json files, one
// construct at a time. The golden test covers real vocabularies end to end.
#include "common/tokenizer/tokenizer.h"

#include <cstdio>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using json = nlohmann::json;
const std::string kMeta = "\xE2\x96\x81";  // U+2581

json Bpe(std::vector<std::string> tokens, std::vector<std::string> merges,
         bool byte_fallback = false) {
  json vocab = json::object();
  int id = 0;
  if (byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      snprintf(name, sizeof(name), "<0x%02X>", b);
      vocab[name] = id++;
    }
  }
  for (const auto& t : tokens) vocab[t] = id++;
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", byte_fallback}};
}

std::unique_ptr<Tokenizer> Make(json model, json extra = json::object()) {
  json t = {{"model", model}, {"added_tokens", json::array()}};
  for (auto& [k, v] : extra.items()) t[k] = v;
  auto tokenizer = Tokenizer::FromJson(t.dump(), "");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::vector<std::string> Tokens(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(t.IdToToken(id));
  return out;
}

TEST(Bpe, LowestRankMergesFirst) {
  auto a = Make(Bpe({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "ab c"}));
  EXPECT_EQ(Tokens(*a, a->Encode("abc")), (std::vector<std::string>{"a", "bc"}));
  auto b = Make(Bpe({"a", "b", "c", "ab", "bc", "abc"}, {"a b", "b c", "ab c"}));
  EXPECT_EQ(Tokens(*b, b->Encode("abc")), (std::vector<std::string>{"abc"}));
}

TEST(Bpe, EqualRanksMergeLeftFirst) {
  auto t = Make(Bpe({"a", "aa"}, {"a a"}));
  EXPECT_EQ(Tokens(*t, t->Encode("aaa")), (std::vector<std::string>{"aa", "a"}));
  EXPECT_EQ(Tokens(*t, t->Encode("aaaa")), (std::vector<std::string>{"aa", "aa"}));
}

TEST(Bpe, ArrayMergesAndIgnoreMerges) {
  json model = Bpe({"h", "i", "hi", "x"}, {});
  model["merges"] = json::array({json::array({"h", "i"})});
  auto t = Make(model);
  EXPECT_EQ(Tokens(*t, t->Encode("hi")), (std::vector<std::string>{"hi"}));
  // ignore_merges: a word that is itself in the vocabulary is taken whole.
  json whole = Bpe({"a", "b", "ab", "abab"}, {"a b"});
  whole["ignore_merges"] = true;
  auto w = Make(whole);
  EXPECT_EQ(Tokens(*w, w->Encode("abab")), (std::vector<std::string>{"abab"}));
}

TEST(Bpe, ByteFallbackAndUnknown) {
  auto t = Make(
      Bpe({"a"}, {}, /*byte_fallback=*/true),
      {{"decoder",
        {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}});
  // "é" is not in the vocabulary: its two UTF-8 bytes become byte tokens.
  EXPECT_EQ(Tokens(*t, t->Encode("a\xC3\xA9")),
            (std::vector<std::string>{"a", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(t->Decode(t->Encode("a\xC3\xA9")), "a\xC3\xA9");
  // Byte tokens that form invalid UTF-8 decode to U+FFFD, never an error.
  const std::vector<int32_t> bad = {*t->TokenToId("<0xC3>"), *t->TokenToId("a")};
  EXPECT_EQ(t->Decode(bad),
            "\xEF\xBF\xBD"
            "a");

  json unk = Bpe({"<unk>", "a"}, {});
  unk["unk_token"] = "<unk>";
  unk["fuse_unk"] = true;
  auto u = Make(unk);
  EXPECT_EQ(Tokens(*u, u->Encode("axyza")), (std::vector<std::string>{"a", "<unk>", "a"}));
}

TEST(Pattern, SplitBehaviors) {
  // "a-b--c" split on "-".
  const std::vector<std::pair<size_t, size_t>> matches = {{1, 2}, {3, 4}, {4, 5}};
  auto pieces = [&](SplitBehavior b, bool invert) {
    std::vector<std::string> out;
    for (auto [s, e] : SplitRanges(6, matches, b, invert))
      out.push_back(std::string("a-b--c").substr(s, e - s));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(SplitBehavior::kRemoved, false), (V{"a", "b", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kIsolated, false), (V{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kMergedWithPrevious, false), (V{"a-", "b-", "-", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kMergedWithNext, false), (V{"a", "-b", "-", "-c"}));
  EXPECT_EQ(pieces(SplitBehavior::kContiguous, false), (V{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kRemoved, true), (V{"-", "-", "-"}));
}

TEST(Regex, UnicodeClassesAndOnigurumaWhitespace) {
  EXPECT_EQ(RewriteWhitespaceClasses(R"(\s+(?!\S)|\\s)"),
            R"(\p{White_Space}+(?!\P{White_Space})|\\s)");
  auto re = Regex::Compile(R"(\p{L}+|\p{N}{1,3}|\s+)");
  ASSERT_TRUE(re.ok());
  // Letters of any script, digits in runs of at most 3, and \s including U+000B and U+0085.
  const std::string text =
      "\xD0\x9C\xD0\xB8\xD1\x80 12345\x0B\xC2\x85"
      "z";
  std::vector<std::string> got;
  for (auto [s, e] : (*re)->FindAll(text)) got.push_back(text.substr(s, e - s));
  EXPECT_EQ(got, (std::vector<std::string>{"\xD0\x9C\xD0\xB8\xD1\x80", " ", "123", "45",
                                           "\x0B\xC2\x85", "z"}));
  EXPECT_FALSE(Regex::Compile("(unclosed").ok());
}

TEST(PreTokenizer, MetaspaceEncodesAndDecodesLikeSentencePiece) {
  json model = Bpe({kMeta, "H", "i", "t", "h", "e", "r", kMeta + "H", kMeta + "Hi", kMeta + "t",
                    kMeta + "th", kMeta + "the", kMeta + "ther", kMeta + "there"},
                   {kMeta + " H", kMeta + "H i", kMeta + " t", kMeta + "t h", kMeta + "th e",
                    kMeta + "the r", kMeta + "ther e"});
  json meta = {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", true}};
  json extra = {
      {"pre_tokenizer", meta},
      {"decoder", {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}}},
      {"added_tokens", json::array({{{"id", 99}, {"content", "<s>"}, {"special", true}}})}};
  auto t = Make(model, extra);
  const std::vector<int32_t> ids = t->Encode("Hi there");
  EXPECT_EQ(Tokens(*t, ids), (std::vector<std::string>{kMeta + "Hi", kMeta + "there"}));
  EXPECT_EQ(t->Decode(ids), "Hi there");
  // "first": no replacement is prepended to text that does not start the input.
  const std::vector<int32_t> after_special = t->Encode("<s>Hi");
  ASSERT_EQ(after_special.size(), 3u);
  EXPECT_EQ(after_special[0], 99);
  EXPECT_EQ(Tokens(*t, after_special)[1], "H");
}

TEST(PreTokenizer, ByteLevelRoundTripsArbitraryBytes) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[utf8::Encode(utf8::ByteToUnicode(b))] = b;
  json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto t = Make(model, {{"pre_tokenizer", bl}, {"decoder", bl}});
  const std::string text = "Hi \xE4\xB8\xAD\xE6\x96\x87 42!\n";
  EXPECT_EQ(t->Encode(text).size(), text.size());  // one token per byte
  EXPECT_EQ(t->Decode(t->Encode(text)), text);
}

TEST(AddedTokens, StripSingleWordAndSpecialParsing) {
  json model = Bpe({"a", "b", " "}, {});
  json added = json::array({
      {{"id", 10}, {"content", "<mask>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}},
      {{"id", 11}, {"content", "ab"}, {"special", false}, {"single_word", true}},
      {{"id", 12}, {"content", "<sp>"}, {"special", true}},
  });
  auto t = Make(model, {{"added_tokens", added}});
  EXPECT_EQ(t->Encode("a  <mask>  b"), (std::vector<int32_t>{0, 10, 1}));
  // single_word: "ab" inside "aab" is not the added token.
  EXPECT_EQ(t->Encode("ab"), (std::vector<int32_t>{11}));
  EXPECT_EQ(t->Encode("aab"), (std::vector<int32_t>{0, 0, 1}));
  // With parse_special off, a special token's text is plain text (here: unknown chars).
  EXPECT_EQ(t->Encode("<sp>", true, true), (std::vector<int32_t>{12}));
  EXPECT_TRUE(t->Encode("<sp>", true, false).empty());
  EXPECT_TRUE(t->IsSpecial(12));
  EXPECT_FALSE(t->IsSpecial(11));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{0, 12, 1}, /*skip_special_tokens=*/true), "ab");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{0, 12, 1}, /*skip_special_tokens=*/false), "a<sp>b");
}

TEST(PostProcessor, TemplateAddsBosOnlyWhenAsked) {
  json model = Bpe({"<s>", "x"}, {});
  json post = {{"type", "TemplateProcessing"},
               {"single",
                {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
               {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}}}}};
  auto t = Make(model, {{"post_processor", post}});
  EXPECT_EQ(t->Encode("xx"), (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(t->Encode("xx", /*add_special_tokens=*/false), (std::vector<int32_t>{1, 1}));
}

TEST(Load, UnknownComponentsAreErrorsNamingTheType) {
  const json model = Bpe({"a"}, {});
  for (const auto& [key, type] :
       std::vector<std::pair<std::string, std::string>>{{"normalizer", "BertNormalizer"},
                                                        {"pre_tokenizer", "UnicodeScripts"},
                                                        {"decoder", "CTC"},
                                                        {"post_processor", "Whisper"}}) {
    json t = {{"model", model}, {key, {{"type", type}}}};
    auto result = Tokenizer::FromJson(t.dump(), "");
    ASSERT_FALSE(result.ok()) << key;
    EXPECT_NE(result.status().message().find(type), std::string::npos) << result.status();
  }
  json unigram = {{"model", {{"type", "Unigram"}, {"vocab", json::array()}}}};
  EXPECT_FALSE(Tokenizer::FromJson(unigram.dump(), "").ok());
  EXPECT_FALSE(Tokenizer::FromJson("{", "").ok());
  json bad_merge = {{"model", Bpe({"a"}, {"a z"})}};
  EXPECT_FALSE(Tokenizer::FromJson(bad_merge.dump(), "").ok());
}

TEST(Config, SpecialTokensTemplateAndCleanUp) {
  json model = Bpe({"<s>", "</s>", "x"}, {});
  json t = {{"model", model},
            {"added_tokens",
             {{{"id", 0}, {"content", "<s>"}, {"special", true}},
              {{"id", 1}, {"content", "</s>"}, {"special", true}}}}};
  json config = {{"bos_token", "<s>"},
                 {"eos_token", {{"content", "</s>"}}},
                 {"chat_template", "{{ messages }}"},
                 {"clean_up_tokenization_spaces", true}};
  auto tok = Tokenizer::FromJson(t.dump(), config.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_token_id(), 0);
  EXPECT_EQ((*tok)->eos_token_id(), 1);
  EXPECT_EQ((*tok)->chat_template(), "{{ messages }}");
  EXPECT_EQ(CleanUpTokenizationSpaces("Hi , I 'm here . Don 't ?"), "Hi, I'm here. Don 't?");
}

TEST(IncrementalDetokenizer, NeverSplitsACharacterAndMatchesFullDecode) {
  auto t = Make(
      Bpe({"a", " "}, {}, /*byte_fallback=*/true),
      {{"decoder",
        {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}});
  // "a" + U+1F600 (4 bytes, one byte token each) + "a".
  std::vector<int32_t> ids = t->Encode(
      "a\xF0\x9F\x98\x80"
      "a");
  ASSERT_EQ(ids.size(), 6u);
  IncrementalDetokenizer stream(t.get(), {}, true);
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.push_back(stream.Push(id));
  deltas.push_back(stream.Flush());
  EXPECT_EQ(deltas, (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x98\x80", "a", ""}));
  // Random byte tokens: every delta valid, the total equals the sanitised full decode.
  uint32_t state = 7;
  std::vector<int32_t> noise;
  for (int i = 0; i < 500; ++i) {
    state = state * 1103515245u + 12345u;
    noise.push_back((state >> 8) % 256);
  }
  IncrementalDetokenizer noisy(t.get(), {}, true);
  std::string all;
  for (int32_t id : noise) {
    const std::string delta = noisy.Push(id);
    ASSERT_TRUE(utf8::IsValid(delta));
    all += delta;
  }
  all += noisy.Flush();
  EXPECT_EQ(all, t->Decode(noise));
  EXPECT_TRUE(utf8::IsValid(all));
}

}  // namespace
}  // namespace strata
