// Chat templates: turn OpenAI `messages` into the prompt text the model was trained on,
// with the Jinja template from the model's tokenizer_config.json (jinja.h).
//
// A template that does not parse, or uses a construct strata does not support, is an error
// at model load. A model without a template gets kDefaultChatTemplate (documented in
// README.md, "Chat templates"): ChatML turns after the BOS token.
//
// Thread-safety: immutable after creation.
#ifndef STRATA_SERVER_CHAT_CHAT_TEMPLATE_H_
#define STRATA_SERVER_CHAT_CHAT_TEMPLATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/jinja/jinja.h"

namespace strata {

extern const char kDefaultChatTemplate[];

class ChatTemplate {
 public:
  // An empty `source` selects the default template.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(const std::string& source,
                                                              std::string bos_token,
                                                              std::string eos_token);

  // Validates and renders. `messages` is OpenAI's list; a message's content may be a string,
  // a list of {"type": "text", "text": ...} parts (joined with newlines) or null. `tools` may
  // be null; `extra` holds chat_template_kwargs (e.g. enable_thinking). Bad messages and
  // raise_exception() in the template are InvalidArgument with a message for the client.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json& tools,
                                     const nlohmann::ordered_json& extra) const;

  bool is_default() const { return is_default_; }
  // The template's Jinja text (the default's when the model has none).
  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;
  std::unique_ptr<jinja::Template> template_;
  std::string bos_token_, eos_token_;
  std::string source_;
  bool is_default_ = false;
};

}  // namespace strata

#endif  // STRATA_SERVER_CHAT_CHAT_TEMPLATE_H_
