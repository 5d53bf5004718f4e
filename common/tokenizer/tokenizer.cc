#include "common/tokenizer/tokenizer.h"

#include <unicode/uchar.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/file.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/utf8.h"

namespace strata {
namespace {

using json = nlohmann::json;

// A special token in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::string TokenContent(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}

char32_t CodePointBefore(std::string_view text, size_t pos) {
  if (pos == 0) return 0;
  size_t start = pos - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return utf8::Decode(text.substr(start, pos - start)).back();
}

char32_t CodePointAt(std::string_view text, size_t pos) {
  if (pos >= text.size()) return 0;
  size_t n = utf8::SequenceLength(text, pos);
  return utf8::Decode(text.substr(pos, n == 0 ? 1 : n))[0];
}

}  // namespace

// One post-processing step: the template's items in order, each either the encoded
// sequence itself (is_sequence) or literal special-token ids.
struct Tokenizer::PostStep {
  std::vector<std::pair<bool, std::vector<int32_t>>> items;  // (is_sequence, ids)
};

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string tokenizer_json, ReadFileToString(dir + "/tokenizer.json"));
  std::string config_json;
  if (std::filesystem::exists(dir + "/tokenizer_config.json")) {
    ASSIGN_OR_RETURN(config_json, ReadFileToString(dir + "/tokenizer_config.json"));
  }
  auto tokenizer = FromJson(tokenizer_json, config_json);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(dir, "/tokenizer.json: ", tokenizer.status().message()));
  }
  // Newer checkpoints keep the chat template in its own file.
  if ((*tokenizer)->chat_template_.empty() &&
      std::filesystem::exists(dir + "/chat_template.jinja")) {
    ASSIGN_OR_RETURN((*tokenizer)->chat_template_, ReadFileToString(dir + "/chat_template.jinja"));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json) {
  const json j = json::parse(tokenizer_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not valid JSON");
  auto t = std::unique_ptr<Tokenizer>(new Tokenizer);
  ASSIGN_OR_RETURN(t->normalizer_, NormalizerFromJson(j.value("normalizer", json())));
  ASSIGN_OR_RETURN(t->pre_tokenizer_, PreTokenizerFromJson(j.value("pre_tokenizer", json())));
  ASSIGN_OR_RETURN(t->model_, BpeModel::FromJson(j.value("model", json())));
  ASSIGN_OR_RETURN(t->decoder_, DecoderFromJson(j.value("decoder", json())));
  t->vocab_size_ = t->model_->size();

  for (const json& a : j.value("added_tokens", json::array())) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string()) {
      return absl::InvalidArgumentError("malformed added token " + a.dump());
    }
    AddedToken token;
    token.id = a["id"].get<int32_t>();
    token.content = a["content"].get<std::string>();
    token.special = a.value("special", false);
    token.single_word = a.value("single_word", false);
    token.lstrip = a.value("lstrip", false);
    token.rstrip = a.value("rstrip", false);
    if (token.content.empty() || token.id < 0) continue;
    t->vocab_size_ = std::max(t->vocab_size_, token.id + 1);
    t->added_by_id_[token.id] = t->added_.size();
    t->added_.push_back(std::move(token));
  }
  t->added_by_first_byte_.resize(256);
  for (size_t i = 0; i < t->added_.size(); ++i) {
    t->added_by_first_byte_[static_cast<uint8_t>(t->added_[i].content[0])].push_back(i);
  }

  // Post-processor.
  std::function<absl::Status(const json&)> add_post = [&](const json& p) -> absl::Status {
    if (p.is_null()) return absl::OkStatus();
    const std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      for (const json& part : p.value("processors", json::array())) RETURN_IF_ERROR(add_post(part));
      return absl::OkStatus();
    }
    if (type == "ByteLevel") return absl::OkStatus();  // offsets only
    PostStep step;
    if (type == "TemplateProcessing") {
      const json specials = p.value("special_tokens", json::object());
      for (const json& item : p.value("single", json::array())) {
        if (item.contains("Sequence")) {
          step.items.push_back({true, {}});
        } else if (item.contains("SpecialToken")) {
          const std::string name = item["SpecialToken"].value("id", std::string());
          if (!specials.contains(name)) {
            return absl::InvalidArgumentError("TemplateProcessing: unknown special \"" + name +
                                              "\"");
          }
          step.items.push_back({false, specials[name].value("ids", std::vector<int32_t>())});
        } else {
          return absl::InvalidArgumentError("TemplateProcessing: bad item " + item.dump());
        }
      }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      const json cls = p.value("cls", json::array());
      const json sep = p.value("sep", json::array());
      if (cls.size() != 2 || sep.size() != 2) {
        return absl::InvalidArgumentError(type + ": needs cls and sep");
      }
      step.items = {{false, {cls[1].get<int32_t>()}}, {true, {}}, {false, {sep[1].get<int32_t>()}}};
    } else {
      return absl::InvalidArgumentError("unsupported post_processor type \"" + type + "\"");
    }
    t->post_steps_.push_back(std::move(step));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(add_post(j.value("post_processor", json())));

  if (!config_json.empty()) {
    const json c = json::parse(config_json, nullptr, false);
    if (c.is_discarded() || !c.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json is not valid JSON");
    }
    t->bos_token_ = TokenContent(c.value("bos_token", json()));
    t->eos_token_ = TokenContent(c.value("eos_token", json()));
    if (auto id = t->TokenToId(t->bos_token_)) t->bos_id_ = *id;
    if (auto id = t->TokenToId(t->eos_token_)) t->eos_id_ = *id;
    t->clean_up_tokenization_spaces_ = c.value("clean_up_tokenization_spaces", false);
    const json tmpl = c.value("chat_template", json());
    if (tmpl.is_string()) {
      t->chat_template_ = tmpl.get<std::string>();
    } else if (tmpl.is_array()) {
      for (const json& named : tmpl) {
        if (named.value("name", std::string()) == "default") {
          t->chat_template_ = named.value("template", std::string());
        }
      }
    }
  }
  return t;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (token.empty()) return std::nullopt;
  for (const AddedToken& a : added_) {
    if (a.content == token) return a.id;
  }
  return model_->TokenToId(token);
}

std::string Tokenizer::TokenText(int32_t id) const {
  // Decode after an anchor token and keep what the token added; the anchor is a plain
  // letter in every supported vocabulary ("a" in byte-level BPE, "▁a" in SentencePiece).
  for (const char* anchor_piece : {"a",
                                   "\xe2\x96\x81"
                                   "a",
                                   "\xc4\xa0"
                                   "a"}) {
    const std::optional<int32_t> anchor = model_->TokenToId(anchor_piece);
    if (!anchor) continue;
    const int32_t pair[2] = {*anchor, id};
    const std::string alone = DecodeBytes(std::span<const int32_t>(pair, 1), false);
    const std::string both = DecodeBytes(std::span<const int32_t>(pair, 2), false);
    if (!alone.empty() && both.compare(0, alone.size(), alone) == 0) {
      return both.substr(alone.size());
    }
  }
  const int32_t one[1] = {id};
  return DecodeBytes(std::span<const int32_t>(one, 1), false);
}

std::string Tokenizer::IdToToken(int32_t id) const {
  auto it = added_by_id_.find(id);
  if (it != added_by_id_.end()) return added_[it->second].content;
  return model_->IdToToken(id);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

void Tokenizer::EncodeText(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized(text);
  if (normalizer_) normalized = normalizer_->Normalize(std::move(normalized));
  std::vector<Piece> pieces = {{std::move(normalized), at_start}};
  if (pre_tokenizer_) pre_tokenizer_->PreTokenize(pieces);
  for (const Piece& p : pieces) model_->Tokenize(p.text, out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view raw_text, bool add_special_tokens,
                                       bool parse_special) const {
  const std::string text = utf8::Sanitize(raw_text);
  std::vector<int32_t> ids;
  // Find added tokens: leftmost, then longest.
  size_t segment_start = 0;  // start of the pending plain text
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* best = nullptr;
    for (size_t index : added_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      const AddedToken& a = added_[index];
      if (a.special && !parse_special) continue;
      if (text.compare(pos, a.content.size(), a.content) != 0) continue;
      if (a.single_word && (u_isalnum(CodePointBefore(text, pos)) ||
                            u_isalnum(CodePointAt(text, pos + a.content.size())))) {
        continue;
      }
      if (best == nullptr || a.content.size() > best->content.size()) best = &a;
    }
    if (best == nullptr) {
      ++pos;
      continue;
    }
    size_t text_end = pos;
    if (best->lstrip) {
      while (text_end > segment_start && u_isUWhiteSpace(CodePointBefore(text, text_end))) {
        do {
          --text_end;
        } while (text_end > segment_start && (static_cast<uint8_t>(text[text_end]) & 0xC0) == 0x80);
      }
    }
    EncodeText(std::string_view(text).substr(segment_start, text_end - segment_start),
               segment_start == 0, ids);
    ids.push_back(best->id);
    pos += best->content.size();
    if (best->rstrip) {
      while (pos < text.size() && u_isUWhiteSpace(CodePointAt(text, pos))) {
        const size_t n = utf8::SequenceLength(text, pos);
        pos += n == 0 ? 1 : n;
      }
    }
    segment_start = pos;
  }
  EncodeText(std::string_view(text).substr(segment_start), segment_start == 0, ids);
  if (add_special_tokens) PostProcess(ids);
  return ids;
}

void Tokenizer::PostProcess(std::vector<int32_t>& ids) const {
  for (const PostStep& step : post_steps_) {
    std::vector<int32_t> out;
    for (const auto& [is_sequence, literal] : step.items) {
      if (is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), literal.begin(), literal.end());
      }
    }
    ids.swap(out);
  }
}

std::string Tokenizer::DecodeBytes(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = added_by_id_.find(id);
    if (it != added_by_id_.end()) {
      if (skip_special_tokens && added_[it->second].special) continue;
      tokens.push_back(added_[it->second].content);
      continue;
    }
    const std::string& token = model_->IdToToken(id);
    if (!token.empty()) tokens.push_back(token);
  }
  if (decoder_) decoder_->Decode(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens,
                              bool clean_up) const {
  std::string text = utf8::Sanitize(DecodeBytes(ids, skip_special_tokens));
  if (clean_up && clean_up_tokenization_spaces_) text = CleanUpTokenizationSpaces(std::move(text));
  return text;
}

std::string CleanUpTokenizationSpaces(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) text = Pattern::Literal(from).ReplaceAll(text, to);
  return text;
}

}  // namespace strata
