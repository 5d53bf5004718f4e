#include "compute_node/structured_output.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

// A vocabulary of single characters and a few pieces; token 0 is the end.
GrammarVocabulary Vocab() {
  std::vector<std::string> pieces = {"", "a", "b", "ab", "x", "\""};
  return GrammarVocabulary{grammar::Vocabulary(pieces), {0}};
}

std::vector<int32_t> Allowed(const TokenMask& mask, int n) {
  std::vector<int32_t> out;
  for (int32_t t = 0; t < n; ++t) {
    if (grammar::MaskHas(*mask, t)) out.push_back(t);
  }
  return out;
}

TEST(StructuredOutputTest, MasksFollowTheStateAndARedrawGoesBackOneState) {
  const GrammarVocabulary vocab = Vocab();
  GrammarCache cache;
  auto g = cache.Get("root ::= \"a\" \"b\"? | \"x\"\n");
  ASSERT_TRUE(g.ok()) << g.status();
  SequenceGrammar seq(*g, &vocab, 10);
  EXPECT_EQ(Allowed(*seq.Allowed(10), 6), (std::vector<int32_t>{1, 3, 4}));  // a, ab, x
  ASSERT_TRUE(seq.Feed(1, 10).ok());                                         // "a"
  EXPECT_EQ(Allowed(*seq.Allowed(11), 6), (std::vector<int32_t>{0, 2}));     // end or b
  // Position 10 drawn again with "x": the state goes back and takes "x" instead.
  ASSERT_TRUE(seq.Feed(4, 10).ok());
  EXPECT_EQ(Allowed(*seq.Allowed(11), 6), (std::vector<int32_t>{0}));  // only the end
  // The same token again is a row of a later step: nothing changes.
  ASSERT_TRUE(seq.Feed(4, 10).ok());
  EXPECT_EQ(Allowed(*seq.Allowed(11), 6), (std::vector<int32_t>{0}));
  // A token the grammar forbids, and a gap, are errors.
  EXPECT_FALSE(seq.Feed(2, 11).ok());
  SequenceGrammar other(*g, &vocab, 10);
  EXPECT_FALSE(other.Feed(1, 12).ok());
  // After the end, only the end.
  SequenceGrammar ended(*g, &vocab, 0);
  ASSERT_TRUE(ended.Feed(4, 0).ok());
  ASSERT_TRUE(ended.Feed(0, 1).ok());
  EXPECT_EQ(Allowed(*ended.Allowed(2), 6), (std::vector<int32_t>{0}));
}

TEST(StructuredOutputTest, CachedMasksEqualComputedOnes) {
  const GrammarVocabulary vocab = Vocab();
  GrammarCache cache;
  auto g = cache.Get("root ::= \"\\\"\" [ab]* \"\\\"\"\n");
  ASSERT_TRUE(g.ok());
  auto again = cache.Get("root ::= \"\\\"\" [ab]* \"\\\"\"\n");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(g->grammar, again->grammar);  // compiled once
  SequenceGrammar cached(*g, &vocab, 0);
  SequenceGrammar plain(CompiledGrammar{g->grammar, nullptr}, &vocab, 0);
  const std::vector<int32_t> tokens = {5, 1, 2, 3, 1, 3, 5};
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(**cached.Allowed(i), **plain.Allowed(i)) << "position " << i;
    ASSERT_TRUE(cached.Feed(tokens[i], i).ok());
    ASSERT_TRUE(plain.Feed(tokens[i], i).ok());
  }
  // Inside the string the state repeats: hits.
  EXPECT_GT(g->masks->hits(), 0);
}

}  // namespace
}  // namespace strata
