#include "common/tokenizer/pre_tokenizer.h"

#include <unicode/uchar.h>

#include <functional>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/utf8.h"

namespace strata {

const char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

using json = nlohmann::json;
using Ranges = std::vector<std::pair<size_t, size_t>>;

// Replaces every piece by the sub-pieces `split` cuts it into.
void SplitEach(std::vector<Piece>& pieces, const std::function<Ranges(const std::string&)>& split) {
  std::vector<Piece> out;
  for (Piece& piece : pieces) {
    for (const auto& [begin, end] : split(piece.text)) {
      out.push_back({piece.text.substr(begin, end - begin), piece.at_start && begin == 0});
    }
  }
  pieces.swap(out);
}

// Byte ranges of the code points of `text` for which `pred` holds.
Ranges CodePointMatches(const std::string& text, const std::function<bool(char32_t)>& pred) {
  Ranges out;
  size_t i = 0;
  while (i < text.size()) {
    size_t n = utf8::SequenceLength(text, i);
    if (n == 0) n = 1;
    const char32_t cp = utf8::Decode(std::string_view(text).substr(i, n))[0];
    if (pred(cp)) out.emplace_back(i, i + n);
    i += n;
  }
  return out;
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<Piece>& pieces) const override {
    SplitEach(pieces, [&](const std::string& text) {
      return SplitRanges(text.size(), pattern_.FindAll(text), behavior_, invert_);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}
  void PreTokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& p : pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
      }
    }
    if (split_ != nullptr) {
      SplitEach(pieces, [&](const std::string& text) {
        return SplitRanges(text.size(), split_->FindAll(text), SplitBehavior::kIsolated, false);
      });
    }
    for (Piece& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (unsigned char b : p.text) utf8::Append(utf8::ByteToUnicode(b), mapped);
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> split_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void PreTokenize(std::vector<Piece>& pieces) const override {
    const Pattern space = Pattern::Literal(" ");
    for (Piece& p : pieces) {
      p.text = space.ReplaceAll(p.text, replacement_);
      const bool prepend =
          scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start);
      if (prepend && p.text.compare(0, replacement_.size(), replacement_) != 0) {
        p.text.insert(0, replacement_);
      }
    }
    if (split_) {
      const Pattern delimiter = Pattern::Literal(replacement_);
      SplitEach(pieces, [&](const std::string& text) {
        return SplitRanges(text.size(), delimiter.FindAll(text), SplitBehavior::kMergedWithNext,
                           false);
      });
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class PredicatePreTokenizer : public PreTokenizer {
 public:
  PredicatePreTokenizer(std::function<bool(char32_t)> pred, SplitBehavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void PreTokenize(std::vector<Piece>& pieces) const override {
    SplitEach(pieces, [&](const std::string& text) {
      return SplitRanges(text.size(), CodePointMatches(text, pred_), behavior_, false);
    });
  }

 private:
  std::function<bool(char32_t)> pred_;
  SplitBehavior behavior_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const json& j) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return absl::InvalidArgumentError("pre_tokenizer: needs a \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const json& part : j.value("pretokenizers", json::array())) {
      ASSIGN_OR_RETURN(auto p, PreTokenizerFromJson(part));
      if (p) parts.push_back(std::move(p));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(j.value("pattern", json())));
    ASSIGN_OR_RETURN(SplitBehavior behavior, ParseSplitBehavior(j.value("behavior", json())));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(pattern), behavior, j.value("invert", false)));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<Pattern> split;
    if (j.value("use_regex", true)) {
      ASSIGN_OR_RETURN(Pattern p, Pattern::FromRegex(kGpt2SplitPattern));
      split = std::make_unique<Pattern>(std::move(p));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(j.value("add_prefix_space", true), std::move(split)));
  }
  if (type == "Metaspace") {
    PrependScheme scheme = PrependScheme::kAlways;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      const std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "first") {
        scheme = PrependScheme::kFirst;
      } else if (s == "never") {
        scheme = PrependScheme::kNever;
      } else if (s != "always") {
        return absl::InvalidArgumentError("Metaspace: unknown prepend_scheme \"" + s + "\"");
      }
    } else if (j.contains("add_prefix_space") && !j.value("add_prefix_space", true)) {
      scheme = PrependScheme::kNever;
    }
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(
        j.value("replacement", std::string("\xE2\x96\x81")), scheme, j.value("split", true)));
  }
  if (type == "Digits") {
    return std::unique_ptr<PreTokenizer>(new PredicatePreTokenizer(
        [](char32_t c) { return u_isdigit(c) != 0; }, j.value("individual_digits", false)
                                                          ? SplitBehavior::kIsolated
                                                          : SplitBehavior::kContiguous));
  }
  if (type == "Punctuation") {
    SplitBehavior behavior = SplitBehavior::kIsolated;
    if (j.contains("behavior")) {
      ASSIGN_OR_RETURN(behavior, ParseSplitBehavior(j["behavior"]));
    }
    return std::unique_ptr<PreTokenizer>(
        new PredicatePreTokenizer([](char32_t c) { return u_ispunct(c) != 0; }, behavior));
  }
  if (type == "WhitespaceSplit") {
    return std::unique_ptr<PreTokenizer>(new PredicatePreTokenizer(
        [](char32_t c) { return u_isUWhiteSpace(c) != 0; }, SplitBehavior::kRemoved));
  }
  if (type == "Whitespace") {
    ASSIGN_OR_RETURN(Pattern p, Pattern::FromRegex(R"(\w+|[^\w\s]+)"));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(p), SplitBehavior::kRemoved, /*invert=*/true));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported pre_tokenizer type \"", type, "\""));
}

}  // namespace strata
