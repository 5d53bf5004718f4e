#include "compute_node/structured_output.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata {

TokenMask MaskCache::Find(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = masks_.find(key);
  if (it == masks_.end()) {
    misses_.fetch_add(1);
    return nullptr;
  }
  hits_.fetch_add(1);
  return it->second;
}

void MaskCache::Put(const std::string& key, TokenMask mask) {
  if (key.size() > kMaxKeyBytes) return;
  const size_t bytes = key.size() + mask->size() * sizeof(uint64_t);
  absl::MutexLock lock(&mu_);
  // Full: start over (the states in use now come back at once).
  if (bytes_ + bytes > kMaxBytes) {
    masks_.clear();
    bytes_ = 0;
  }
  if (masks_.emplace(key, std::move(mask)).second) bytes_ += bytes;
}

absl::StatusOr<CompiledGrammar> GrammarCache::Get(const std::string& gbnf) {
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(gbnf);
    if (it != entries_.end()) {
      order_.splice(order_.begin(), order_, it->second.second);
      return it->second.first;
    }
  }
  auto parsed = grammar::Grammar::Parse(gbnf);
  if (!parsed.ok()) return parsed.status();
  CompiledGrammar compiled{*parsed, std::make_shared<MaskCache>()};
  absl::MutexLock lock(&mu_);
  if (!entries_.count(gbnf)) {
    order_.push_front(gbnf);
    entries_[gbnf] = {compiled, order_.begin()};
    while (entries_.size() > kCapacity) {
      entries_.erase(order_.back());
      order_.pop_back();
    }
  }
  return entries_.at(gbnf).first;
}

std::unique_ptr<GrammarVocabulary> MakeGrammarVocabulary(const Tokenizer& tokenizer,
                                                         std::vector<int32_t> end_tokens) {
  std::vector<std::string> pieces(tokenizer.vocab_size());
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsSpecial(id)) pieces[id] = tokenizer.TokenText(id);
  }
  return std::unique_ptr<GrammarVocabulary>(
      new GrammarVocabulary{grammar::Vocabulary(std::move(pieces)), std::move(end_tokens)});
}

SequenceGrammar::SequenceGrammar(CompiledGrammar g, const GrammarVocabulary* vocab,
                                 int64_t first_output_position)
    : grammar_(std::move(g.grammar)),
      masks_(std::move(g.masks)),
      vocab_(vocab),
      state_(grammar::State::Start(*grammar_)),
      previous_(state_),
      next_(first_output_position) {}

bool SequenceGrammar::IsEnd(int32_t token) const {
  return std::find(vocab_->end_tokens.begin(), vocab_->end_tokens.end(), token) !=
         vocab_->end_tokens.end();
}

absl::Status SequenceGrammar::Feed(int32_t token, int64_t position) {
  if (position + 1 == next_ && token != last_token_) {
    // The last position again, with another token (a step whose result was lost, drawn
    // again): back one state.
    state_ = previous_;
    ended_ = previous_ended_;
    --next_;
  }
  if (position < next_) return absl::OkStatus();
  if (position > next_) {
    return absl::InternalError(absl::StrCat("structured output: token at position ", position,
                                            " before the one at ", next_));
  }
  previous_ = state_;
  previous_ended_ = ended_;
  last_token_ = token;
  ++next_;
  if (ended_) return absl::OkStatus();  // after the end (ignore_eos): nothing more to match
  if (IsEnd(token) && state_.accepting()) {
    ended_ = true;
    return absl::OkStatus();
  }
  if (token < 0 || static_cast<size_t>(token) >= vocab_->vocabulary.size() ||
      vocab_->vocabulary.token(token).empty()) {
    state_ = grammar::State();
  } else {
    state_ = state_.Advance(*grammar_, vocab_->vocabulary.token(token));
  }
  if (state_.dead()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "structured output: token ", token, " at position ", position,
        " does not follow the grammar, or the grammar's expansion there exceeds the matcher's "
        "limits"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenMask> SequenceGrammar::Allowed(int64_t position) const {
  const grammar::State* state = nullptr;
  if (position == next_) state = &state_;
  if (position + 1 == next_) state = &previous_;
  if (state == nullptr) {
    return absl::InternalError(absl::StrCat("structured output: asked for position ", position,
                                            " with the grammar at ", next_));
  }
  if (ended_ && position == next_) {
    // After the end only end tokens follow.
    auto mask = std::make_shared<std::vector<uint64_t>>((vocab_->vocabulary.size() + 63) / 64, 0);
    for (int32_t t : vocab_->end_tokens) {
      if (t >= 0 && static_cast<size_t>(t) < vocab_->vocabulary.size()) {
        (*mask)[t >> 6] |= uint64_t{1} << (t & 63);
      }
    }
    return TokenMask(std::move(mask));
  }
  const std::string key = masks_ ? state->Key() : std::string();
  if (masks_) {
    if (TokenMask hit = masks_->Find(key)) return hit;
  }
  TokenMask mask = std::make_shared<const std::vector<uint64_t>>(
      grammar::AllowedTokens(*grammar_, vocab_->vocabulary, *state, vocab_->end_tokens));
  bool any = false;
  for (uint64_t w : *mask) any = any || w != 0;
  if (!any) {
    return absl::InvalidArgumentError(
        "structured output: no token can follow here (the grammar's expansion exceeds the "
        "matcher's limits, or no token of the vocabulary spells what it wants next)");
  }
  if (masks_) masks_->Put(key, mask);
  return mask;
}

}  // namespace strata
