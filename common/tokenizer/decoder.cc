#include "common/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/utf8.h"

namespace strata {
namespace {

using json = nlohmann::json;

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void Decode(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->Decode(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Maps GPT-2's printable code points back to the bytes they stand for.
class ByteLevelDecoder : public Decoder {
 public:
  void Decode(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& t : tokens) joined += t;
    std::string bytes;
    bytes.reserve(joined.size());
    for (char32_t cp : utf8::Decode(joined)) {
      const int b = utf8::UnicodeToByte(cp);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
      } else {
        utf8::Append(cp, bytes);
      }
    }
    tokens.assign(1, std::move(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Decode(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) t = pattern_.ReplaceAll(t, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "<0xE4>" -> the byte 0xE4. Runs of byte tokens become one raw byte string.
class ByteFallbackDecoder : public Decoder {
 public:
  void Decode(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    bool in_bytes = false;
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        byte = HexValue(t[3]) * 16 + HexValue(t[4]);
        if (HexValue(t[3]) < 0 || HexValue(t[4]) < 0) byte = -1;
      }
      if (byte >= 0) {
        bytes.push_back(static_cast<char>(byte));
        in_bytes = true;
        continue;
      }
      if (in_bytes) {
        out.push_back(std::move(bytes));
        bytes.clear();
        in_bytes = false;
      }
      out.push_back(std::move(t));
    }
    if (in_bytes) out.push_back(std::move(bytes));
    tokens.swap(out);
  }

 private:
  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
};

class FuseDecoder : public Decoder {
 public:
  void Decode(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void Decode(std::vector<std::string>& tokens) const override {
    if (content_.empty()) return;
    for (std::string& t : tokens) {
      size_t begin = 0, end = t.size();
      for (int i = 0; i < start_ && t.compare(begin, content_.size(), content_) == 0 &&
                      begin + content_.size() <= end;
           ++i) {
        begin += content_.size();
      }
      for (int i = 0; i < stop_ && end >= begin + content_.size() &&
                      t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

// The replacement character becomes a space, except in the first token, where it is
// dropped (the space the pre-tokenizer prepended), unless prepend_scheme is "never".
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void Decode(std::vector<std::string>& tokens) const override {
    const Pattern pattern = Pattern::Literal(replacement_);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = pattern.ReplaceAll(tokens[i], i == 0 && strip_first_ ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const json& j) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return absl::InvalidArgumentError("decoder: needs a \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const json& part : j.value("decoders", json::array())) {
      ASSIGN_OR_RETURN(auto d, DecoderFromJson(part));
      if (d) parts.push_back(std::move(d));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder);
  if (type == "Replace") {
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(j.value("pattern", json())));
    return std::unique_ptr<Decoder>(
        new ReplaceDecoder(std::move(pattern), j.value("content", std::string())));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder);
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder);
  if (type == "Strip") {
    return std::unique_ptr<Decoder>(new StripDecoder(j.value("content", std::string(" ")),
                                                     j.value("start", 0), j.value("stop", 0)));
  }
  if (type == "Metaspace") {
    bool strip_first = true;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      strip_first = j["prepend_scheme"].get<std::string>() != "never";
    } else if (j.contains("add_prefix_space")) {
      strip_first = j.value("add_prefix_space", true);
    }
    return std::unique_ptr<Decoder>(
        new MetaspaceDecoder(j.value("replacement", std::string("\xE2\x96\x81")), strip_first));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported decoder type \"", type, "\""));
}

}  // namespace strata
