#include "common/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace strata {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxCachedWords = 100000;
constexpr size_t kMaxCachedWordBytes = 256;

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& m) {
  if (!m.is_object() || m.value("type", std::string("BPE")) != "BPE") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported model type \"", m.is_object() ? m.value("type", std::string("?")) : "?",
        "\" (strata supports BPE)"));
  }
  if (!m.contains("vocab") || !m["vocab"].is_object()) {
    return absl::InvalidArgumentError("BPE model: \"vocab\" must be an object");
  }
  auto bpe = std::make_unique<BpeModel>();
  int32_t max_id = -1;
  for (auto& [token, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24)) {
      return absl::InvalidArgumentError("BPE model: bad id for token \"" + token + "\"");
    }
    bpe->vocab_.emplace(token, id.get<int32_t>());
    max_id = std::max(max_id, id.get<int32_t>());
  }
  bpe->id_to_token_.resize(max_id + 1);
  for (const auto& [token, id] : bpe->vocab_) bpe->id_to_token_[id] = token;

  auto optional_string = [&](const char* key) {
    return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
  };
  bpe->prefix_ = optional_string("continuing_subword_prefix");
  bpe->suffix_ = optional_string("end_of_word_suffix");
  bpe->byte_fallback_ = m.value("byte_fallback", false);
  bpe->fuse_unk_ = m.value("fuse_unk", false);
  bpe->ignore_merges_ = m.value("ignore_merges", false);
  const std::string unk = optional_string("unk_token");
  if (!unk.empty()) {
    auto it = bpe->vocab_.find(unk);
    if (it == bpe->vocab_.end()) {
      return absl::InvalidArgumentError("BPE model: unk_token \"" + unk + "\" is not in the vocab");
    }
    bpe->unk_id_ = it->second;
  }
  bpe->have_byte_tokens_ = true;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = bpe->vocab_.find(name);
    if (it == bpe->vocab_.end()) {
      bpe->have_byte_tokens_ = false;
      break;
    }
    bpe->byte_ids_[b] = it->second;
  }

  const json merges = m.value("merges", json::array());
  if (!merges.is_array()) return absl::InvalidArgumentError("BPE model: \"merges\" must be a list");
  int32_t rank = 0;
  for (const json& entry : merges) {
    std::string left, right;
    if (entry.is_string()) {
      const std::string s = entry.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError("BPE model: merge \"" + s + "\" is not \"a b\"");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError("BPE model: malformed merge " + entry.dump());
    }
    auto l = bpe->vocab_.find(left);
    auto r = bpe->vocab_.find(right);
    const std::string merged = left + (right.compare(0, bpe->prefix_.size(), bpe->prefix_) == 0
                                           ? right.substr(bpe->prefix_.size())
                                           : right);
    auto mid = bpe->vocab_.find(merged);
    if (l == bpe->vocab_.end() || r == bpe->vocab_.end() || mid == bpe->vocab_.end()) {
      return absl::InvalidArgumentError("BPE model: merge \"" + left + " " + right +
                                        "\" uses tokens missing from the vocab");
    }
    bpe->merges_.emplace(PairKey(l->second, r->second), Merge{rank++, mid->second});
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::IdToToken(int32_t id) const {
  static const std::string* empty = new std::string;
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) return *empty;
  return id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  TokenizeUncached(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCachedWords) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

void BpeModel::TokenizeUncached(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Initial symbols: one per character, or its bytes with byte fallback, or unk.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> symbols;
  size_t i = 0;
  bool previous_unk = false;
  while (i < word.size()) {
    size_t n = utf8::SequenceLength(word, i);
    if (n == 0) n = 1;
    std::string piece(word.substr(i, n));
    if (i > 0 && !prefix_.empty()) piece = prefix_ + piece;
    if (i + n == word.size() && !suffix_.empty()) piece += suffix_;
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      symbols.push_back({it->second, 0, 0});
      previous_unk = false;
    } else if (byte_fallback_ && have_byte_tokens_) {
      for (size_t k = 0; k < n; ++k) {
        symbols.push_back({byte_ids_[static_cast<uint8_t>(word[i + k])], 0, 0});
      }
      previous_unk = false;
    } else if (unk_id_ >= 0) {
      if (!(fuse_unk_ && previous_unk)) symbols.push_back({unk_id_, 0, 0});
      previous_unk = true;
    }
    i += n;
  }
  const int32_t count = static_cast<int32_t>(symbols.size());
  for (int32_t s = 0; s < count; ++s) {
    symbols[s].prev = s - 1;
    symbols[s].next = s + 1 < count ? s + 1 : -1;
  }
  // Min-heap of candidate merges by (rank, position).
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) {
      heap.push({it->second.rank, pos, symbols[pos].id, symbols[next].id});
    }
  };
  for (int32_t s = 0; s + 1 < count; ++s) consider(s);
  std::vector<bool> dead(count, false);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.pos];
    if (dead[c.pos] || left.next < 0 || left.id != c.left || symbols[left.next].id != c.right) {
      continue;  // stale
    }
    const int32_t right_pos = left.next;
    left.id = merges_.at(PairKey(c.left, c.right)).id;
    dead[right_pos] = true;
    left.next = symbols[right_pos].next;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t s = 0; s >= 0 && s < count; s = symbols[s].next) out.push_back(symbols[s].id);
}

}  // namespace strata
