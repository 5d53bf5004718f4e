#include "common/tokenizer/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/utf8.h"

namespace strata {
namespace {

using json = nlohmann::json;

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string Normalize(std::string text) const override {
    for (const auto& p : parts_) text = p->Normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string Normalize(std::string text) const override {
    return pattern_.ReplaceAll(text, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

enum class Form { kNfc, kNfd, kNfkc, kNfkd };

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(Form form) : form_(form) {}
  std::string Normalize(std::string text) const override {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = nullptr;
    switch (form_) {
      case Form::kNfc:
        n = icu::Normalizer2::getNFCInstance(status);
        break;
      case Form::kNfd:
        n = icu::Normalizer2::getNFDInstance(status);
        break;
      case Form::kNfkc:
        n = icu::Normalizer2::getNFKCInstance(status);
        break;
      case Form::kNfkd:
        n = icu::Normalizer2::getNFKDInstance(status);
        break;
    }
    if (U_FAILURE(status)) return text;
    const icu::UnicodeString in =
        icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
    if (n->isNormalized(in, status) && U_SUCCESS(status)) return text;
    status = U_ZERO_ERROR;
    const icu::UnicodeString out = n->normalize(in, status);
    if (U_FAILURE(status)) return text;
    std::string result;
    out.toUTF8String(result);
    return result;
  }

 private:
  Form form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  std::string Normalize(std::string text) const override {
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
    u.toLower();
    std::string out;
    u.toUTF8String(out);
    return out;
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(std::string text) const override {
    const std::vector<char32_t> cps = utf8::Decode(text);
    size_t begin = 0, end = cps.size();
    if (left_) {
      while (begin < end && u_isUWhiteSpace(cps[begin])) ++begin;
    }
    if (right_) {
      while (end > begin && u_isUWhiteSpace(cps[end - 1])) --end;
    }
    std::string out;
    for (size_t i = begin; i < end; ++i) utf8::Append(cps[i], out);
    return out;
  }

 private:
  bool left_, right_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return absl::InvalidArgumentError("normalizer: needs a \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const json& part : j.value("normalizers", json::array())) {
      ASSIGN_OR_RETURN(auto n, NormalizerFromJson(part));
      if (n) parts.push_back(std::move(n));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (type == "Prepend") {
    return std::unique_ptr<Normalizer>(new PrependNormalizer(j.value("prepend", std::string())));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(j.value("pattern", json())));
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(std::move(pattern), j.value("content", std::string())));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(Form::kNfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(Form::kNfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(Form::kNfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(Form::kNfkd));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer);
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(
        new StripNormalizer(j.value("strip_left", true), j.value("strip_right", true)));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported normalizer type \"", type, "\""));
}

}  // namespace strata
