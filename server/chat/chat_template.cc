#include "server/chat/chat_template.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace strata {

// ChatML turns after the BOS token. With tools, a system turn lists them as JSON and says
// how to call one (the hermes format of server/api/tool_calls.h); an assistant turn's calls
// are written back in that format, and a tool's answer goes in a user turn.
const char kDefaultChatTemplate[] =
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ 'Functions you can call, one JSON signature per line:\\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ 'To call one, answer with <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call>'"
    " + ' for each call.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' + message['content'] }}"
    "{% for call in message['tool_calls'] %}"
    "{{ '<tool_call>{\"name\": ' + (call['function']['name'] | tojson) + ', \"arguments\": '"
    " + (call['function']['arguments'] | tojson) + '}</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>' + message['content'] + "
    "'</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

using json = nlohmann::ordered_json;

const char* kRoles[] = {"system", "user", "assistant", "tool", "developer"};

absl::StatusOr<json> NormalizeMessages(const json& messages) {
  if (!messages.is_array() || messages.empty()) {
    return absl::InvalidArgumentError("'messages' must be a non-empty list");
  }
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return absl::InvalidArgumentError(where + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError(where + " needs a string 'role'");
    }
    const std::string role = m["role"].get<std::string>();
    if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles)) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has unknown role '", role, "'"));
    }
    json message = m;
    const json content = m.contains("content") ? m["content"] : json();
    if (content.is_array()) {
      std::string text;
      for (const json& part : content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return absl::InvalidArgumentError(where + ": only text content parts are supported");
        }
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      message["content"] = text;
    } else if (content.is_null()) {
      if (role != "assistant" || !m.contains("tool_calls")) {
        return absl::InvalidArgumentError(where + " needs 'content'");
      }
      message["content"] = "";
    } else if (!content.is_string()) {
      return absl::InvalidArgumentError(where + ": 'content' must be a string or a list of parts");
    }
    // OpenAI sends a call's arguments as JSON text; templates write them as an object.
    if (message.contains("tool_calls")) {
      if (!message["tool_calls"].is_array()) {
        return absl::InvalidArgumentError(where + ": 'tool_calls' must be a list");
      }
      for (json& call : message["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string()) {
          return absl::InvalidArgumentError(where + ": each tool call needs function.name");
        }
        json& args = call["function"]["arguments"];
        if (args.is_string()) {
          json parsed = json::parse(args.get<std::string>(), nullptr, false);
          if (!parsed.is_discarded()) args = parsed;
        } else if (args.is_null()) {
          args = json::object();
        }
      }
    }
    out.push_back(std::move(message));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(const std::string& source,
                                                                   std::string bos_token,
                                                                   std::string eos_token) {
  auto t = std::unique_ptr<ChatTemplate>(new ChatTemplate);
  t->is_default_ = source.empty();
  t->source_ = t->is_default_ ? kDefaultChatTemplate : source;
  auto parsed = jinja::Template::Parse(t->is_default_ ? kDefaultChatTemplate : source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported chat template: ", parsed.status().message()));
  }
  t->template_ = std::move(*parsed);
  t->bos_token_ = std::move(bos_token);
  t->eos_token_ = std::move(eos_token);
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const json& messages, bool add_generation_prompt,
                                                 const json& tools, const json& extra) const {
  ASSIGN_OR_RETURN(json normalized, NormalizeMessages(messages));
  jinja::ValueDict context;
  context.Set("messages", jinja::Value::FromJson(normalized));
  context.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  context.Set("bos_token", jinja::Value::String(bos_token_));
  context.Set("eos_token", jinja::Value::String(eos_token_));
  if (!tools.is_null()) context.Set("tools", jinja::Value::FromJson(tools));
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      context.Set(it.key(), jinja::Value::FromJson(it.value()));
    }
  }
  return template_->Render(context);
}

}  // namespace strata
