#include "common/grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace strata::grammar {

namespace {

constexpr size_t kMaxStacks = 4096;    // per state: beyond it the grammar is too ambiguous
constexpr size_t kMaxVisits = 200000;  // stacks visited expanding one state
constexpr size_t kMaxDepth = 20000;    // per stack

// Expands a stack until its top is a byte set (or it is empty), into `out`. `seen` stops
// tail-call loops that consume nothing. Iterative, with a budget of stacks visited per
// call (shared through `seen`): a grammar whose expansion would go on past it (long chains
// of rules that match nothing, ambiguity) gives false, never a deep recursion or a hang.
bool Expand(const Grammar& g, std::vector<int32_t> start, std::set<std::vector<int32_t>>* out,
            std::set<std::vector<int32_t>>* seen) {
  std::vector<std::vector<int32_t>> work;
  work.push_back(std::move(start));
  while (!work.empty()) {
    std::vector<int32_t> stack = std::move(work.back());
    work.pop_back();
    for (;;) {
      if (stack.size() > kMaxDepth || out->size() > kMaxStacks || seen->size() > kMaxVisits) {
        return false;
      }
      if (!seen->insert(stack).second) break;
      if (stack.empty()) {
        out->insert(stack);
        break;
      }
      const int32_t p = stack.back();
      const Element& e = g.elements()[p];
      if (e.kind == Element::Kind::kBytes) {
        out->insert(std::move(stack));
        break;
      }
      stack.pop_back();
      if (e.kind == Element::Kind::kEnd) continue;
      // A rule: its continuation, unless it is the alternative's last element (a tail
      // call), then each alternative.
      if (g.elements()[p + 1].kind != Element::Kind::kEnd) stack.push_back(p + 1);
      const std::vector<int32_t>& alts = g.alternatives(e.value);
      if (alts.empty()) break;
      for (size_t a = 1; a < alts.size(); ++a) {
        std::vector<int32_t> next = stack;
        next.push_back(alts[a]);
        work.push_back(std::move(next));
      }
      stack.push_back(alts[0]);
    }
  }
  return true;
}

}  // namespace

std::vector<CodePointRange> Complement(std::vector<CodePointRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<CodePointRange> out;
  uint32_t next = 0;
  for (auto [lo, hi] : ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}

State State::Start(const Grammar& g) {
  std::set<std::vector<int32_t>> out, seen;
  for (int32_t alt : g.alternatives(g.root())) {
    if (!Expand(g, {alt}, &out, &seen)) return State();
  }
  State s;
  s.stacks_.assign(out.begin(), out.end());
  return s;
}

State State::Advance(const Grammar& g, std::string_view bytes) const {
  State cur = *this;
  for (unsigned char b : bytes) {
    std::set<std::vector<int32_t>> out, seen;
    for (const Stack& stack : cur.stacks_) {
      if (stack.empty()) continue;
      const Element& e = g.elements()[stack.back()];
      if (!g.byte_set(e.value).test(b)) continue;
      Stack next = stack;
      ++next.back();
      if (!Expand(g, std::move(next), &out, &seen)) return State();
    }
    cur.stacks_.assign(out.begin(), out.end());
    if (cur.stacks_.empty()) break;
  }
  return cur;
}

bool State::accepting() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool State::can_continue() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return !s.empty(); });
}

std::string State::Key() const {
  std::string key;
  for (const Stack& s : stacks_) {
    const uint32_t n = static_cast<uint32_t>(s.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof(n));
    key.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(int32_t));
  }
  return key;
}

std::bitset<256> State::NextBytes(const Grammar& g) const {
  std::bitset<256> out;
  for (const Stack& s : stacks_) {
    if (!s.empty()) out |= g.byte_set(g.elements()[s.back()].value);
  }
  return out;
}

Vocabulary::Vocabulary(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  nodes_.emplace_back();
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].empty()) continue;
    int32_t node = 0;
    for (unsigned char b : tokens_[id]) {
      int32_t child = -1;
      for (const auto& [byte, n] : nodes_[node].children) {
        if (byte == b) child = n;
      }
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].ends.push_back(static_cast<int32_t>(id));
  }
}

// The trie walk, with stacks and sets of stacks interned so that each (set, byte)
// transition is computed once per call.
class MaskBuilder {
 public:
  MaskBuilder(const Grammar& g, const Vocabulary& v) : g_(g), v_(v) {}

  std::vector<uint64_t> Run(const State& state, const std::vector<int32_t>& end_tokens) {
    std::vector<uint64_t> mask((v_.size() + 63) / 64, 0);
    std::vector<int32_t> start;
    for (const auto& s : state.stacks_) {
      if (!s.empty()) start.push_back(StackId(s));
    }
    std::sort(start.begin(), start.end());
    if (!start.empty()) Walk(0, SetId(start), &mask);
    if (state.accepting()) {
      for (int32_t t : end_tokens) {
        if (t >= 0 && static_cast<size_t>(t) < v_.size()) mask[t >> 6] |= uint64_t{1} << (t & 63);
      }
    }
    return mask;
  }

 private:
  int32_t StackId(const std::vector<int32_t>& s) {
    auto [it, inserted] = stack_ids_.try_emplace(s, static_cast<int32_t>(stacks_.size()));
    if (inserted) stacks_.push_back(s);
    return it->second;
  }
  int32_t SetId(const std::vector<int32_t>& set) {
    auto [it, inserted] = set_ids_.try_emplace(set, static_cast<int32_t>(sets_.size()));
    if (inserted) sets_.push_back(set);
    return it->second;
  }
  // The set after byte b, or -1 when empty.
  int32_t Step(int32_t set, uint8_t b) {
    const uint64_t key = (static_cast<uint64_t>(set) << 8) | b;
    auto it = transitions_.find(key);
    if (it != transitions_.end()) return it->second;
    std::set<std::vector<int32_t>> out, seen;
    bool ok = true;
    for (int32_t id : sets_[set]) {
      const std::vector<int32_t>& stack = stacks_[id];
      if (!g_.byte_set(g_.elements()[stack.back()].value).test(b)) continue;
      std::vector<int32_t> next = stack;
      ++next.back();
      ok = ok && Expand(g_, std::move(next), &out, &seen);
    }
    int32_t result = -1;
    bool any_open = false;
    std::vector<int32_t> ids;
    for (const auto& s : out) {
      if (s.empty()) {
        any_open = true;  // the grammar could end after b: the token is allowed
        continue;
      }
      ids.push_back(StackId(s));
    }
    if (ok && (!ids.empty() || any_open)) {
      std::sort(ids.begin(), ids.end());
      result = SetId(ids);
    }
    transitions_[key] = result;
    return result;
  }
  void Walk(int32_t node, int32_t set, std::vector<uint64_t>* mask) {
    for (const auto& [b, child] : v_.nodes_[node].children) {
      const int32_t next = Step(set, b);
      if (next < 0) continue;
      for (int32_t t : v_.nodes_[child].ends) (*mask)[t >> 6] |= uint64_t{1} << (t & 63);
      if (!sets_[next].empty()) Walk(child, next, mask);
    }
  }

  const Grammar& g_;
  const Vocabulary& v_;
  std::vector<std::vector<int32_t>> stacks_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> stack_ids_;
  std::vector<std::vector<int32_t>> sets_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> set_ids_;
  absl::flat_hash_map<uint64_t, int32_t> transitions_;
};

std::vector<uint64_t> AllowedTokens(const Grammar& g, const Vocabulary& vocab, const State& state,
                                    const std::vector<int32_t>& end_tokens) {
  return MaskBuilder(g, vocab).Run(state, end_tokens);
}

}  // namespace strata::grammar
