#include "server/api/tool_calls.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grammar/json_schema.h"

namespace strata::api {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string_view TrimLeft(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  return s;
}
std::string_view Trim(std::string_view s) {
  s = TrimLeft(s);
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}
bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// A call object: {"name": "...", "arguments" or "parameters": {...} or a JSON string}.
std::optional<ToolCall> CallFrom(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ToolCall call;
  call.name = j["name"].get<std::string>();
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  if (!j.contains(key) || j[key].is_null()) {
    call.arguments = "{}";
  } else if (j[key].is_string()) {
    call.arguments = j[key].get<std::string>();
  } else {
    call.arguments = j[key].dump();
  }
  return call;
}

// Calls in `text`: a JSON object, or a list of them; empty when it is not that.
std::vector<ToolCall> CallsFromJson(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  std::vector<ToolCall> out;
  if (j.is_array()) {
    for (const json& item : j) {
      auto call = CallFrom(item);
      if (!call) return {};
      out.push_back(*call);
    }
  } else if (auto call = CallFrom(j)) {
    out.push_back(*call);
  }
  return out;
}

// Llama 3's JSON calls: objects joined by ';'.
std::vector<ToolCall> Llama3Calls(std::string_view text) {
  text = Trim(text);
  if (StartsWith(text, kPythonTag)) text = Trim(text.substr(kPythonTag.size()));
  if (text.empty() || text[0] != '{') return {};
  std::vector<ToolCall> whole = CallsFromJson(text);
  if (!whole.empty()) return whole;
  std::vector<ToolCall> out;
  while (!text.empty()) {
    const size_t semi = text.find(';');
    auto calls = CallsFromJson(Trim(text.substr(0, semi)));
    if (calls.size() != 1) return {};
    out.push_back(calls[0]);
    text = semi == std::string_view::npos ? std::string_view() : text.substr(semi + 1);
  }
  return out;
}

// The longest suffix of `text` that begins `marker` (text that may still become it).
size_t HeldBack(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.substr(0, n) == text.substr(text.size() - n)) return n;
  }
  return 0;
}

bool AllSpace(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isspace(c); });
}

}  // namespace

bool ParseToolCallFormat(std::string_view name, ToolCallFormat* out) {
  if (name == "hermes")
    *out = ToolCallFormat::kHermes;
  else if (name == "llama3")
    *out = ToolCallFormat::kLlama3;
  else if (name == "mistral")
    *out = ToolCallFormat::kMistral;
  else
    return false;
  return true;
}

ToolCallFormat ToolCallFormatOfTemplate(std::string_view source) {
  if (source.find("[TOOL_CALLS]") != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find("<|python_tag|>") != std::string_view::npos ||
      source.find("ipython") != std::string_view::npos) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kHermes;
}

ParsedOutput ParseToolCalls(ToolCallFormat format, std::string_view text) {
  ParsedOutput out;
  ToolCallStream stream(format);
  std::vector<ToolCallDelta> deltas;
  out.content = stream.Push(text, &deltas);
  out.content += stream.Finish(&deltas);
  for (const ToolCallDelta& d : deltas) {
    if (d.index >= static_cast<int>(out.calls.size())) out.calls.resize(d.index + 1);
    out.calls[d.index].name += d.name;
    out.calls[d.index].arguments += d.arguments;
  }
  return out;
}

void ToolCallStream::AddWhole(const std::vector<ToolCall>& calls,
                              std::vector<ToolCallDelta>* deltas) {
  for (const ToolCall& c : calls) deltas->push_back({next_index_++, c.name, c.arguments});
}

namespace {

// The head of a hermes call, `{"name": "NAME", "arguments": ` up to the arguments' first
// brace: kYes (with the name and where the arguments begin) when it is there, kNeedMore
// while the text could still become it, kNo when it cannot.
enum class HeadMatch { kNeedMore, kNo, kYes };

HeadMatch MatchHead(std::string_view s, std::string* name, size_t* args_at) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && absl::ascii_isspace(static_cast<unsigned char>(s[i]))) ++i;
  };
  auto lit = [&](std::string_view word) -> HeadMatch {
    for (char c : word) {
      if (i >= s.size()) return HeadMatch::kNeedMore;
      if (s[i] != c) return HeadMatch::kNo;
      ++i;
    }
    return HeadMatch::kYes;
  };
  HeadMatch m;
  ws();
  if ((m = lit("{")) != HeadMatch::kYes) return m;
  ws();
  if ((m = lit("\"name\"")) != HeadMatch::kYes) return m;
  ws();
  if ((m = lit(":")) != HeadMatch::kYes) return m;
  ws();
  if ((m = lit("\"")) != HeadMatch::kYes) return m;
  const size_t name_at = i;
  while (i < s.size() && s[i] != '"') {
    if (s[i] == '\\') return HeadMatch::kNo;  // an escaped name: whole, at the end
    ++i;
  }
  if (i >= s.size()) return HeadMatch::kNeedMore;
  *name = std::string(s.substr(name_at, i - name_at));
  ++i;
  ws();
  if ((m = lit(",")) != HeadMatch::kYes) return m;
  ws();
  if (i < s.size() && s[i] == '"' && s.substr(i, 3) == "\"pa") {
    if ((m = lit("\"parameters\"")) != HeadMatch::kYes) return m;
  } else if ((m = lit("\"arguments\"")) != HeadMatch::kYes) {
    return m;
  }
  ws();
  if ((m = lit(":")) != HeadMatch::kYes) return m;
  ws();
  if (i >= s.size()) return HeadMatch::kNeedMore;
  if (s[i] != '{') return HeadMatch::kNo;
  *args_at = i;
  return HeadMatch::kYes;
}

}  // namespace

void ToolCallStream::StreamCall(std::vector<ToolCallDelta>* deltas) {
  if (head_ == Head::kUnknown) {
    std::string name;
    size_t at = 0;
    switch (MatchHead(std::string_view(pending_).substr(kHermesOpen.size()), &name, &at)) {
      case HeadMatch::kNeedMore:
        return;
      case HeadMatch::kNo:
        head_ = Head::kWhole;
        return;
      case HeadMatch::kYes:
        StartCall(name, kHermesOpen.size() + at, deltas);
        break;
    }
  }
  if (head_ == Head::kStreaming) StreamArgs(deltas);
}

void ToolCallStream::StreamArgs(std::vector<ToolCallDelta>* deltas) {
  if (args_done_) return;
  // Stream the arguments' characters written so far, up to the brace that closes them.
  size_t end = args_at_ + args_sent_;
  for (; end < pending_.size() && !args_done_; ++end) {
    if (Track(pending_[end]) && depth_ == 0) args_done_ = true;
  }
  const size_t from = args_at_ + args_sent_;
  if (end > from) {
    deltas->push_back({next_index_, "", pending_.substr(from, end - from)});
    args_sent_ = end - args_at_;
  }
}

bool ToolCallStream::Track(char c) {
  if (in_string_) {
    if (escaped_) {
      escaped_ = false;
    } else if (c == '\\') {
      escaped_ = true;
    } else if (c == '"') {
      in_string_ = false;
    }
    return false;
  }
  if (c == '"') {
    in_string_ = true;
  } else if (c == '{' || c == '[') {
    ++depth_;
  } else if (c == '}' || c == ']') {
    --depth_;
    return true;
  }
  return false;
}

void ToolCallStream::StartCall(const std::string& name, size_t args_at,
                               std::vector<ToolCallDelta>* deltas) {
  head_ = Head::kStreaming;
  in_tail_ = false;
  args_at_ = args_at;
  args_sent_ = 0;
  depth_ = 0;
  in_string_ = escaped_ = args_done_ = false;
  deltas->push_back({next_index_, name, ""});
}

void ToolCallStream::StreamList(std::vector<ToolCallDelta>* deltas) {
  const std::string_view separators = format_ == ToolCallFormat::kLlama3 ? ";" : "[,]";
  while (!list_whole_) {
    if (head_ == Head::kStreaming) {
      StreamArgs(deltas);
      if (!args_done_) return;
      // The rest of the call object (other keys, such as an id, may follow the arguments),
      // up to the brace that closes it.
      if (!in_tail_) {
        in_tail_ = true;
        tail_at_ = args_at_ + args_sent_;
        depth_ = 1;
        in_string_ = escaped_ = false;
      }
      size_t i = tail_at_;
      for (; i < pending_.size() && depth_ > 0; ++i) Track(pending_[i]);
      tail_at_ = i;
      if (depth_ > 0) return;
      ++next_index_;
      ++streamed_calls_;
      head_ = Head::kUnknown;
      in_tail_ = false;
      cursor_ = i;
      continue;
    }
    size_t i = cursor_;
    for (;;) {
      while (i < pending_.size() && (absl::ascii_isspace(static_cast<unsigned char>(pending_[i])) ||
                                     separators.find(pending_[i]) != std::string_view::npos)) {
        ++i;
      }
      const std::string_view rest = std::string_view(pending_).substr(i);
      if (format_ == ToolCallFormat::kLlama3 && !rest.empty() && rest[0] == '<') {
        if (rest.size() < kPythonTag.size() && StartsWith(kPythonTag, rest)) return;
        if (StartsWith(rest, kPythonTag)) {
          i += kPythonTag.size();
          continue;
        }
      }
      break;
    }
    if (i >= pending_.size()) return;
    std::string name;
    size_t at = 0;
    switch (MatchHead(std::string_view(pending_).substr(i), &name, &at)) {
      case HeadMatch::kNeedMore:
        return;
      case HeadMatch::kNo:
        list_whole_ = true;
        whole_from_ = i;
        return;
      case HeadMatch::kYes:
        StartCall(name, i + at, deltas);
        break;
    }
  }
}

std::string ToolCallStream::Push(std::string_view text, std::vector<ToolCallDelta>* deltas) {
  pending_.append(text);
  std::string content;
  switch (format_) {
    case ToolCallFormat::kHermes:
      for (;;) {
        if (!in_calls_) {
          const size_t open = pending_.find(kHermesOpen);
          if (open == std::string::npos) {
            const size_t keep = HeldBack(pending_, kHermesOpen);
            std::string out = pending_.substr(0, pending_.size() - keep);
            pending_.erase(0, pending_.size() - keep);
            if (!(any_call_ && AllSpace(out))) content += out;
            return content;
          }
          const std::string before = pending_.substr(0, open);
          if (!(any_call_ && AllSpace(before))) content += before;
          pending_.erase(0, open);
          in_calls_ = true;
          head_ = Head::kUnknown;
        }
        StreamCall(deltas);
        const size_t close = pending_.find(kHermesClose);
        if (close == std::string::npos) return content;
        if (head_ == Head::kStreaming) {
          ++next_index_;  // streamed: done
          any_call_ = true;
        } else {
          const std::string inner = pending_.substr(kHermesOpen.size(), close - kHermesOpen.size());
          std::vector<ToolCall> found = CallsFromJson(Trim(inner));
          if (found.size() == 1) {
            AddWhole(found, deltas);
            any_call_ = true;
          } else {
            content += pending_.substr(0, close + kHermesClose.size());  // not a call: text
          }
        }
        pending_.erase(0, close + kHermesClose.size());
        in_calls_ = false;
      }
    case ToolCallFormat::kLlama3: {
      if (!decided_) {
        const std::string_view lead = TrimLeft(pending_);
        if (lead.empty()) return content;
        if (lead.size() < kPythonTag.size() && StartsWith(kPythonTag, lead)) return content;
        decided_ = true;
        in_calls_ = lead[0] == '{' || StartsWith(lead, kPythonTag);
      }
      if (in_calls_) {
        StreamList(deltas);
        return content;
      }
      content.swap(pending_);
      return content;
    }
    case ToolCallFormat::kMistral: {
      if (in_calls_) {
        StreamList(deltas);
        return content;
      }
      const size_t marker = pending_.find(kMistralMarker);
      if (marker == std::string::npos) {
        const size_t keep = HeldBack(pending_, kMistralMarker);
        content = pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return content;
      }
      content = pending_.substr(0, marker);
      pending_.erase(0, marker);
      in_calls_ = true;
      cursor_ = kMistralMarker.size();
      StreamList(deltas);
      return content;
    }
  }
  return content;
}

std::string ToolCallStream::Finish(std::vector<ToolCallDelta>* deltas) {
  if (in_calls_ && format_ != ToolCallFormat::kHermes &&
      (streamed_calls_ > 0 || head_ == Head::kStreaming)) {
    // Calls were streamed: a call cut short stands as streamed, and calls after an unusual
    // one are parsed whole.
    if (head_ == Head::kStreaming) ++next_index_;
    std::string rest = list_whole_ ? pending_.substr(whole_from_) : std::string();
    pending_.clear();
    if (rest.empty()) return "";
    std::vector<ToolCall> found = format_ == ToolCallFormat::kLlama3
                                      ? Llama3Calls(rest)
                                      : CallsFromJson("[" + std::string(Trim(rest)));
    if (found.empty()) return rest;  // not calls: text, so nothing is lost
    AddWhole(found, deltas);
    return "";
  }
  if (in_calls_ && format_ == ToolCallFormat::kHermes && head_ == Head::kStreaming) {
    // A streamed call cut before its closing tag (max_tokens): what was streamed stands.
    pending_.clear();
    ++next_index_;
    return "";
  }
  std::string rest;
  rest.swap(pending_);
  if (!in_calls_) return rest;
  std::vector<ToolCall> found;
  switch (format_) {
    case ToolCallFormat::kHermes:
      // An unclosed call (the output was cut): a call if what is there parses.
      found = CallsFromJson(Trim(std::string_view(rest).substr(kHermesOpen.size())));
      if (found.size() != 1) found.clear();
      break;
    case ToolCallFormat::kLlama3:
      found = Llama3Calls(rest);
      break;
    case ToolCallFormat::kMistral:
      found = CallsFromJson(Trim(std::string_view(rest).substr(kMistralMarker.size())));
      break;
  }
  if (found.empty()) return rest;  // not calls after all: nothing is lost
  AddWhole(found, deltas);
  return "";
}

absl::Status CheckTools(const json& tools) {
  if (!tools.is_array()) return absl::InvalidArgumentError("'tools' must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string where = absl::StrCat("tools[", i, "]");
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
        !t["function"].is_object()) {
      return absl::InvalidArgumentError(where +
                                        " must be {\"type\": \"function\", \"function\": {...}}");
    }
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(where + ".function needs a 'name'");
    }
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null()) {
      return absl::InvalidArgumentError(where +
                                        ".function.parameters must be a JSON Schema object");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ToolCallGrammar(ToolCallFormat format, const json& tools,
                                            const std::optional<std::string>& only, bool parallel) {
  if (absl::Status s = CheckTools(tools); !s.ok()) return s;
  const char* args_key = format == ToolCallFormat::kLlama3 ? "parameters" : "arguments";
  std::vector<std::string> functions;
  std::string rules;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& f = tools[i]["function"];
    const std::string name = f["name"].get<std::string>();
    if (only && name != *only) continue;
    const std::string schema = f.contains("parameters") && f["parameters"].is_object()
                                   ? f["parameters"].dump()
                                   : R"({"type":"object"})";
    std::string start;
    auto body = grammar::JsonSchemaRules(schema, absl::StrCat("f", i, "-"), &start);
    if (!body.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", i, "].function.parameters: ", body.status().message()));
    }
    absl::StrAppend(&rules, *body);
    const std::string head =
        absl::StrCat("{\"name\": ", json(name).dump(), ", \"", args_key, "\": ");
    functions.push_back(absl::StrCat(grammar::Literal(head), " ", start, " \"}\""));
  }
  if (functions.empty()) {
    return absl::InvalidArgumentError(
        only ? absl::StrCat("tool_choice names '", *only, "', which is not in 'tools'")
             : std::string("tool_choice 'required' needs 'tools'"));
  }
  const std::string call = "( " + absl::StrJoin(functions, " | ") + " )";
  std::string root;
  switch (format) {
    case ToolCallFormat::kHermes: {
      const std::string one = absl::StrCat("\"<tool_call>\\n\" ", call, " \"\\n</tool_call>\"");
      root = parallel ? absl::StrCat(one, " ( \"\\n\" ", one, " )*") : one;
      break;
    }
    case ToolCallFormat::kLlama3:
      root = parallel ? absl::StrCat(call, " ( \"; \" ", call, " )*") : call;
      break;
    case ToolCallFormat::kMistral:
      root = parallel ? absl::StrCat("\"[TOOL_CALLS][\" ", call, " ( \", \" ", call, " )* \"]\"")
                      : absl::StrCat("\"[TOOL_CALLS][\" ", call, " \"]\"");
      break;
  }
  return absl::StrCat("root ::= ", root, "\n", rules);
}

}  // namespace strata::api
