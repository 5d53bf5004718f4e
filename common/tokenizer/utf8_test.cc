#include "common/tokenizer/utf8.h"

#include "gtest/gtest.h"

namespace strata::utf8 {
namespace {

TEST(Utf8, SanitizeReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(Sanitize("plain ascii"), "plain ascii");
  EXPECT_EQ(Sanitize("caf\xC3\xA9"), "caf\xC3\xA9");
  // A lone continuation byte, a truncated 3-byte sequence, an overlong, a surrogate.
  EXPECT_EQ(Sanitize("a\x80"
                     "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(Sanitize("\xE4\xB8"
                     "x"),
            "\xEF\xBF\xBD"
            "x");
  EXPECT_EQ(Sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Sanitize("\xF4\x90\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(IsValid(Sanitize(std::string("\xFF\xFE\xF0\x9F\x98", 5))));
}

TEST(Utf8, EmittablePrefixHoldsOnlyCompletableTails) {
  const std::string smile = "\xF0\x9F\x98\x80";
  EXPECT_EQ(EmittablePrefix("ab" + smile), 6u);
  EXPECT_EQ(EmittablePrefix("ab" + smile.substr(0, 3)), 2u);
  EXPECT_EQ(EmittablePrefix("ab" + smile.substr(0, 1)), 2u);
  EXPECT_EQ(EmittablePrefix("ab\xE4\xB8"), 2u);
  // An invalid tail can never complete: emit it (it becomes U+FFFD).
  EXPECT_EQ(EmittablePrefix("ab\x80"), 3u);
  EXPECT_EQ(EmittablePrefix("ab\xE4x"), 4u);
  EXPECT_EQ(EmittablePrefix(""), 0u);
}

TEST(Utf8, ByteMapIsABijectionOnPrintableCodePoints) {
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = ByteToUnicode(static_cast<uint8_t>(b));
    EXPECT_EQ(UnicodeToByte(cp), b);
    EXPECT_GT(cp, 0x20u) << "mapped code points are printable";
  }
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);  // "Ġ"
  EXPECT_EQ(ByteToUnicode('A'), static_cast<char32_t>('A'));
  EXPECT_EQ(UnicodeToByte(0x4E00), -1);
}

TEST(Utf8, DecodeAndEncodeRoundTrip) {
  const std::string text = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  std::string again;
  for (char32_t cp : Decode(text)) Append(cp, again);
  EXPECT_EQ(again, text);
  EXPECT_EQ(Decode(text).size(), 4u);
}

}  // namespace
}  // namespace strata::utf8
