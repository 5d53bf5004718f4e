#include "common/tokenizer/pattern.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace strata {

absl::StatusOr<Pattern> Pattern::FromJson(const nlohmann::json& j) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    return Literal(j["String"].get<std::string>());
  }
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    return FromRegex(j["Regex"].get<std::string>());
  }
  if (j.is_string()) return Literal(j.get<std::string>());
  return absl::InvalidArgumentError(
      absl::StrCat("pattern must be {\"String\": ...} or {\"Regex\": ...}, got ", j.dump()));
}

absl::StatusOr<Pattern> Pattern::FromRegex(std::string_view regex) {
  Pattern p;
  ASSIGN_OR_RETURN(std::unique_ptr<Regex> compiled, Regex::Compile(regex));
  p.regex_ = std::move(compiled);
  return p;
}

Pattern Pattern::Literal(std::string literal) {
  Pattern p;
  p.literal_ = std::move(literal);
  return p;
}

std::vector<std::pair<size_t, size_t>> Pattern::FindAll(std::string_view text) const {
  if (regex_ != nullptr) return regex_->FindAll(text);
  std::vector<std::pair<size_t, size_t>> out;
  if (literal_.empty()) return out;
  size_t pos = 0;
  while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + literal_.size());
    pos += literal_.size();
  }
  return out;
}

std::string Pattern::ReplaceAll(std::string_view text, std::string_view content) const {
  std::string out;
  size_t last = 0;
  for (const auto& [begin, end] : FindAll(text)) {
    out.append(text.substr(last, begin - last));
    out.append(content);
    last = end;
  }
  out.append(text.substr(last));
  return out;
}

absl::StatusOr<SplitBehavior> ParseSplitBehavior(const nlohmann::json& j) {
  const std::string name = j.is_string() ? j.get<std::string>() : "";
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError("unknown split behavior " + j.dump());
}

std::vector<std::pair<size_t, size_t>> SplitRanges(
    size_t text_size, const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
    bool invert) {
  struct Part {
    size_t begin, end;
    bool is_delimiter;
  };
  // The whole text as alternating gaps and matches.
  std::vector<Part> parts;
  size_t last = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > last) parts.push_back({last, begin, invert});
    parts.push_back({begin, end, !invert});
    last = end;
  }
  if (last < text_size) parts.push_back({last, text_size, invert});

  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_delimiter) out.emplace_back(p.begin, p.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) out.emplace_back(p.begin, p.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      // A delimiter joins the piece before it, unless that piece is itself a delimiter.
      bool previous_delimiter = false;
      for (const Part& p : parts) {
        if (p.is_delimiter && !previous_delimiter && !out.empty()) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_delimiter = p.is_delimiter;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Mirror image: walk backwards, a delimiter joins the piece after it.
      bool next_delimiter = false;
      std::vector<std::pair<size_t, size_t>> reversed;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_delimiter && !next_delimiter && !reversed.empty()) {
          reversed.back().first = it->begin;
        } else {
          reversed.emplace_back(it->begin, it->end);
        }
        next_delimiter = it->is_delimiter;
      }
      out.assign(reversed.rbegin(), reversed.rend());
      break;
    }
    case SplitBehavior::kContiguous: {
      // Runs of parts of the same kind merge.
      bool have_previous = false;
      bool previous_delimiter = false;
      for (const Part& p : parts) {
        if (have_previous && p.is_delimiter == previous_delimiter) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        have_previous = true;
        previous_delimiter = p.is_delimiter;
      }
      break;
    }
  }
  return out;
}

}  // namespace strata
