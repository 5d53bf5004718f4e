#include "common/tokenizer/incremental_detokenizer.h"

#include "common/tokenizer/utf8.h"

namespace strata {
namespace {

// Context tokens kept before the first generated one.
constexpr size_t kContextTokens = 5;

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer,
                                               const std::vector<int32_t>& context,
                                               bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {
  const size_t keep = std::min(context.size(), kContextTokens);
  ids_.assign(context.end() - keep, context.end());
  prefix_offset_ = 0;
  read_offset_ = ids_.size();
}

// Bytes the tokens after read_offset_ add to the window's decode.
std::string IncrementalDetokenizer::NewBytes() const {
  const std::span<const int32_t> all(ids_);
  const std::string prefix = tokenizer_->DecodeBytes(
      all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string full = tokenizer_->DecodeBytes(all.subspan(prefix_offset_), skip_special_);
  if (full.size() <= prefix.size()) return "";
  return full.substr(prefix.size());
}

std::string IncrementalDetokenizer::Push(int32_t token) {
  ids_.push_back(token);
  const std::string fresh = NewBytes();
  const size_t ready = utf8::EmittablePrefix(fresh);
  std::string delta;
  if (ready > emitted_) {
    delta = utf8::Sanitize(std::string_view(fresh).substr(emitted_, ready - emitted_));
    emitted_ = ready;
  }
  if (ready == fresh.size()) {
    // Everything up to here is out: slide the window.
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    emitted_ = 0;
  }
  text_ += delta;
  return delta;
}

std::string IncrementalDetokenizer::Flush() {
  const std::string fresh = NewBytes();
  std::string delta;
  if (fresh.size() > emitted_) delta = utf8::Sanitize(std::string_view(fresh).substr(emitted_));
  prefix_offset_ = read_offset_ = ids_.size();
  emitted_ = 0;
  text_ += delta;
  return delta;
}

}  // namespace strata
