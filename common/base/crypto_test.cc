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

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// The GCM specification's test cases 13, 14 and 16 (McGrew and Viega, "The Galois/Counter
// Mode of Operation", appendix B): AES-256 with a 96-bit IV; 16 with additional data.
TEST(CryptoTest, Aes256GcmMatchesTheSpecificationsTestCases) {
  const std::string zero_key(32, '\0');
  const std::string zero_iv(12, '\0');
  EXPECT_EQ(HexEncode(Aes256GcmSeal(zero_key, zero_iv, "", "")),
            "530f8afbc74536b9a963b4f1c4cb738b");
  EXPECT_EQ(HexEncode(Aes256GcmSeal(zero_key, zero_iv, "", std::string(16, '\0'))),
            "cea7403d4d606b6e074ec5d3baf39d18"
            "d0d1c8a799996bf0265b98b5d48ab919");
  const std::string key =
      FromHex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308");
  const std::string iv = FromHex("cafebabefacedbaddecaf888");
  const std::string aad = FromHex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
  const std::string plain = FromHex(
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
      "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39");
  const std::string sealed = Aes256GcmSeal(key, iv, aad, plain);
  EXPECT_EQ(HexEncode(sealed),
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
            "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
            "76fc6ece0f4e1768cddf8853bb2d551b");
  EXPECT_EQ(Aes256GcmOpen(key, iv, aad, sealed), plain);
}

TEST(CryptoTest, Aes256GcmOpenRefusesAnythingAltered) {
  const std::string key = SecureRandomBytes(kAes256GcmKeyBytes);
  const std::string nonce = SecureRandomBytes(kAes256GcmNonceBytes);
  const std::string sealed = Aes256GcmSeal(key, nonce, "header", "a step plan");
  ASSERT_EQ(sealed.size(), 11 + kAes256GcmTagBytes);
  EXPECT_EQ(Aes256GcmOpen(key, nonce, "header", sealed), "a step plan");
  for (size_t i = 0; i < sealed.size(); ++i) {  // every byte, ciphertext and tag
    std::string bent = sealed;
    bent[i] ^= 0x01;
    EXPECT_FALSE(Aes256GcmOpen(key, nonce, "header", bent).has_value()) << "byte " << i;
  }
  EXPECT_FALSE(Aes256GcmOpen(key, nonce, "headex", sealed).has_value());
  EXPECT_FALSE(Aes256GcmOpen(key, SecureRandomBytes(12), "header", sealed).has_value());
  EXPECT_FALSE(Aes256GcmOpen(SecureRandomBytes(32), nonce, "header", sealed).has_value());
  EXPECT_FALSE(Aes256GcmOpen(key, nonce, "header", sealed.substr(0, 10)).has_value());
  EXPECT_FALSE(Aes256GcmOpen(key, nonce, "header", sealed.substr(1)).has_value());
  EXPECT_FALSE(Aes256GcmOpen(key.substr(1), nonce, "header", sealed).has_value());
  // Empty messages seal to a tag alone, which is checked as well.
  const std::string empty = Aes256GcmSeal(key, nonce, "", "");
  EXPECT_EQ(empty.size(), kAes256GcmTagBytes);
  EXPECT_EQ(Aes256GcmOpen(key, nonce, "", empty), "");
  EXPECT_FALSE(Aes256GcmOpen(key, nonce, "x", empty).has_value());
}

// One key's contexts, reused message after message: each seal is the one-shot function's,
// byte for byte, and a failed open (a wrong tag, nonce or aad) leaves the next one working.
TEST(CryptoTest, Aes256GcmKeyGivesTheOneShotResultsMessageAfterMessage) {
  const std::string key = SecureRandomBytes(kAes256GcmKeyBytes);
  Aes256GcmKey sealer(key), opener(key);
  for (int i = 0; i < 20; ++i) {
    const std::string nonce = SecureRandomBytes(kAes256GcmNonceBytes);
    const std::string aad = "frame " + std::to_string(i);
    const std::string plain(static_cast<size_t>(i * 37), static_cast<char>('a' + i));
    const std::string sealed = sealer.Seal(nonce, aad, plain);
    ASSERT_EQ(sealed, Aes256GcmSeal(key, nonce, aad, plain)) << "message " << i;
    if (i % 3 == 1) {
      std::string bent = sealed;
      bent.back() ^= 0x01;
      EXPECT_FALSE(opener.Open(nonce, aad, bent).has_value()) << "message " << i;
      EXPECT_FALSE(opener.Open(SecureRandomBytes(12), aad, sealed).has_value());
      EXPECT_FALSE(opener.Open(nonce, aad + "x", sealed).has_value());
    }
    ASSERT_EQ(opener.Open(nonce, aad, sealed), plain) << "message " << i;
  }
  // The specification's test case 16 through a key object too.
  Aes256GcmKey spec(FromHex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"));
  const std::string plain = FromHex(
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
      "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39");
  EXPECT_EQ(HexEncode(spec.Seal(FromHex("cafebabefacedbaddecaf888"),
                                FromHex("feedfacedeadbeeffeedfacedeadbeefabaddad2"), plain)),
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
            "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
            "76fc6ece0f4e1768cddf8853bb2d551b");
}

TEST(CryptoTest, HexEncode) {
  EXPECT_EQ(HexEncode(std::string("\x00\x0f\xf0\xff", 4)), "000ff0ff");
  EXPECT_EQ(HexEncode(""), "");
}

}  // namespace
}  // namespace strata
