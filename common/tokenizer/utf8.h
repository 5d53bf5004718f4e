// UTF-8 helpers for the tokenizer and for text sent to clients.
//
// Model output is arbitrary bytes (byte-fallback and byte-level tokens can form invalid
// UTF-8), but JSON and gRPC strings must be valid UTF-8. SanitizeUtf8 replaces each maximal
// invalid subsequence with U+FFFD, the same policy as Rust's from_utf8_lossy and the WHATWG
// decoder, so invalid output never becomes an error.
#ifndef STRATA_COMMON_TOKENIZER_UTF8_H_
#define STRATA_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// Appends the UTF-8 encoding of `cp` (must be a scalar value) to `out`.
void Append(char32_t cp, std::string& out);
std::string Encode(char32_t cp);

// Length of the valid UTF-8 sequence starting at s[i], or 0 if none starts there (an
// invalid byte, or a sequence cut short by the end of `s`).
size_t SequenceLength(std::string_view s, size_t i);

// Decodes valid UTF-8; invalid subsequences decode to U+FFFD.
std::vector<char32_t> Decode(std::string_view s);

bool IsValid(std::string_view s);

// Replaces every maximal invalid subsequence with U+FFFD.
std::string Sanitize(std::string_view s);

// For streaming: the number of leading bytes of `s` that can be emitted now. Trailing bytes
// that are a proper prefix of a valid sequence are held back (they may be completed by the
// next token); everything else is emitted, invalid bytes included (they will be replaced).
size_t EmittablePrefix(std::string_view s);

// GPT-2's reversible map between bytes and printable code points, used by byte-level BPE.
char32_t ByteToUnicode(uint8_t byte);
// Returns -1 if `cp` is not in the image of ByteToUnicode.
int UnicodeToByte(char32_t cp);

}  // namespace strata::utf8

#endif  // STRATA_COMMON_TOKENIZER_UTF8_H_
