// Tool calling: the model's tool calls in the formats of the model families strata loads,
// parsed out of its text (whole, or as it streams), and the grammar that makes a call
// certain when the request requires one.
//
// Formats (picked from the chat template, or --tool_call_parser):
//   hermes   Qwen 2.5 and Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
//            any number, after optional text (strata's default template uses it too);
//   llama3   Llama 3.x JSON: the whole output is {"name": ..., "parameters": {...}} (or
//            "arguments"), optionally after <|python_tag|>, several joined by ';';
//   mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] after optional text.
// A call that does not parse as JSON with a string name stays text: nothing is lost.
#ifndef STRATA_SERVER_API_TOOL_CALLS_H_
#define STRATA_SERVER_API_TOOL_CALLS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::api {

enum class ToolCallFormat { kHermes, kLlama3, kMistral };
bool ParseToolCallFormat(std::string_view name, ToolCallFormat* out);
// The format a chat template writes calls in (hermes when it does not say).
ToolCallFormat ToolCallFormatOfTemplate(std::string_view template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct ParsedOutput {
  std::string content;  // the text outside calls (whitespace between calls dropped)
  std::vector<ToolCall> calls;
};

ParsedOutput ParseToolCalls(ToolCallFormat format, std::string_view text);

// A piece of a call as it streams: the first piece of call `index` names it, later pieces
// add to its arguments (OpenAI's delta.tool_calls, which clients concatenate).
struct ToolCallDelta {
  int index = 0;
  std::string name;       // set on the call's first piece only
  std::string arguments;  // a fragment of the arguments' JSON text
};

// Streams: text in as it comes, content and pieces of calls out. Text that may be the
// start of a call is held back until it is decided, so call markup never reaches the
// content. A call's arguments stream as the model writes them once the call has the usual
// shape ({"name": ..., "arguments" or "parameters": {...}}); a call of another shape comes
// out whole when it is complete (in the llama3 and mistral formats, with every call after
// it).
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}
  // Appends `text`; returns the content that is now certain, and adds pieces of calls.
  std::string Push(std::string_view text, std::vector<ToolCallDelta>* deltas);
  // The output is complete: whatever was held back.
  std::string Finish(std::vector<ToolCallDelta>* deltas);

 private:
  // Hermes, inside a call: starts streaming it when its head is there, streams its
  // arguments as far as they are written.
  void StreamCall(std::vector<ToolCallDelta>* deltas);
  // Llama 3 and Mistral, among the calls: streams each call of the usual shape.
  void StreamList(std::vector<ToolCallDelta>* deltas);
  void StartCall(const std::string& name, size_t args_at, std::vector<ToolCallDelta>* deltas);
  void StreamArgs(std::vector<ToolCallDelta>* deltas);
  // One character of JSON: strings, escapes and nesting depth; true when it closes a level.
  bool Track(char c);
  void AddWhole(const std::vector<ToolCall>& calls, std::vector<ToolCallDelta>* deltas);

  ToolCallFormat format_;
  std::string pending_;    // undecided text
  bool decided_ = false;   // llama3: whether the output is a call (the first non-space)
  bool in_calls_ = false;  // hermes: inside a call; llama3 and mistral: calls to the end
  bool any_call_ = false;
  int next_index_ = 0;
  // The hermes call being streamed.
  enum class Head { kUnknown, kStreaming, kWhole } head_ = Head::kUnknown;
  size_t args_at_ = 0;  // where its arguments begin in pending_
  size_t args_sent_ = 0;
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false, args_done_ = false;
  // Llama 3 and Mistral: where the next call (or separator) begins, calls streamed, and
  // from where the calls come out whole after an unusual one.
  size_t cursor_ = 0;
  bool in_tail_ = false;  // past a streamed call's arguments, before its closing brace
  size_t tail_at_ = 0;
  int streamed_calls_ = 0;
  bool list_whole_ = false;
  size_t whole_from_ = 0;
};

// Validated `tools` of a chat request: each {"type": "function", "function": {"name",
// "description"?, "parameters"?}}. Errors name what is wrong.
absl::Status CheckTools(const nlohmann::ordered_json& tools);

// GBNF for one or more calls in `format` (exactly one when !parallel), to the function
// named `only` or any of `tools`, with arguments following each function's parameters.
absl::StatusOr<std::string> ToolCallGrammar(ToolCallFormat format,
                                            const nlohmann::ordered_json& tools,
                                            const std::optional<std::string>& only, bool parallel);

}  // namespace strata::api

#endif  // STRATA_SERVER_API_TOOL_CALLS_H_
