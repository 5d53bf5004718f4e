#include "common/base/crypto.h"

#include <gtest/gtest.h>

#include <set>

namespace strata {
namespace {

// RFC 4231, section 4: HMAC-SHA256 test cases 1, 2, 4 and 6 (a key longer than a block).
TEST(CryptoTest, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(HexEncode(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(HexEncode(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  EXPECT_EQ(HexEncode(HmacSha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(HexEncode(HmacSha256(std::string(131, '\xaa'),
                                 "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(CryptoTest, HmacDependsOnEveryByteOfKeyAndMessage) {
  const std::string base = HmacSha256("key", "message");
  EXPECT_EQ(base.size(), kHmacSha256Bytes);
  EXPECT_NE(HmacSha256("kez", "message"), base);
  EXPECT_NE(HmacSha256("key", "messagf"), base);
  EXPECT_NE(HmacSha256("", "message"), base);
  EXPECT_EQ(HmacSha256("key", "message"), base);
}

TEST(CryptoTest, RandomBytesDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string r = SecureRandomBytes(16);
    ASSERT_EQ(r.size(), 16u);
    seen.insert(r);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(CryptoTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
}

TEST(CryptoTest, HexEncode) {
  EXPECT_EQ(HexEncode(std::string("\x00\x0f\xf0\xff", 4)), "000ff0ff");
  EXPECT_EQ(HexEncode(""), "");
}

}  // namespace
}  // namespace strata
