#include "server/api/json_body.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/stopwatch.h"
#include "gtest/gtest.h"

namespace strata::api {
namespace {

using ojson = nlohmann::ordered_json;

ojson Parsed(const std::string& text) {
  auto parsed = ParseJsonBody(text);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    ADD_FAILURE() << e->message;
    return ojson();
  }
  return std::get<ojson>(std::move(parsed));
}

std::string ErrorOf(const std::string& text) {
  auto parsed = ParseJsonBody(text);
  auto* e = std::get_if<ApiError>(&parsed);
  if (e == nullptr) return "";
  EXPECT_EQ(e->status, 400);
  return e->message;
}

TEST(JsonBodyTest, SameValueAndKeyOrderAsOrderedJson) {
  const std::string text = R"({"model":"m","messages":[{"role":"user","content":"hi\u00e9"}],
    "tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":[true,null,
    -3,18446744073709551615,2.5e-3,{}],"m":{"y":"x","b":[]}}}}],"n":2})";
  const ojson parsed = Parsed(text);
  EXPECT_EQ(parsed.dump(), ojson::parse(text).dump());
  EXPECT_EQ(parsed["tools"][0]["function"]["parameters"].begin().key(), "z");
}

TEST(JsonBodyTest, RepeatedKeyKeepsFirstPlaceAndLastValue) {
  const std::string text = R"({"a":1,"b":2,"a":{"c":3},"b":4})";
  EXPECT_EQ(Parsed(text).dump(), ojson::parse(text).dump());
  EXPECT_EQ(Parsed(text).dump(), R"({"a":{"c":3},"b":4})");
}

TEST(JsonBodyTest, RefusesWhatIsNotAJsonObject) {
  EXPECT_NE(ErrorOf("{\"a\":").find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("").find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"a\":1} x").find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"a\":\"\xff\"}").find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"a\":\"\\ud800\"}").find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"a\":1e999}").find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("[1,2]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(ErrorOf("\"text\"").find("must be a JSON object"), std::string::npos);
}

TEST(JsonBodyTest, BoundsNesting) {
  auto nested = [](int levels) {
    return absl::StrCat("{\"a\":", std::string(levels - 1, '['), std::string(levels - 1, ']'), "}");
  };
  EXPECT_EQ(ErrorOf(nested(kMaxJsonDepth)), "");
  EXPECT_NE(ErrorOf(nested(kMaxJsonDepth + 1)).find("nests deeper than 64"), std::string::npos);
  // Unclosed: refused for its depth before the parser would reach the end.
  EXPECT_NE(ErrorOf(std::string(1 << 20, '[')).find("nests deeper"), std::string::npos);
}

// ordered_json::parse takes about a minute for 200k keys (each key scans those before it).
TEST(JsonBodyTest, ManyKeysParseInLinearTime) {
  std::string text = "{\"logit_bias\":{";
  for (int i = 0; i < 200000; ++i) absl::StrAppend(&text, i == 0 ? "" : ",", "\"", i, "\":", i);
  text += "}}";
  const Stopwatch watch;
  const ojson parsed = Parsed(text);
  const double seconds = watch.ElapsedSeconds();
  ASSERT_EQ(parsed["logit_bias"].size(), 200000u);
  EXPECT_EQ(parsed["logit_bias"].begin().key(), "0");
  EXPECT_EQ(parsed["logit_bias"].back(), 199999);
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace strata::api
